"""The cluster rig forms its cluster with one ``rabbit:start()`` at a time.

Two joined nodes started side by side negotiated with the seed's Mnesia at once, and one of
them crashed its ``mnesia_monitor`` (a badmatch in ``handle_info``); the other's boot failed
with ``{aborted, {killed, ... connect_nodes ...}}`` (the exclusive phase of a ``make test``,
every cluster test then an error at setup). This checks the order of the calls with nodes that
only record them; the rig's own tests (tests/cluster/test_rigs.py) form real clusters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.rigs.rabbitmq_cluster import RabbitCluster

pytestmark = pytest.mark.private


def test_joined_nodes_start_one_at_a_time_after_every_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = RabbitCluster(tmp_path, size=4)
    calls: list[tuple[str, str]] = []
    starting = 0
    most_at_once = 0
    lock = threading.Lock()

    def recorder(name: str) -> Callable[..., None]:
        def erl_ok(expression: str, *, timeout: float = 60) -> None:
            nonlocal starting, most_at_once
            with lock:
                calls.append((name, expression))
                if expression == "rabbit:start()":
                    starting += 1
                    most_at_once = max(most_at_once, starting)
            if expression == "rabbit:start()":
                time.sleep(0.05)  # long enough for a second start to overlap, if one could
                with lock:
                    starting -= 1

        return erl_ok

    for node in cluster.nodes:
        monkeypatch.setattr(node, "erl_ok", recorder(node.name))
    monkeypatch.setattr(cluster, "cluster_running_nodes", lambda: [n.node for n in cluster.nodes])
    cluster._join()

    starts = [name for name, expression in calls if expression == "rabbit:start()"]
    assert sorted(starts) == sorted(n.name for n in cluster.nodes[1:])
    assert most_at_once == 1, f"{most_at_once} nodes started at once"
    last_join = max(i for i, (_, e) in enumerate(calls) if e.startswith("rabbit_mnesia:join"))
    first_start = min(i for i, (_, e) in enumerate(calls) if e == "rabbit:start()")
    assert last_join < first_start
