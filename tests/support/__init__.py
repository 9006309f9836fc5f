"""What the tests share: real processes (procs), a private PostgreSQL cluster
(pgcluster), broker and database helpers (helpers)."""
