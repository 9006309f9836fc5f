"""`make bench`: PILOT measured against its baselines in one run (see bench/run.py)."""
