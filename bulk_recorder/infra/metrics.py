"""Every Prometheus metric of the service in one container (prefix ``bulk_recorder_``), and
the one way to expose them (:func:`exposition`).

Tests pass a fresh :class:`CollectorRegistry` so that runs never share counters. Each registry
also holds the standard process, platform and GC collectors (``process_*``, ``python_info``,
``python_gc_*``) and ``bulk_recorder_build_info``.
"""

from __future__ import annotations

import gzip
import platform

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder

import bulk_recorder
from bulk_recorder.build import revision
from bulk_recorder.infra.held import Held
from bulk_recorder.infra.histograms import SettleHistogram

TABLES = ("transactions", "operations", "credit_annotations", "balances")
FLUSH_REASONS = ("size", "timeout", "shutdown")
# Why the API refused a request: no key, not a well-formed key, no such key, a revoked key, or a
# key without the scope the endpoint needs (the only 403).
AUTH_FAILURE_REASONS = ("missing", "malformed", "unknown", "revoked", "scope")
# messages_dead_lettered_total{reason}: consumer.delivery.dead_letter_class's three, and a row
# PostgreSQL refused on its last allowed delivery. Exported at 0 from the start, so that rate()
# sees the first dead letter (a series born at 1 shows no increase).
DEAD_LETTER_REASONS = ("decode", "type", "validation", "database")
# outbox_publish_failures_total{reason}: the relay's four ways a publish goes unconfirmed.
PUBLISH_FAILURE_REASONS = ("refused", "nacked", "unroutable", "lost")
# Bodies smaller than this are sent as they are: gzip would cost more than it saves.
_GZIP_MIN_BYTES = 1024

_SIZE_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2000, 5000, 10000)
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Waits inside the API process (the event loop's lag, a pooled connection): from 0.1 ms.
_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# How long a delivery was held, receipt to settle: coarse below a second (the flush duration
# histogram has the detail), then up to and past RabbitMQ's default consumer timeout (1,800 s),
# whose two thirds the alert uses. Few buckets: five outcomes each, and every scrape writes them.
HOLD_BUCKETS = (
    0.05,
    0.25,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
)
HOLD_OUTCOMES = ("acked", "rejected", "dead_lettered", "released", "dropped")
# The delivery attempt (x-delivery-count + 1): one bucket per attempt up to 8, then coarser.
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 15, 20, 50, 100)
ATTEMPT_OUTCOMES = ("recorded", "dead_lettered")


class Metrics:
    """The contract metrics of docs/reference.md, plus a few that operators ask for."""

    def __init__(self, registry: CollectorRegistry | None = None, *, role: str = "") -> None:
        # No ``*_created`` series: they double the counters' series and no query of the
        # dashboard or the alerts reads them. prometheus_client has one switch for the whole
        # process, read at each collect; every role wants it off, so the container turns it off
        # (not an import: importing this module changes nothing).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        p = "bulk_recorder_"
        self._standard_metrics(r, p, role)
        self._delivery_metrics(r, p)
        self._settle_metrics(r, p)
        self._write_metrics(r, p)
        self._queue_metrics(r, p)
        self._producer_metrics(r, p)
        self._api_metrics(r, p)
        for table in TABLES:
            for counter in (self.rows_attempted, self.rows_inserted, self.rows_ignored):
                counter.labels(table=table)
        for reason in FLUSH_REASONS:
            self.flushes.labels(reason=reason)
        for reason in DEAD_LETTER_REASONS:
            self.messages_dead_lettered.labels(reason=reason)
        for reason in PUBLISH_FAILURE_REASONS:
            self.outbox_publish_failures.labels(reason=reason)

    def _standard_metrics(self, r: CollectorRegistry, p: str, role: str) -> None:
        """RSS, CPU, open fds, the Python version and GC of this process, and what is running."""
        ProcessCollector(registry=r)  # process_*: RSS, CPU seconds, open fds, start time
        PlatformCollector(registry=r)  # python_info{version, implementation}
        GCCollector(registry=r)  # python_gc_*: collections, collected and uncollectable objects
        self.build_info = Gauge(
            p + "build_info",
            "Always 1: the version and source revision of bulk-recorder, the Python and the "
            "role of this process.",
            ["version", "revision", "python", "role"],
            registry=r,
        )
        self.build_info.labels(
            version=bulk_recorder.__version__,
            revision=revision(),
            python=platform.python_version(),
            role=role,
        ).set(1)

    def _delivery_metrics(self, r: CollectorRegistry, p: str) -> None:
        """The recorder's deliveries: received, acked, rejected, released, dropped, DLQ."""
        self.messages_received = Counter(
            p + "messages_received", "Deliveries received from the broker.", registry=r
        )
        self.messages_acked = Counter(
            p + "messages_acked", "Deliveries acked (after their rows were committed).", registry=r
        )
        self.messages_rejected = Counter(
            p + "messages_rejected",
            "Deliveries rejected with requeue after PostgreSQL refused their row.",
            registry=r,
        )
        self.messages_released = Counter(
            p + "messages_released",
            "Deliveries released during a long database outage, a shutdown, or while the DLQ "
            "refused them: a copy republished to the queue, then an ack (a nack with requeue "
            "only if the broker refused the copy too).",
            registry=r,
        )
        self.messages_dropped = Counter(
            p + "messages_dropped",
            "Deliveries of a dead channel dropped un-acked; the broker redelivers them.",
            registry=r,
        )
        self.messages_dead_lettered = Counter(
            p + "messages_dead_lettered",
            "Messages sent to the dead-letter queue, by reason class.",
            ["reason"],
            registry=r,
        )

    def _settle_metrics(self, r: CollectorRegistry, p: str) -> None:
        """What ``bulk-recorder tune`` measures: how long deliveries were held, at which
        attempt they were recorded or dead-lettered, and the settings they are held against."""
        self.delivery_hold = SettleHistogram(
            p + "delivery_hold_seconds",
            "Time a delivery was held, from its receipt to its settle, by outcome: acked "
            "(committed), rejected (refused row, requeued), dead_lettered, released, dropped "
            "(its channel was gone when it was settled, e.g. closed by the consumer timeout).",
            "outcome",
            HOLD_OUTCOMES,
            HOLD_BUCKETS,
            r,
        )
        self.delivery_attempt = SettleHistogram(
            p + "delivery_attempt",
            "The delivery attempt (x-delivery-count + 1) at which a record was recorded "
            "(committed, then acked) or its message dead-lettered by the recorder.",
            "outcome",
            ATTEMPT_OUTCOMES,
            ATTEMPT_BUCKETS,
            r,
        )
        self.delivery_limit = Gauge(
            p + "delivery_limit",
            "Recorder: RABBITMQ_DELIVERY_LIMIT in force (the queue's x-delivery-limit).",
            registry=r,
        )
        self.release_after = Gauge(
            p + "release_after_seconds",
            "Recorder: BULK_RECORDER_RELEASE_AFTER_S in force.",
            registry=r,
        )
        self.held = Held()  # the recorder adds each delivery at receipt; a settle removes it
        self.oldest_held = Gauge(
            p + "oldest_held_seconds",
            "Recorder: how long the oldest delivery held now (received, not yet settled) has "
            "been held; 0 when none is.",
            registry=r,
        )
        self.oldest_held.set_function(self.held.oldest_age)

    def _write_metrics(self, r: CollectorRegistry, p: str) -> None:
        """The recorder's writes: rows, flushes, fallbacks, retries, buffer, pause, reconnects."""
        self.rows_attempted = Counter(
            p + "rows_attempted", "Rows offered to INSERT.", ["table"], registry=r
        )
        self.rows_inserted = Counter(
            p + "rows_inserted", "Rows newly inserted.", ["table"], registry=r
        )
        self.rows_ignored = Counter(
            p + "rows_ignored",
            "Rows skipped as duplicates (ON CONFLICT DO NOTHING or repeated in one flush).",
            ["table"],
            registry=r,
        )
        self.flushes = Counter(p + "flushes", "Flushes by trigger.", ["reason"], registry=r)
        self.flush_size = Histogram(
            p + "flush_size", "Messages per flush.", buckets=_SIZE_BUCKETS, registry=r
        )
        self.flush_duration = Histogram(
            p + "flush_duration_seconds",
            "Time from the start of a flush's DB transaction to its acks.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.fallback = Counter(
            p + "fallback", "Batches split to isolate rows that PostgreSQL refused.", registry=r
        )
        self.buffer_messages = Gauge(
            p + "buffer_messages", "Deliveries buffered and not yet acked.", registry=r
        )
        self.db_retries = Counter(
            p + "db_retries", "Flush attempts retried after a transient database error.", registry=r
        )
        self.paused = Gauge(p + "paused", "1 while the database is unreachable.", registry=r)
        self.broker_reconnects = Counter(
            p + "broker_reconnects", "Connections to the broker re-established.", registry=r
        )

    def _queue_metrics(self, r: CollectorRegistry, p: str) -> None:
        """What the recorder sees of its queue: "nothing is consuming" (messages wait, nothing
        is delivered) versus "nothing is arriving" (the queue is empty, the outbox is not)."""
        self.last_delivery = Gauge(
            p + "last_delivery_timestamp_seconds",
            "Unix time when the recorder last saw a delivery arrive (checked every few seconds); "
            "its start time before the first.",
            registry=r,
        )
        self.queue_messages = Gauge(
            p + "queue_messages",
            "Messages ready in the recorder's queue (from a passive declare, every few seconds).",
            registry=r,
        )
        self.queue_consumers = Gauge(
            p + "queue_consumers",
            "Consumers attached to the recorder's queue, from every recorder (passive declare).",
            registry=r,
        )
        # per shard queue (RABBITMQ_QUEUE_SHARDS): new names, so that the two above keep their
        # label set (every alert and the KEDA trigger read them as one series a recorder)
        self.shard_messages = Gauge(
            p + "shard_messages",
            "Messages ready in each queue shard the recorder consumes (passive declare).",
            ["queue"],
            registry=r,
        )
        self.shard_consumers = Gauge(
            p + "shard_consumers",
            "Consumers attached to each queue shard the recorder consumes, every recorder's.",
            ["queue"],
            registry=r,
        )
        self.dlq_messages = Gauge(
            p + "dlq_messages",
            "Messages waiting in the dead-letter queue (<queue>.dlq), dead-lettered by the "
            "recorder or by the broker past x-delivery-limit (passive declare, every few s).",
            registry=r,
        )

    def _producer_metrics(self, r: CollectorRegistry, p: str) -> None:
        """Producer side: the outbox relay."""
        self.outbox_backlog = Gauge(
            p + "outbox_backlog",
            "Outbox rows waiting to be published (parked excluded).",
            registry=r,
        )
        self.outbox_oldest_age = Gauge(
            p + "outbox_oldest_age_seconds",
            "Age of the oldest outbox row waiting to be published; 0 when there is none.",
            registry=r,
        )
        self.outbox_published = Counter(
            p + "outbox_published",
            "Outbox rows published with a broker confirm and then deleted.",
            registry=r,
        )
        self.outbox_publish_failures = Counter(
            p + "outbox_publish_failures",
            "Publishes without a confirm (refused by the broker, nacked by it, returned as "
            "unroutable, or lost with the connection or to a timeout); "
            "their rows stay in the outbox.",
            ["reason"],
            registry=r,
        )
        self.outbox_parked = Counter(
            p + "outbox_parked",
            "Outbox rows parked after the broker refused them too often (not retried).",
            registry=r,
        )
        self.outbox_last_publish = Gauge(
            p + "outbox_last_publish_timestamp_seconds",
            "Unix time of the relay's last confirmed publish; its start time before the first.",
            registry=r,
        )

    def _api_metrics(self, r: CollectorRegistry, p: str) -> None:
        """Producer side: the ingest API."""
        self.api_requests = Counter(
            p + "api_requests", "API requests by route and status.", ["route", "status"], registry=r
        )
        self.api_request_duration = Histogram(
            p + "api_request_duration_seconds",
            "API request duration, until the response is sent.",
            ["route"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.api_loop_lag = Histogram(
            p + "api_event_loop_lag_seconds",
            "How late the API's event loop ran a timer (sampled every 50 ms): how long a "
            "request that is ready waits for the loop.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.api_db_acquire = Histogram(
            p + "api_db_acquire_seconds",
            "How long an API request waited for a pooled database connection.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.api_job_lines = Counter(
            p + "api_job_lines",
            "Credit-annotation job lines by outcome (accepted or rejected).",
            ["outcome"],
            registry=r,
        )
        self.api_auth_failures = Counter(
            p + "api_auth_failures",
            "API requests refused by authentication (401) or scope (403), by reason.",
            ["reason"],
            registry=r,
        )
        for reason in AUTH_FAILURE_REASONS:
            self.api_auth_failures.labels(reason=reason)


def exposition(
    registry: CollectorRegistry, accept: str = "", accept_encoding: str = ""
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a scrape, as prometheus_client's own server would answer it:
    OpenMetrics when the scraper asks for it (Accept), the text format otherwise, gzip when it
    accepts that (Accept-Encoding) and the body is worth it.

    Both servers call this: the recorder's and the relay's small asyncio server (which also
    answers /healthz and /readyz on the same port, in the event loop) and the API's route.
    prometheus_client's ``start_http_server`` would be a second port and a thread of its own,
    and its ``make_asgi_app`` runs collection outside the API's route (which first reads the
    outbox's figures); its encoder choice and gzip are what matter, and they are used here.
    """
    encoder, content_type = choose_encoder(accept)
    body: bytes = encoder(registry)
    headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
    wants_gzip = "gzip" in [part.split(";")[0].strip() for part in accept_encoding.split(",")]
    if wants_gzip and len(body) >= _GZIP_MIN_BYTES:
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return body, headers
