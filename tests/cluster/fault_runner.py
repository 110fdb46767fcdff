"""Applies a fault schedule (``tests/cluster/schedule.py``) to the real rig, overlapping.

Each fault runs as its own task from its start time, so faults overlap as drawn. Two rules keep
the cluster recoverable: one broker node down at a time (a kill waits until the node killed
before it is back and every member of each queue is online again), and one fault at a time
on each process and each proxy. What was applied, when (seconds after the traffic started)
and what it met is kept in :attr:`FaultRunner.applied` for the report.

The processes reach each broker node and each PostgreSQL server through a
:class:`~tests.faults.proxy.TcpProxy` of its own, so a hold (``blackhole``) of one proxy holds
every connection to that node or server without an error, as a partition does: a held broker
connection is noticed only after aiormq's heartbeat grace, a held database connection only
after ``BULK_RECORDER_DB_COMMAND_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field

from tests.cluster.failover_support import last_node_port
from tests.cluster.schedule import Fault
from tests.faults.conftest import RecorderProcess
from tests.faults.proxy import TcpProxy
from tests.rigs.postgres_cluster import PgCluster
from tests.rigs.rabbitmq_cluster import RabbitCluster
from tests.rigs.wait import poll

CONNECTED = "connected to RabbitMQ node"  # the line each process logs on each connect


@dataclass
class Applied:
    kind: str
    target: str
    began: float  # seconds after the traffic started
    ended: float
    note: str = ""

    def line(self) -> str:
        note = f"  ({self.note})" if self.note else ""
        return f"t+{self.began:6.1f} .. {self.ended:6.1f} s  {self.kind:<13} {self.target}{note}"


@dataclass
class FaultRunner:
    cluster: RabbitCluster
    pg: PgCluster
    # the main queue (or each shard of it, 1 to N) and the DLQ last: whose leader a node kill
    # took
    queues: tuple[str, ...]
    mq_proxies: list[TcpProxy]  # one a broker node, in node order
    db_proxies: list[TcpProxy]  # [primary's, standby's]
    procs: dict[str, RecorderProcess]  # "recorder-0", "recorder-1", "relay", "api"
    t0: float = field(default_factory=time.monotonic)
    _kills_left: int = 0
    primary: int = 0  # index into db_proxies of the server that is primary now
    applied: list[Applied] = field(default_factory=list)
    _broker: asyncio.Lock = field(default_factory=asyncio.Lock)
    # the queues' leaders (node names), read before the first fault and after each restart:
    # rabbitmqctl boots an Erlang VM, seconds on a busy machine, too slow to ask before a kill
    _leaders: dict[str, str | None] = field(default_factory=dict)
    _locks: defaultdict[str, asyncio.Lock] = field(
        default_factory=lambda: defaultdict(asyncio.Lock)
    )

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def prepare(self) -> None:
        """Read the queues' leaders (before the traffic starts: it takes seconds)."""
        await asyncio.to_thread(self._read_leaders)

    async def run(self, schedule: list[Fault]) -> None:
        """Apply every fault at its time from now (t0); returns once each one is over (nodes
        restarted, processes started again, proxies forwarding)."""
        self.t0 = time.monotonic()
        self._kills_left = sum(f.kind == "broker_kill" for f in schedule)
        async with asyncio.TaskGroup() as group:
            for fault in schedule:
                group.create_task(self._at(fault))

    async def _at(self, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, fault.at - self.now()))
        apply = getattr(self, f"_{fault.kind}")
        await apply(fault)

    def _record(self, fault: Fault, began: float, note: str = "") -> Applied:
        self.applied.append(Applied(fault.kind, fault.target, began, self.now(), note))
        return self.applied[-1]

    async def _broker_kill(self, fault: Fault) -> None:
        node = self.cluster.nodes[int(fault.target.rsplit("-", 1)[1])]
        async with self._broker:
            led = [name for name, leader in self._leaders.items() if leader == node.node]
            began = self.now()
            await asyncio.to_thread(self.cluster.kill, node)
            await asyncio.sleep(fault.duration)
            await asyncio.to_thread(self.cluster.restart, node)
            back = self.now() - began
            self._kills_left -= 1
            if self._kills_left:  # the next kill must find every member back, and its leaders
                for queue in self.queues:
                    await asyncio.to_thread(self.cluster.wait_all_online, queue, timeout=120)
                await asyncio.to_thread(self._read_leaders)
        what = f"led the {' and the '.join(led)}" if led else f"led {self._none_led()}"
        self._record(fault, began, f"{node.name}, {what}; back in the cluster after {back:.1f} s")

    def _names(self) -> list[str]:
        """What the report calls each queue: the main queue, or shard 1 to N, then the DLQ."""
        shards = len(self.queues) - 1
        if shards == 1:
            return ["main queue", "DLQ"]
        return [*(f"shard {k}" for k in range(1, shards + 1)), "DLQ"]

    def _none_led(self) -> str:
        return "neither queue" if len(self.queues) == 2 else "no queue"

    def _read_leaders(self) -> None:
        statuses = self.cluster.queue_statuses()
        for name, queue in zip(self._names(), self.queues, strict=True):
            status = statuses.get(queue)
            self._leaders[name] = status.leader if status is not None else None

    async def _db_failover(self, fault: Fault) -> None:
        began = self.now()
        await asyncio.to_thread(self.pg.primary.kill)
        await asyncio.to_thread(self.pg.standby.promote)
        await asyncio.to_thread(
            poll, lambda: not self.pg.standby.in_recovery(), 60, "standby promoted"
        )
        self.primary = 1
        self._record(fault, began, f"standby writable {self.now() - began:.1f} s after the kill")

    async def _process_kill(self, fault: Fault) -> None:
        proc = self.procs[fault.target]
        async with self._locks[fault.target]:
            began = self.now()
            await proc.kill()  # fails if it had exited by itself: a crash, not our fault
            await asyncio.sleep(fault.duration)
            await proc.start()
        self._record(fault, began, f"started again after {fault.duration:.1f} s")

    _recorder_kill = _process_kill
    _relay_kill = _process_kill

    async def _broker_hold(self, fault: Fault) -> None:
        proc = self.procs[fault.target]
        port = last_node_port(proc.log_text())
        chosen = [p for p in self.mq_proxies if p.port == port]
        # not connected yet (just restarted): the node most connections go through
        proxy = chosen[0] if chosen else max(self.mq_proxies, key=lambda p: p.active_connections)
        node = self.mq_proxies.index(proxy)
        before = proc.log_text().count(CONNECTED)
        applied = await self._hold(fault, proxy, f"node-{node}, {{n}} connections held")
        moved = proc.log_text().count(CONNECTED) - before
        applied.note += f"; {fault.target} connected {moved} time(s) meanwhile"

    async def _db_hold(self, fault: Fault) -> None:
        server = ("primary", "promoted standby")[self.primary]
        await self._hold(fault, self.db_proxies[self.primary], f"{server}, {{n}} connections held")

    async def _hold(self, fault: Fault, proxy: TcpProxy, note: str) -> Applied:
        async with self._locks[f"proxy-{proxy.port}"]:
            began = self.now()
            proxy.blackhole()
            held = proxy.active_connections
            await asyncio.sleep(fault.duration)
            proxy.restore()
        return self._record(fault, began, note.format(n=held))
