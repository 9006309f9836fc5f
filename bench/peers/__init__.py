"""The peers users would pick instead of PILOT, run from bench/.venv (pinned in
bench/requirements.txt, never a runtime dependency of PILOT)."""
