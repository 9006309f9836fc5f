"""The baselines that live inside the project, installed only by the benchmark's
settings (bench/settings.py, bench/urls.py): a bare DRF endpoint that inserts one row (the
ceiling for the trigger endpoint) and the raw django-q2 task that writes three
rows (the baseline for a 3-step PILOT run)."""
