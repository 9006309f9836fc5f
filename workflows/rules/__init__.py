"""PILOT's pure rules (docs/design.md, "Layers and doors"): the task and step
states, the errors with their stable codes, the idempotency key rule, the
request fingerprint, the retry backoff, durations, cron slots and the JSON
payload fields. No database, no broker, no clock of their own — every other
layer may import them; they import nothing of PILOT's above them."""
