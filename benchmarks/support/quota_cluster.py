"""The three-node RabbitMQ cluster rig with each node in a CPU cgroup of its own.

:class:`QuotaCluster` starts :class:`tests.rigs.rabbitmq_cluster.RabbitCluster` (with the random
exchange plugin that queue shards route through), then moves each node's Erlang VM (and its
helper processes) into a :class:`~benchmarks.support.cgroups.CpuLimit` of its own. The quota is
switched on only for the measured parts (:meth:`QuotaCluster.limit`): boot, filling the queues
and cleaning up run unlimited, so that they take seconds, not minutes.

:meth:`QuotaCluster.sample` reads each node's CPU seconds (``/proc/<pid>/stat`` of the
processes in its group) and its group's throttling, for the CPU a node used against its quota
over a window.

On the namespace rig (tests/rigs/hosted.py) the nodes' addresses exist only inside the
namespaces: ``client_urls`` are the URLs this process reaches them by (forwarders through the
observer), and :meth:`QuotaCluster.url` gives them; the nodes' own URLs stay what the recorders,
inside their namespaces, are given.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika

from benchmarks.support.cgroups import CpuLimit, Throttling
from benchmarks.support.machine import machine_cpu
from consumer.topology import RANDOM_PLUGIN
from tests.rigs.rabbitmq_cluster import RabbitCluster
from tests.rigs.rabbitmq_node import RabbitNode

# a channel's name: "127.0.0.1:51234 -> 127.0.0.1:5672 (1)", the node's own address and port
# second (the rig's own cluster: one port a node; the namespace rig: one address a node)
_SERVER = re.compile(r"-> ([^ ]+:\d+)")


@dataclass(frozen=True, slots=True)
class NodeUse:
    """One node's CPU over a window, against its quota."""

    cpu_s: float
    seconds: float
    quota: float | None
    throttling: Throttling

    @property
    def killed(self) -> bool:
        """Its processes went away during the window (their CPU seconds went with them)."""
        return self.cpu_s != self.cpu_s or self.cpu_s < 0

    @property
    def cores(self) -> float:
        if self.killed or self.seconds <= 0:
            return float("nan")
        return self.cpu_s / self.seconds

    def describe(self) -> str:
        """``0.24 (96%, thr 40%)``: cores, share of the quota, share of periods held back."""
        if self.killed:
            return "killed"
        return f"{self.cores:.2f} ({self.of_quota:.0%}, thr {self.throttling.share:.0%})"

    @property
    def of_quota(self) -> float:
        """The share of its quota the node used (nan without a quota)."""
        return self.cores / self.quota if self.quota else float("nan")


@dataclass(frozen=True, slots=True)
class Sample:
    """Every node's CPU seconds and throttling, and the machine's busy seconds, at one instant."""

    at: float
    cpu_s: dict[str, float]
    throttling: dict[str, Throttling]
    machine_busy_s: float

    def use_since(self, start: Sample, quota: float | None) -> dict[str, NodeUse]:
        """Each node's use from ``start`` to this sample."""
        seconds = self.at - start.at
        return {
            name: NodeUse(
                self.cpu_s[name] - start.cpu_s.get(name, 0.0),
                seconds,
                quota,
                self.throttling[name] - start.throttling.get(name, Throttling()),
            )
            for name in self.cpu_s
        }

    def machine_cores_since(self, start: Sample) -> float:
        seconds = self.at - start.at
        return (self.machine_busy_s - start.machine_busy_s) / seconds if seconds > 0 else 0.0


@dataclass
class QuotaCluster:
    """``rig``: a running cluster to use (its nodes go back to the root group at :meth:`stop`,
    which leaves them running); without it, a cluster of ``size`` nodes under ``base_dir``."""

    base_dir: Path
    node_cpus: float
    size: int = 3
    shares: int = 1024  # each node group's weight (cpu.shares)
    # the weight of a group without a quota for the recorders (0: none, they stay where they are)
    recorder_shares: int = 0
    rig: RabbitCluster | None = None
    # node i's URL as this process reaches it (default: the node's own): see the module's doc
    client_urls: list[str] | None = None
    groups: dict[str, CpuLimit] = field(default_factory=dict, init=False)
    recorder_group: CpuLimit | None = field(default=None, init=False)
    limited: bool = field(default=False, init=False)
    owned: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        if self.rig is None:
            self.rig = RabbitCluster(self.base_dir, size=self.size, plugins=(RANDOM_PLUGIN,))
        else:
            self.owned = False

    @property
    def cluster(self) -> RabbitCluster:
        assert self.rig is not None
        return self.rig

    @property
    def nodes(self) -> list[RabbitNode]:
        return self.cluster.nodes

    def url(self, index: int) -> str:
        """Node ``index``'s (from 0) URL for this process's own connections."""
        if self.client_urls is not None:
            return self.client_urls[index]
        return self.nodes[index].url

    def start(self) -> QuotaCluster:
        """Boot and join the nodes (unlimited; an adopted cluster is running already), then put
        each in its group."""
        if self.owned:
            self.cluster.start()
        try:
            for node in self.nodes:
                assert node.proc is not None
                group = CpuLimit(None, name=node.name)
                group.set_shares(self.shares)
                self.groups[node.name] = group
                group.add(node.proc.pid)
            if self.recorder_shares:
                self.recorder_group = CpuLimit(None, name="recorders")
                self.recorder_group.set_shares(self.recorder_shares)
        except BaseException:
            self.stop()
            raise
        return self

    def add_recorder(self, pid: int) -> None:
        """Into the recorders' group, if there is one."""
        if self.recorder_group is not None:
            self.recorder_group.add(pid)

    def limit(self, on: bool) -> None:
        """Every node at ``node_cpus`` cores (``on``) or unlimited."""
        for group in self.groups.values():
            group.set_quota(self.node_cpus if on else None)
        self.limited = on

    def sample(self) -> Sample:
        return Sample(
            time.monotonic(),
            {name: _cpu_or_nan(group) for name, group in self.groups.items()},
            {name: group.throttling() for name, group in self.groups.items()},
            machine_cpu()[0],
        )

    def short(self, node: str | None) -> str:
        """``n2`` for ``<prefix>n2@localhost``."""
        if node is None:
            return "-"
        name = node.split("@", 1)[0]
        return name.removeprefix(self.cluster.prefix)

    def stop(self) -> None:
        if self.owned:
            self.cluster.stop()
        for group in self.groups.values():
            group.close()
        self.groups.clear()
        if self.recorder_group is not None:
            self.recorder_group.close()
            self.recorder_group = None

    async def server_version(self) -> str:
        connection = await aio_pika.connect(self.url(0), timeout=30)
        try:
            props = connection.transport.connection.server_properties  # type: ignore[union-attr]
            return str(props.get("version", "?"))
        finally:
            await connection.close()

    def consumers(self, queues: list[str]) -> dict[str, int]:
        """How many consumers of ``queues`` each node holds, by short name: a consumer's channel
        is on the node its connection is to, whose address and AMQP port the channel's name
        shows (two rabbitmqctl calls, about a CPU second each)."""
        consumers = self._ctl_rows("list_consumers", "queue_name", "channel_pid")
        channels = self._ctl_rows("list_channels", "pid", "name")
        by_server = {
            f"{n.address}:{n.amqp_port}": n.name.removeprefix(self.cluster.prefix)
            for n in self.nodes
        }
        node_of: dict[str, str] = {}
        for row in channels:
            found = _SERVER.search(str(row.get("name", "")))
            if found:
                node_of[str(row.get("pid"))] = by_server.get(found.group(1), found.group(1))
        counts: dict[str, int] = {}
        for row in consumers:
            if row.get("queue_name") in queues:
                node = node_of.get(str(row.get("channel_pid")), "?")
                counts[node] = counts.get(node, 0) + 1
        return counts

    def _ctl_rows(self, command: str, *columns: str) -> list[dict[str, object]]:
        for attempt in range(5):  # a queue process that just died makes a listing fail
            result = self.cluster.running_nodes()[0].ctl(
                command, "--quiet", "--formatter", "json", *columns, check=False
            )
            if result.returncode == 0:
                return list(json.loads(result.stdout or "[]"))
            time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"rabbitmqctl {command} failed: {result.stdout[-300:]}")

    async def leaders(self, queues: list[str]) -> dict[str, str | None]:
        """Each queue's leader now (one rabbitmqctl call, in a thread: about a CPU second)."""
        statuses = await asyncio.to_thread(self.cluster.queue_statuses)
        return {q: (statuses[q].leader if q in statuses else None) for q in queues}


def _cpu_or_nan(group: CpuLimit) -> float:
    """The group's CPU seconds; nan when no process is left in it (its node was killed)."""
    return group.cpu_seconds() if group.pids() else float("nan")
