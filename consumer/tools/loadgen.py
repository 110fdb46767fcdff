"""Load generator: the records of :mod:`consumer.tools.generator`, with duplicates and invalid
messages, published with confirms. Publishing keeps a window of unconfirmed messages in flight:
awaiting each confirm in turn caps a publisher at ~1,200 msg/s on this machine, a window of 1,000
reaches the broker's limit.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiormq

from bulk_recorder.infra.aiormq_internals import write_publishes
from bulk_recorder.infra.broker import BrokerNodes
from consumer.tools.generator import RECORD_TYPES, Generator, dump


@dataclass(slots=True)
class LoadSpec:
    record_type: str  # "transaction" | "credit_annotation" | "mixed"
    count: int
    duplicates: float = 0.0
    invalid: float = 0.0
    in_flight: int = 1000
    seed: int | None = None
    traced: bool = False  # each message carries a traceparent header of its own (benchmarks)

    @property
    def duplicate_count(self) -> int:
        return int(self.count * self.duplicates)

    @property
    def invalid_count(self) -> int:
        return int(self.count * self.invalid)

    @property
    def total_messages(self) -> int:
        return self.count + self.duplicate_count + self.invalid_count


@dataclass(slots=True)
class OutMessage:
    body: bytes
    type: str | None
    kind: str  # valid | duplicate | invalid
    record_id: str | None = None


@dataclass(slots=True)
class LoadReport:
    published: int = 0
    valid: int = 0
    duplicates: int = 0
    invalid: int = 0
    elapsed_s: float = 0.0
    ids: dict[str, set[str]] = field(default_factory=lambda: {t: set() for t in RECORD_TYPES})

    @property
    def rate(self) -> float:
        return self.published / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"published {self.published} messages ({self.valid} valid, {self.duplicates} "
            f"duplicates, {self.invalid} invalid) in {self.elapsed_s:.1f} s, "
            f"{self.rate:,.0f} msg/s, every one confirmed by the broker"
        )


def plan(spec: LoadSpec, gen: Generator) -> Iterator[OutMessage]:
    """Valid records in order, with duplicates and invalid messages spread among them."""
    rng = gen.rng
    extras = ["duplicate"] * spec.duplicate_count + ["invalid"] * spec.invalid_count
    slots = sorted(rng.randrange(spec.count + 1) for _ in extras)
    rng.shuffle(extras)
    sent: list[OutMessage] = []
    extra_i = 0
    invalid_n = 0
    for i in range(spec.count + 1):
        while extra_i < len(extras) and slots[extra_i] == i:
            if extras[extra_i] == "duplicate" and sent:
                original = rng.choice(sent)
                yield OutMessage(original.body, original.type, "duplicate", original.record_id)
            else:
                body, type_, _ = gen.invalid(invalid_n)
                invalid_n += 1
                yield OutMessage(body, type_, "invalid")
            extra_i += 1
        if i == spec.count:
            break
        record_type = RECORD_TYPES[i % 2] if spec.record_type == "mixed" else spec.record_type
        record = gen.record(record_type)
        msg = OutMessage(dump(record), record_type, "valid", record["id"])
        if len(sent) < 10_000:
            sent.append(msg)
        elif rng.random() < 0.01:
            sent[rng.randrange(len(sent))] = msg
        yield msg


def _tally(report: LoadReport, msg: OutMessage) -> None:
    """Count one published message in the report, by kind."""
    report.published += 1
    if msg.kind == "valid":
        report.valid += 1
        if msg.record_id is not None and msg.type is not None:
            report.ids[msg.type].add(msg.record_id)
    elif msg.kind == "duplicate":
        report.duplicates += 1
    else:
        report.invalid += 1


PUBLISH_BATCH = 100  # messages a write: a tenth of the default window in flight


def _properties(msg: OutMessage, traced: bool = False) -> aiormq.spec.Basic.Properties:
    headers: dict[str, aiormq.abc.FieldValue] | None = None
    if traced:  # a sampled context, as a relay's producer span would have put there
        headers = {"traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"}
    return aiormq.spec.Basic.Properties(
        content_type="application/json",
        message_type=msg.type,
        message_id=msg.record_id,
        delivery_mode=2,
        headers=headers,
    )


class _Confirms:
    """The publisher's window: batches awaiting their confirms, the failures they met."""

    def __init__(self, in_flight: int, progress: Callable[[int], None] | None) -> None:
        self.slots = asyncio.Semaphore(max(1, in_flight // PUBLISH_BATCH))
        self.failures: list[BaseException] = []
        self.pending: set[asyncio.Future[list[Any]]] = set()
        self._progress = progress

    def watch(self, futures: list[asyncio.Future[aiormq.abc.ConfirmationFrameType]]) -> None:
        batch = asyncio.gather(*futures, return_exceptions=True)
        self.pending.add(batch)
        batch.add_done_callback(self._settled)

    def _settled(self, batch: asyncio.Future[list[Any]]) -> None:
        self.pending.discard(batch)
        self.slots.release()
        if batch.cancelled():  # the load itself was cancelled: nothing to count
            return
        results = batch.result()  # gather(return_exceptions=True): one outcome a publish
        for result in results:
            if not isinstance(result, aiormq.spec.Basic.Ack):  # a nack, a closed channel
                self.failures.append(
                    result
                    if isinstance(result, BaseException)
                    else RuntimeError(f"the broker did not confirm: {result!r}")
                )
        if self._progress is not None:
            self._progress(len(results))


async def publish_load(
    url: str,
    exchange_name: str,
    spec: LoadSpec,
    *,
    progress: Callable[[int], None] | None = None,
    declare: Callable[[Any], Awaitable[None]] | None = None,
    generator: Generator | None = None,
    report: LoadReport | None = None,
) -> LoadReport:
    """Publish the planned messages with confirms, ``spec.in_flight`` unconfirmed at most, in
    batches of PUBLISH_BATCH a write (infra.aiormq_internals.write_publishes: the per-message
    publish was the demo's bottleneck). Raises if the broker did not confirm every message.

    ``report`` (default: a new one) is filled as messages are sent, so that a caller whose
    publish raised still knows which ids it may have published (UUIDv7s: another attempt with
    the same seed makes other ids)."""
    report = report if report is not None else LoadReport()
    gen = generator or Generator.create(spec.seed)
    connection = await BrokerNodes.from_setting(url).connect()
    try:
        channel = await connection.channel(publisher_confirms=True)
        if declare is not None:
            await declare(channel)
        await channel.get_exchange(exchange_name)  # it must exist: fail here, not per message
        raw = await channel.get_underlay_channel()
        confirms = _Confirms(spec.in_flight, progress)
        started = time.perf_counter()
        batch: list[tuple[str, str, aiormq.spec.Basic.Properties, bytes]] = []
        for msg in plan(spec, gen):
            properties = _properties(msg, spec.traced)
            batch.append((exchange_name, msg.type or "untyped", properties, msg.body))
            _tally(report, msg)
            if len(batch) == PUBLISH_BATCH:
                await confirms.slots.acquire()
                if confirms.failures:
                    break
                confirms.watch(await write_publishes(raw, batch))
                batch = []
        if batch and not confirms.failures:
            await confirms.slots.acquire()
            confirms.watch(await write_publishes(raw, batch))
        if confirms.pending:
            await asyncio.wait(confirms.pending)
        report.elapsed_s = time.perf_counter() - started
        if confirms.failures:
            failures = confirms.failures
            raise RuntimeError(f"{len(failures)} publishes failed: {failures[0]!r}")
    finally:
        await connection.close()
    return report


class ProgressBar:
    """A dependency-free progress bar on stderr (redrawn at most 10 times a second)."""

    def __init__(self, label: str, total: int, stream: Any = None) -> None:
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self._stream = stream or sys.stderr
        self._started = time.perf_counter()
        self._last = 0.0
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)()) or bool(
            os.environ.get("FORCE_PROGRESS")
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self._last >= (0.1 if self._tty else 2.0) or self.done >= self.total:
            self._last = now
            self._draw(now)

    def set(self, value: int) -> None:
        self.update(value - self.done)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        elapsed = now - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        bar = "#" * int(frac * 30)
        line = (
            f"{self.label:>10} [{bar:<30}] {self.done:>9,}/{self.total:,} "
            f"{frac:6.1%} {rate:9,.0f}/s {elapsed:6.1f}s"
        )
        self._stream.write(("\r" + line) if self._tty else (line + "\n"))
        self._stream.flush()

    def close(self) -> None:
        self._draw(time.perf_counter())
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()
