"""The recorder's flush span: one CONSUMER span per flush, linked to the deliveries it writes.

Messaging semantic conventions for a batch: the flush is a ``process`` operation on the queue,
a new root (a batch has no single parent), with a LINK to the trace context of each delivery in
it (the ``traceparent``/``tracestate`` headers the relay's producer span put there). At most
:data:`bulk_recorder.infra.tracing.MAX_LINKS` (128) links: a flush of more distinct contexts
keeps the first ones, in delivery order, and says how many it left out in its ``links_dropped``
attribute (namespace ``bulk_recorder``) beside ``messaging.batch.message_count``. A delivery
without headers, or with malformed ones or ones of another AMQP type, adds no link, no error.

Only a sampled flush span reads the headers: at a ratio of 0.01 the other 99 flushes cost one
sampling decision. The flush's counts are set when it ends: rows inserted and ignored (already
recorded), deliveries committed and refused by the database, write attempts and the reason the
batch was cut. Its children are the statements
(:func:`bulk_recorder.infra.tracing.watch_queries`), the settle, a bisection, a dead-letter
publish and a release.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bulk_recorder.infra import tracing


@dataclass(slots=True)
class FlushCounts:
    """What one flush did, for its span."""

    committed: int = 0
    refused: int = 0
    released: int = 0
    inserted: int = 0
    ignored: int = 0
    attempts: int = 0


@contextmanager
def flush_span(
    queue: str, reason: str, size: int, carriers: Iterable[Mapping[str, Any] | None]
) -> Iterator[FlushCounts]:
    """The flush's span, current inside the block; the caller fills the counts it yields."""
    import opentelemetry.trace as trace  # here: only a traced flush loads it

    counts = FlushCounts()
    span = tracing.tracer().start_span(
        f"process {queue}",
        context=trace.set_span_in_context(trace.INVALID_SPAN),  # a root: links, no parent
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "flush",
            "messaging.destination.name": queue,
            "messaging.batch.message_count": size,
            "bulk_recorder.flush.reason": reason,
        },
    )
    if span.is_recording():
        links, dropped = tracing.capped_links(iter(carriers))
        for context in links:
            span.add_link(context)
        span.set_attribute("bulk_recorder.links", len(links))
        span.set_attribute("bulk_recorder.links_dropped", dropped)
    with trace.use_span(span, end_on_exit=True):
        try:
            yield counts
        finally:
            if span.is_recording():
                span.set_attributes(
                    {
                        "bulk_recorder.flush.committed": counts.committed,
                        "bulk_recorder.flush.refused": counts.refused,
                        "bulk_recorder.flush.released": counts.released,
                        "bulk_recorder.flush.inserted": counts.inserted,
                        "bulk_recorder.flush.ignored": counts.ignored,
                        "bulk_recorder.flush.attempts": counts.attempts,
                    }
                )
