"""A throwaway three-node RabbitMQ cluster for failover tests.

:class:`RabbitCluster` starts ``size`` :class:`~tests.rigs.rabbitmq_node.RabbitNode` s from the
installed ``rabbitmq-server``, each with its own node name, AMQP and distribution ports, data
(mnesia) and log directories under one folder of the test's, all sharing one Erlang cookie. The
nodes boot in parallel; then every node but the first is joined to the first, as
``rabbitmqctl join_cluster`` does it. Nothing of the machine's own node is read or changed.

What a failover test needs:

- :attr:`RabbitCluster.urls` and :attr:`RabbitCluster.rabbitmq_url` (the comma-separated list a
  clustered ``RABBITMQ_URL`` holds);
- :meth:`RabbitCluster.queue_status` and :meth:`RabbitCluster.leader_of`: a quorum queue's leader,
  members and online members, as ``rabbitmqctl list_queues`` on a running node reports them
  (read with :meth:`~tests.rigs.rabbitmq_node.RabbitNode.erl`: milliseconds, where each
  rabbitmqctl call boots an Erlang VM);
- :meth:`RabbitCluster.kill` (SIGKILL, no goodbye to clients or peers) and
  :meth:`RabbitCluster.restart` (the node boots again on its own data and rejoins the cluster);
- :meth:`RabbitCluster.wait_for_leader` and :meth:`RabbitCluster.wait_all_online`.

Every method blocks (a node's answer, or a boot). From async tests call the slow ones through
``asyncio.to_thread`` so that the event loop, and any recorder or proxy in it, keeps running.
:attr:`RabbitCluster.timings` keeps how long the cluster took to start, join and stop, for the
report.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.rigs.rabbitmq_node import RabbitNode, new_cookie
from tests.rigs.wait import poll

if TYPE_CHECKING:
    from tests.rigs.netns import Host


@dataclass(frozen=True)
class QueueStatus:
    """A quorum queue as the cluster sees it; node names as ``name@localhost``."""

    name: str
    leader: str | None
    members: tuple[str, ...]
    online: tuple[str, ...]


def _parallel(nodes: Iterable[RabbitNode], action: Callable[[RabbitNode], object]) -> None:
    nodes = list(nodes)
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        # list() re-raises the first failure
        list(pool.map(action, nodes))


@dataclass
class RabbitCluster:
    """``size`` RabbitMQ nodes under ``base_dir`` joined into one cluster."""

    base_dir: Path
    size: int = 3
    prefix: str = field(default_factory=lambda: f"brha{secrets.token_hex(3)}")
    # one network namespace a node (tests/rigs/netns.py): each node on its host's address, with
    # the standard ports, and `config` (extra rabbitmq.conf text) for every node
    hosts: list[Host] | None = None
    config: str = ""
    plugins: tuple[str, ...] = ()  # enabled at boot on every node
    nodes: list[RabbitNode] = field(init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        cookie = new_cookie()
        if self.hosts is None:
            self.nodes = [
                RabbitNode(
                    f"{self.prefix}n{i}",
                    self.base_dir / f"node{i}",
                    cookie=cookie,
                    config=self.config,
                    plugins=self.plugins,
                )
                for i in range(1, self.size + 1)
            ]
            return
        self.size = len(self.hosts)
        self.nodes = [
            RabbitNode(
                f"{self.prefix}n{i}", self.base_dir / f"node{i}", amqp_port=5672,
                dist_port=25672, cookie=cookie, config=self.config, host=host,
                plugins=self.plugins,
            )
            for i, host in enumerate(self.hosts, start=1)
        ]  # fmt: skip

    # -- addresses --------------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def rabbitmq_url(self) -> str:
        """The comma-separated list of every node's AMQP URL (a clustered RABBITMQ_URL)."""
        return ",".join(self.urls)

    def node(self, name: str) -> RabbitNode:
        """The node called ``name`` (``x@localhost`` or the short ``x``)."""
        for node in self.nodes:
            if name in (node.node, node.name):
                return node
        raise KeyError(name)

    def running_nodes(self) -> list[RabbitNode]:
        return [node for node in self.nodes if node.running]

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> RabbitCluster:
        """Boot every node in parallel, then join them to the first with join_cluster."""
        began = time.monotonic()
        try:
            _parallel(self.nodes, lambda n: n.start(timeout))
            booted = time.monotonic()
            self._join()
        except BaseException:
            self.stop()
            raise
        done = time.monotonic()
        self.timings.update(boot=booted - began, join=done - booted, start=done - began)
        return self

    def _join(self) -> None:
        seed, others = self.nodes[0], self.nodes[1:]
        # stop_app may run side by side; join_cluster one at a time, since each one changes
        # the seed's cluster membership; start_app one at a time too: two joined nodes started
        # at once negotiated with the seed's Mnesia together, and one crashed its
        # mnesia_monitor (tests/unit/test_rig_join.py)
        _parallel(others, lambda n: n.erl_ok("rabbit:stop()"))
        for node in others:
            node.erl_ok(f"rabbit_mnesia:join_cluster('{seed.node}', disc)")
        # rabbit:start() returns once the app has booted: no await_startup round needed
        for node in others:
            node.erl_ok("rabbit:start()", timeout=120)
        members = set(self.cluster_running_nodes())
        expected = {n.node for n in self.nodes}
        if members != expected:
            raise RuntimeError(f"cluster formed with {sorted(members)}, wanted {sorted(expected)}")

    def stop(self) -> None:
        """Orderly stop of every node (SIGKILL for any that hangs); data stays on disk."""
        began = time.monotonic()
        _parallel(self.nodes, lambda n: n.stop())
        self.timings["stop"] = time.monotonic() - began

    def kill(self, node: RabbitNode) -> None:
        """SIGKILL one node: its clients and peers see the connection drop, nothing more."""
        node.kill()

    def restart(self, node: RabbitNode, timeout: float = 120) -> None:
        """Boot a stopped or killed node again on its own data; it rejoins the cluster."""
        node.start(timeout)
        poll(
            lambda: node.node in self.cluster_running_nodes(),
            timeout,
            f"{node.node} running in the cluster again",
        )

    def __enter__(self) -> RabbitCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the cluster says --------------------------------------------------------------
    def _any_running(self) -> RabbitNode:
        running = self.running_nodes()
        if not running:
            raise RuntimeError("no node of the cluster is running")
        return running[0]

    def cluster_running_nodes(self) -> list[str]:
        """Nodes the cluster reports as running (asked on a running node)."""
        return list(self._any_running().cluster_status().get("running_nodes", []))

    def _queue_rows(self, vhost: str) -> list[dict[str, Any]]:
        return self._any_running().queue_rows(
            "name", "type", "leader", "members", "online", vhost=vhost
        )

    @staticmethod
    def _status(row: dict[str, Any]) -> QueueStatus:
        leader = row.get("leader")
        return QueueStatus(
            name=row["name"],
            leader=leader if isinstance(leader, str) and "@" in leader else None,
            members=tuple(sorted(row.get("members") or ())),
            online=tuple(sorted(row.get("online") or ())),
        )

    def queue_status(self, queue: str, vhost: str = "/") -> QueueStatus | None:
        """Leader, members and online members of a quorum queue; None if it does not exist."""
        for row in self._queue_rows(vhost):
            if row["name"] != queue:
                continue
            if row["type"] != "quorum":
                raise RuntimeError(f"{queue} is a {row['type']} queue, not a quorum queue")
            return self._status(row)
        return None

    def queue_statuses(self, vhost: str = "/") -> dict[str, QueueStatus]:
        """Every quorum queue of ``vhost`` by name, in one call."""
        return {
            str(row["name"]): self._status(row)
            for row in self._queue_rows(vhost)
            if row["type"] == "quorum"
        }

    def leader_of(self, queue: str, vhost: str = "/") -> RabbitNode:
        """The node that leads ``queue`` now."""
        status = self.queue_status(queue, vhost)
        if status is None or status.leader is None:
            raise RuntimeError(f"queue {queue} has no leader: {status}")
        return self.node(status.leader)

    def wait_for_leader(
        self,
        queue: str,
        *,
        not_on: RabbitNode | None = None,
        timeout: float = 60,
        vhost: str = "/",
    ) -> RabbitNode:
        """Wait until ``queue`` has an online leader on a running node (other than ``not_on``)."""

        def check() -> RabbitNode | None:
            status = self.queue_status(queue, vhost)
            if status is None or status.leader is None or status.leader not in status.online:
                return None
            leader = self.node(status.leader)
            if not leader.running or leader is not_on:
                return None
            return leader

        return poll(check, timeout, f"{queue} has a leader")

    def wait_all_online(self, queue: str, *, timeout: float = 60, vhost: str = "/") -> QueueStatus:
        """Wait until every node of the cluster is a member of ``queue`` and online in it."""
        expected = tuple(sorted(n.node for n in self.nodes))

        def check() -> QueueStatus | None:
            status = self.queue_status(queue, vhost)
            if status is None or status.members != expected or status.online != expected:
                return None
            return status if status.leader is not None else None

        return poll(check, timeout, f"every member of {queue} online")

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(f"--- {n.node}\n{n.log_tail(lines)}" for n in self.nodes)
