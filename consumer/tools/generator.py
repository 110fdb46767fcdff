"""Realistic records for the load generator, the demo, the benchmarks and the tests: valid
transactions and credit annotations, and every kind of invalid message the recorder must
dead-letter. Ids are UUIDv7 (time-ordered, as Midaz uses) so that inserts stay index-friendly.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bulk_recorder.infra.ids import uuid7
from bulk_recorder.records.documents import normalize_document

RECORD_TYPES = ("transaction", "credit_annotation")


def valid_document(rng: random.Random, kind: str) -> str:
    """A random CPF or CNPJ with correct check digits, found with the project's own validator."""
    if kind == "CPF":
        base = "".join(rng.choice("0123456789") for _ in range(9))
    else:
        base = "".join(rng.choice("0123456789ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(12))
    for dv in range(100):
        candidate = f"{base}{dv:02d}"
        try:
            return normalize_document(candidate)[0]
        except ValueError:
            continue
    return valid_document(rng, kind)  # a placeholder-only base (all one digit): draw again


def _cents(rng: random.Random, low: int = 1, high: int = 1_000_000) -> str:
    cents = rng.randint(low, high)
    return f"{cents // 100}.{cents % 100:02d}"


@dataclass(slots=True)
class Generator:
    """Builds message bodies; deterministic for a given seed (except ids, which are UUIDv7)."""

    rng: random.Random
    accounts: list[str] = field(default_factory=list)
    documents: list[str] = field(default_factory=list)
    organization_id: str = ""
    ledger_id: str = ""
    job_id: str = ""

    @classmethod
    def create(cls, seed: int | None = None) -> Generator:
        rng = random.Random(seed)
        gen = cls(rng=rng)
        gen.accounts = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(500)]
        gen.documents = [valid_document(rng, "CPF") for _ in range(300)] + [
            valid_document(rng, "CNPJ") for _ in range(200)
        ]
        gen.organization_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        gen.ledger_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        gen.job_id = uuid7(rng)
        return gen

    def transaction(self) -> dict[str, Any]:
        rng = self.rng
        amount = _cents(rng, 100)
        source, target = rng.sample(self.accounts, 2)
        return {
            "id": uuid7(rng),
            "organization_id": self.organization_id,
            "ledger_id": self.ledger_id,
            "description": "load test transfer",
            "status": "APPROVED",
            "asset_code": "BRL",
            "amount": amount,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "metadata": {"source": "loadgen", "n": rng.randint(0, 1000)},
            "operations": [
                {
                    "id": uuid7(rng),
                    "account_id": source,
                    "type": "DEBIT",
                    "amount": amount,
                    "asset_code": "BRL",
                },
                {
                    "id": uuid7(rng),
                    "account_id": target,
                    "type": "CREDIT",
                    "amount": amount,
                    "asset_code": "BRL",
                },
            ],
        }

    def credit_annotation(self) -> dict[str, Any]:
        rng = self.rng
        return {
            "id": uuid7(rng),
            "job_id": self.job_id,
            "document": rng.choice(self.documents),
            "kind": "RESTRICTION" if rng.random() < 0.9 else "RELEASE",
            "creditor": "Banco Exemplo S.A.",
            "amount": _cents(rng, 0),
            "occurred_on": "2026-11-20",
            "reason": "overdue payment",
        }

    def record(self, record_type: str) -> dict[str, Any]:
        return self.transaction() if record_type == "transaction" else self.credit_annotation()

    def invalid(self, n: int) -> tuple[bytes, str | None, str]:
        """The n-th invalid message: (body, type property, what is wrong)."""
        variants: list[Callable[[], tuple[bytes, str | None, str]]] = [
            lambda: (b"{not json", "transaction", "not JSON"),
            lambda: (b"[1, 2, 3]", "transaction", "not an object"),
            lambda: (dump(self.transaction()), "payment", "unknown type"),
            lambda: (dump(self.transaction()), None, "missing type"),
            lambda: (dump(_without(self.transaction(), "ledger_id")), "transaction", "missing"),
            lambda: (dump(_unbalanced(self.transaction())), "transaction", "unbalanced"),
            lambda: (dump(_float_amount(self.transaction())), "transaction", "float amount"),
            lambda: (dump(_bad_cpf(self.credit_annotation())), "credit_annotation", "bad CPF"),
            lambda: (
                dump({**self.credit_annotation(), "amount": "-5.00"}),
                "credit_annotation",
                "negative amount",
            ),
            lambda: (
                dump({**self.credit_annotation(), "id": "nope"}),
                "credit_annotation",
                "uuid",
            ),
        ]
        return variants[n % len(variants)]()


def dump(obj: Any) -> bytes:
    """A message body: compact JSON."""
    return json.dumps(obj, separators=(",", ":")).encode()


def _without(obj: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != key}


def _unbalanced(tx: dict[str, Any]) -> dict[str, Any]:
    tx["operations"][1]["amount"] = "0.01"
    return tx


def _float_amount(tx: dict[str, Any]) -> dict[str, Any]:
    tx["amount"] = 150.1
    return tx


def _bad_cpf(ann: dict[str, Any]) -> dict[str, Any]:
    ann["document"] = "529.982.247-26"
    return ann
