"""The growth benchmark's messages: the load generator's records, with v4 or v7 ids and the
prefill's universe of a million accounts (``growth_sql``), published with confirms."""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass
from typing import Any

from benchmarks.support.env import rabbitmq_url
from benchmarks.support.growth_sql import ACCOUNTS, LEDGERS
from benchmarks.support.services import wait_visible
from bulk_recorder.infra.ids import uuid7
from consumer.tools.generator import Generator, valid_document
from consumer.tools.loadgen import LoadReport, LoadSpec, publish_load
from consumer.topology import Topology


def md5_uuid(text: str) -> str:
    """The same value as PostgreSQL's ``md5(text)::uuid``."""
    return str(uuid.UUID(hashlib.md5(text.encode()).hexdigest()))


@dataclass(slots=True)
class GrowthGenerator(Generator):
    """Records as the load generator makes them, but ids v4 or v7 as asked, two accounts of a
    million (those of the prefill), one of the prefill's ledgers, a random CPF per annotation."""

    kind: str = "v7"
    universe: int = ACCOUNTS

    @classmethod
    def for_kind(
        cls, kind: str, seed: int | None = None, universe: int = ACCOUNTS
    ) -> GrowthGenerator:
        base = Generator.create(seed)
        return cls(
            rng=base.rng,
            accounts=base.accounts,
            documents=base.documents,
            organization_id=md5_uuid("org0"),
            ledger_id=md5_uuid("ledger0"),
            job_id=str(uuid.uuid4()) if kind == "v4" else base.job_id,
            kind=kind,
            universe=universe,
        )

    def new_id(self) -> str:
        return str(uuid.uuid4()) if self.kind == "v4" else uuid7(self.rng)

    def transaction(self) -> dict[str, Any]:
        record = Generator.transaction(self)
        rng = self.rng
        record["id"] = self.new_id()
        record["ledger_id"] = md5_uuid(f"ledger{rng.randrange(LEDGERS)}")
        source, target = rng.sample(range(self.universe), 2)
        for op, account in zip(record["operations"], (source, target), strict=True):
            op["id"] = self.new_id()
            op["account_id"] = md5_uuid(f"acct{account}")
        return record

    def credit_annotation(self) -> dict[str, Any]:
        record = Generator.credit_annotation(self)
        record["id"] = self.new_id()
        record["document"] = valid_document(self.rng, "CPF")
        return record


async def fill_queue(
    topology: Topology, count: int, record_type: str, kind: str, universe: int = ACCOUNTS
) -> LoadReport:
    """Publish ``count`` records (confirmed) and wait until the queue shows them all."""
    gen = GrowthGenerator.for_kind(kind, random.randrange(1 << 30), universe)
    report = await publish_load(
        rabbitmq_url(),
        topology.exchange,
        LoadSpec(record_type=record_type, count=count),
        generator=gen,
    )
    await wait_visible(topology.queue, count, timeout=120)
    return report
