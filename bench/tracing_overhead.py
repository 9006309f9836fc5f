"""What trace context costs the runner per step (docs/tracing.md).

    python bench/tracing_overhead.py        (make bench-tracing)

Times, in-process, the span call the runner makes around every step body —
`tracing.span("pilot.step", parent=…, **attributes)` entered and left — in
three setups, each against a baseline measured in the same run: a bare
`contextlib.nullcontext()` (what the code did before tracing existed, plus
nothing). Setups: OpenTelemetry absent (its import fails), present without a
configured SDK (the API's default provider), and recording with the SDK
(an in-memory exporter; only when opentelemetry-sdk is installed). Prints the
median of 7 rounds of 100 000 calls each, in nanoseconds per step.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROUNDS, CALLS = 7, 100_000
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def per_call_ns(body) -> float:
    results = []
    for _ in range(ROUNDS):
        started = time.perf_counter_ns()
        for _ in range(CALLS):
            body()
        results.append((time.perf_counter_ns() - started) / CALLS)
    return statistics.median(results)


def baseline() -> None:
    with contextlib.nullcontext():
        pass


def main() -> None:
    from workflows.observability import tracing

    def step() -> None:
        with tracing.span("pilot.step", parent=PARENT, task_id="t", workflow="w", step="s",
                          index=0, attempt=1):
            pass

    rows = []
    base = per_call_ns(baseline)
    saved = {name: mod for name, mod in sys.modules.items()
             if name == "opentelemetry" or name.startswith("opentelemetry.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["opentelemetry"] = None  # as if not installed
    tracing.tracing_refresh()
    rows.append(("OpenTelemetry not installed", per_call_ns(step)))
    del sys.modules["opentelemetry"]
    sys.modules.update(saved)
    tracing.tracing_refresh()
    try:
        import opentelemetry  # noqa: F401
    except ImportError:
        pass
    else:
        rows.append(("installed, no SDK configured", per_call_ns(step)))
        try:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
        except ImportError:
            pass
        else:
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracing._checked, tracing._tracer = True, provider.get_tracer("pilot")

            def recorded() -> None:
                step()
                exporter.clear()

            rows.append(("SDK recording (in-memory exporter)", per_call_ns(recorded)))
            tracing.tracing_refresh()
    print(f"baseline (nullcontext): {base:.0f} ns per step")
    print(f"{'setup':38} {'ns/step':>9} {'vs baseline':>12}")
    for name, ns in rows:
        print(f"{name:38} {ns:9.0f} {ns / base:11.1f}x")


if __name__ == "__main__":
    main()
