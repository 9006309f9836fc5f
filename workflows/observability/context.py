"""Context that log records pick up without every call passing it along."""

from contextvars import ContextVar

# The trace id of the request (or task) being handled, "" outside one.
trace_id_var: ContextVar[str] = ContextVar("pilot_trace_id", default="")
