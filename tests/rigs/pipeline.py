"""The producer side and the recorder as real processes: ``api``, ``relay`` and ``consume``.

:class:`Pipeline` starts the three commands of the console script (``python -m consumer.cli``)
each with its own environment, so that a test can give each one other settings (a URL with
TLS parameters, a login role of its own), waits until each answers ``/readyz``, feeds the API
and stops them all with SIGTERM. Their output goes to log files; :meth:`Pipeline.logs` gives
the tails for a failed test. A process that exits before it is ready fails the start with its
log.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from consumer.tools.generator import Generator
from tests.rigs.rabbitmq_node import free_port

REPO = Path(__file__).resolve().parents[2]
ROLES = ("consume", "relay", "api")


@dataclass
class Pipeline:
    folder: Path
    envs: dict[str, dict[str, str]]  # per command: its whole environment
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    async def start(self, timeout: float = 90) -> None:
        for role in ROLES:
            port = self.ports[role] = free_port()
            env = dict(self.envs[role], PYTHONUNBUFFERED="1", METRICS_HOST="127.0.0.1")
            if role == "api":
                env.update(API_HOST="127.0.0.1", API_PORT=str(port), METRICS_PORT="0")
            else:
                env["METRICS_PORT"] = str(port)
            with (self.folder / f"{role}.log").open("wb") as log:
                self.procs[role] = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "consumer.cli", role,
                    cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=log, stderr=asyncio.subprocess.STDOUT,
                )  # fmt: skip
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5) as client:
            for role in ROLES:
                while not await self._ready(client, role):
                    proc = self.procs[role]
                    if proc.returncode is not None or time.monotonic() > deadline:
                        raise AssertionError(f"{role} not ready:\n{self.logs()}")
                    await asyncio.sleep(0.2)

    async def _ready(self, client: httpx.AsyncClient, role: str) -> bool:
        try:
            response = await client.get(f"http://127.0.0.1:{self.ports[role]}/readyz")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    async def stop(self, timeout: float = 60) -> dict[str, int]:
        """SIGTERM to each (API first), then its exit code; SIGKILL past ``timeout``."""
        codes: dict[str, int] = {}
        for role in ("api", "relay", "consume"):
            proc = self.procs.get(role)
            if proc is None:
                continue
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), timeout)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode is not None
            codes[role] = proc.returncode
        return codes

    def logs(self, lines: int = 40) -> str:
        out = []
        for role in ROLES:
            path = self.folder / f"{role}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"----- {role}\n" + "\n".join(tail))
        return "\n".join(out)


@dataclass
class Workload:
    """Transactions and one job of credit annotations, with what they must leave behind."""

    transactions: list[dict[str, Any]]
    annotations: list[dict[str, Any]]

    @classmethod
    def make(cls, transactions: int, annotations: int, seed: int = 14) -> Workload:
        gen = Generator.create(seed)
        return cls(
            [gen.transaction() for _ in range(transactions)],
            [gen.credit_annotation() for _ in range(annotations)],
        )

    @property
    def operations(self) -> int:
        return sum(len(t["operations"]) for t in self.transactions)

    def balances(self) -> dict[tuple[str, str], Decimal]:
        """(account, asset) -> available, from the APPROVED transactions."""
        out: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for tx in self.transactions:
            if tx["status"] != "APPROVED":
                continue
            for op in tx["operations"]:
                sign = 1 if op["type"] == "CREDIT" else -1
                out[(op["account_id"], op["asset_code"])] += sign * Decimal(op["amount"])
        return dict(out)

    async def post(self, api: str, headers: dict[str, str] | None = None) -> str:
        """POST every transaction (202 each) and the job (202); returns the job id.

        ``headers`` go with every request (credentials, when the API asks for them)."""
        async with httpx.AsyncClient(base_url=api, timeout=60, headers=headers) as client:
            for tx in self.transactions:
                response = await client.post("/v1/transactions", json=tx)
                assert response.status_code == 202, response.text
            body = "".join(json.dumps(a) + "\n" for a in self.annotations)
            response = await client.post(
                "/v1/credit-annotation-jobs",
                content=body.encode(),
                headers={"Content-Type": "application/x-ndjson"},
            )
            assert response.status_code == 202, response.text
            job = response.json()
            assert job["accepted"] == len(self.annotations), job
            return str(job["id"])


async def recorded(conn: Any, work: Workload) -> bool:
    """True once every record of ``work`` is in the database and the outbox is empty."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM transactions) AS t, (SELECT count(*) FROM operations) AS o,"
        " (SELECT count(*) FROM credit_annotations) AS a, (SELECT count(*) FROM outbox) AS q"
    )
    return bool(
        row["t"] >= len(work.transactions)
        and row["o"] >= work.operations
        and row["a"] >= len(work.annotations)
        and row["q"] == 0
    )


async def assert_recorded_exactly(conn: Any, work: Workload) -> None:
    """Each record once, nothing extra, and the balances the transactions imply."""
    tx_ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    assert tx_ids == {t["id"] for t in work.transactions}
    op_ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM operations")}
    assert op_ids == {op["id"] for t in work.transactions for op in t["operations"]}
    ann_ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM credit_annotations")}
    assert ann_ids == {a["id"] for a in work.annotations}
    balances = {
        (str(r["account_id"]), r["asset_code"]): r["available"]
        for r in await conn.fetch("SELECT account_id, asset_code, available FROM balances")
    }
    assert balances == work.balances()
