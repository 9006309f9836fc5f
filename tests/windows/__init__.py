"""The windows where a promise could break (docs/guarantees.md): one file per
promise, each opening its window deterministically — a crash at a named fault
point, a token change under a worker, a lost reply to COMMIT, a skewed process
clock, a signal inside `task_run`, a compensation held open, a deploy between a
trigger and its task's end. Tests of one engine module live in tests/engine/
(docs/testing.md, "Where tests live")."""
