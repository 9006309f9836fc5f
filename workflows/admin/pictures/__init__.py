"""The console's pictures, drawn on the server as SVG (no script, no CDN):
`svg` (the writer and the state colours), `chart` (activity per hour, on the
dashboard), `timeline` (a task's run, on the task page), `diagram` (the state
machine, on the workflows page)."""
