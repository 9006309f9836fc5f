"""The workloads. Each is a script the orchestrator (bench/run.py) runs as its
own process with the environment it needs (bench/common.py: pilot_env) and
that prints one BENCH-RESULT JSON line."""
