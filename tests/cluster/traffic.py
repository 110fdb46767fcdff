"""Traffic for the cluster runs: API clients that retry as a client should, and a publisher
straight to the queue that survives the loss of its broker node.

- :class:`Client` posts transactions one after another; each is retried with its own
  ``Idempotency-Key`` until it is accepted (a 503 waits its ``Retry-After``; a lost answer is
  sent again). With ``replay_every=N`` every N-th accepted request is sent once more with the
  same key, and must be answered 202 again as a replay, never as a second row.
- :class:`JobClient` uploads NDJSON jobs of credit annotations the same way.
- :class:`QueueTraffic` publishes chunks of the load generator's mixed traffic (valid,
  duplicate and invalid messages) with confirms. A chunk whose publish failed (its node was
  killed) is published again in full, under new ids (the generator's UUIDv7s come from the
  clock): the failed attempt's valid ids are kept in :attr:`QueueTraffic.unconfirmed` (the
  broker may have taken them: they may be recorded, and need not be), and its invalid ones may
  reach the DLQ twice, which :attr:`QueueTraffic.invalid_republished` bounds.

Every id whose request was answered 202 and every valid id whose publish was confirmed is
collected: the audit expects exactly those in PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadReport, LoadSpec, publish_load
from tests.cluster.failover_support import merge

# A request that may have been committed although the client saw no answer, or a race the API
# itself asks to retry: sent again with the same key.
_RETRY_409 = "a concurrent request for this transaction failed; retry"


@dataclass
class _Poster:
    """Sends one request until it is accepted; counts what it met on the way."""

    unavailable: list[float] = field(default_factory=list)  # 503s with Retry-After
    lost_answers: int = 0  # transport errors and timeouts: sent again with the same key
    retries: int = 0  # every repeat of a request, for whatever reason
    other: list[str] = field(default_factory=list)  # answers no client should see

    async def until_accepted(
        self, http: httpx.AsyncClient, path: str, body: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        attempts = 0
        while True:
            attempts += 1
            self.retries += attempts > 1
            try:
                answer = await http.post(path, content=body, headers=headers)
            except httpx.TransportError as exc:
                self.lost_answers += 1
                if attempts % 20 == 0:
                    self.other.append(f"still no answer after {attempts} tries: {exc!r}")
                await asyncio.sleep(0.2)
                continue
            if answer.status_code == 202:
                return answer
            if answer.status_code == 503 and "retry-after" in answer.headers:
                self.unavailable.append(time.monotonic())
                await asyncio.sleep(min(float(answer.headers["retry-after"]), 2.0))
                continue
            if answer.status_code == 409 and _RETRY_409 in answer.text:
                await asyncio.sleep(0.1)
                continue
            self.other.append(f"{answer.status_code} {answer.text[:200]}")
            await asyncio.sleep(0.2)


@dataclass
class Client(_Poster):
    """Posts transactions one after another until stopped; retries each until it is accepted."""

    base_url: str = ""
    gen: Generator = field(default_factory=Generator.create)
    auth: dict[str, str] = field(default_factory=dict)  # the API key's header
    replay_every: int = 0  # 0: no deliberate replays
    accepted: dict[str, float] = field(default_factory=dict)  # id -> when
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> the transaction
    replays: int = 0  # deliberate repeats answered as replays

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=15, headers=self.auth) as http:
            while not stop.is_set():
                await self._one(http, self.gen.transaction())

    async def _one(self, http: httpx.AsyncClient, tx: dict[str, Any]) -> None:
        body, key = json.dumps(tx).encode(), str(uuid.uuid4())
        headers = {"content-type": "application/json", "Idempotency-Key": key}
        answer = await self.until_accepted(http, "/v1/transactions", body, headers)
        tx_id = str(tx["id"])
        self.accepted[tx_id] = time.monotonic()
        self.bodies[tx_id] = tx
        if answer.json().get("id") != tx_id:
            self.other.append(f"202 for {tx_id} named {answer.text[:200]}")
        if self.replay_every and len(self.accepted) % self.replay_every == 0:
            again = await self.until_accepted(http, "/v1/transactions", body, headers)
            if again.headers.get("idempotent-replayed") != "true" or again.json()["id"] != tx_id:
                self.other.append(f"a repeat with the same key was not a replay: {again.text}")
            self.replays += 1


@dataclass
class JobClient(_Poster):
    """Uploads NDJSON credit-annotation jobs until stopped, each retried until it is accepted."""

    base_url: str = ""
    gen: Generator = field(default_factory=Generator.create)
    auth: dict[str, str] = field(default_factory=dict)
    lines: int = 100  # annotations a job
    pause: float = 0.5  # between two jobs
    jobs: list[str] = field(default_factory=list)  # job ids answered 202
    annotations: set[str] = field(default_factory=set)  # ids of the accepted jobs' lines

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30, headers=self.auth) as http:
            while not stop.is_set():
                records = [self.gen.credit_annotation() for _ in range(self.lines)]
                body = "".join(json.dumps(r) + "\n" for r in records).encode()
                headers = {
                    "content-type": "application/x-ndjson",
                    "Idempotency-Key": str(uuid.uuid4()),
                }
                answer = await self.until_accepted(
                    http, "/v1/credit-annotation-jobs", body, headers
                )
                job = answer.json()
                if job["accepted"] != len(records):
                    self.other.append(f"job accepted {job['accepted']} of {len(records)}")
                self.jobs.append(str(job["id"]))
                self.annotations.update(str(r["id"]) for r in records)
                await asyncio.sleep(self.pause)


@dataclass
class QueueTraffic:
    """Chunks of mixed messages straight to the exchange, each published until confirmed."""

    url: str  # every node, comma-separated: a failed chunk moves on to another node
    exchange: str
    seed: int
    chunk: int = 200  # valid records a chunk
    pause: float = 0.3  # between two chunks
    reports: list[LoadReport] = field(default_factory=list)
    failed_attempts: list[str] = field(default_factory=list)
    invalid_republished: int = 0  # invalid messages of chunks published again (DLQ surplus bound)
    # valid ids of attempts that failed: maybe recorded, never promised (tests/faults/audit.py)
    unconfirmed: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    async def run(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            spec = LoadSpec(
                "mixed", self.chunk, duplicates=0.05, invalid=0.02, seed=self.seed * 100_000 + n
            )
            self.reports.append(await self._until_confirmed(spec))
            n += 1
            await asyncio.sleep(self.pause)

    async def _until_confirmed(self, spec: LoadSpec) -> LoadReport:
        while True:
            attempt = LoadReport()
            try:
                return await asyncio.wait_for(
                    publish_load(self.url, self.exchange, spec, report=attempt), 60
                )
            except (Exception, TimeoutError) as exc:  # a node killed under the publisher
                self.failed_attempts.append(repr(exc)[:200])
                self.invalid_republished += spec.invalid_count
                for record_type, ids in attempt.ids.items():
                    self.unconfirmed[record_type] |= ids
                await asyncio.sleep(0.5)

    def merged(self) -> tuple[LoadReport, Counter[str]]:
        """One report for every chunk, and the DLQ reason shapes they must leave together."""
        return merge(*self.reports)
