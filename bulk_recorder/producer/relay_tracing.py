"""The relay's PRODUCER spans: one per outbox row it publishes, only when tracing is on.

Each span is the child of the trace context stored with the row (the API request that wrote it,
``outbox.traceparent``/``tracestate``), or a new root when the row has none. It starts before
the batch is written and ends with the row's outcome (confirmed, or why not), and its context
goes into the message's ``traceparent``/``tracestate`` headers, which the recorder's flush span
links to. Messaging semantic conventions: ``messaging.system`` rabbitmq, operation ``send``
(``publish``), the exchange as the destination, the record type as the routing key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import asyncpg
from pamqp.common import FieldValue

from bulk_recorder.infra import tracing

if TYPE_CHECKING:  # imported by the spans themselves: only a traced relay makes them
    from opentelemetry.trace import Span


class PublishSpans:
    """The spans of one batch's rows, by outbox id."""

    def __init__(self, exchange: str, rows: Sequence[asyncpg.Record]) -> None:
        from opentelemetry.trace import SpanKind

        tracer = tracing.tracer()
        self._spans: dict[int, Span] = {}
        self._headers: dict[int, dict[str, FieldValue]] = {}
        for row in rows:
            span = tracer.start_span(
                f"publish {exchange}",
                context=tracing.context_of(row["traceparent"], row["tracestate"]),
                kind=SpanKind.PRODUCER,
                attributes={
                    "messaging.system": "rabbitmq",
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "publish",
                    "messaging.destination.name": exchange,
                    "messaging.rabbitmq.destination.routing_key": row["record_type"],
                    "bulk_recorder.outbox.id": row["id"],
                },
            )
            self._spans[row["id"]] = span
            self._headers[row["id"]] = dict(tracing.carrier_of(span))

    def headers(self, row_id: int) -> Headers:
        """The ``traceparent`` (and ``tracestate``) to publish row ``row_id`` with."""
        return self._headers.get(row_id) or None

    def end(self, outcomes: Mapping[int, BaseException | None]) -> None:
        """End every span: ok when confirmed, an error naming why not otherwise."""
        from opentelemetry.trace import Status, StatusCode

        for row_id, span in self._spans.items():
            outcome = outcomes.get(row_id)
            if row_id in outcomes and outcome is not None:
                span.set_attribute("error.type", type(outcome).__name__)
                span.set_status(Status(StatusCode.ERROR, str(outcome)[:200]))
            span.end()


class NoSpans:
    """Tracing off: no span, no header."""

    def headers(self, row_id: int) -> None:
        return None

    def end(self, outcomes: Mapping[int, BaseException | None]) -> None:
        return None


NO_SPANS = NoSpans()

Spans = PublishSpans | NoSpans
# a message's trace context headers (None: tracing is off), as pamqp's field table
Headers = dict[str, FieldValue] | None
