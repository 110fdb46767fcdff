"""The queue-shard benchmark (benchmarks/bench_shards.py) runs end to end in its quick mode on the
session's three-node cluster, so that it cannot rot between the runs whose figures
docs/performance.md quotes: each node in a CPU cgroup of its own, N = 1 and N = 3 (also with
shards 2-3 at one replica, each placed on a node of its own) drained by three recorder
processes, every node's CPU held to its quota, the shards' leaders on three nodes, then a node
killed under the recorders, and the tables printed.

It proves no speed (a timed assertion in a test proves nothing on a shared machine): only that
the benchmark still measures what it says, and that its numbers are sane. The cgroups need root;
without it the test skips, saying so.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import bench_shards
from benchmarks.support import cgroups
from benchmarks.support.quota_cluster import QuotaCluster
from tests.rigs.rabbitmq_cluster import RabbitCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

NODE_CPUS = 0.1  # lower than the full run's: fewer records fill the kill run's windows


@pytest.mark.skipif(cgroups.available() is not None, reason=f"{cgroups.available()}")
async def test_quick_mode_end_to_end(
    shard_cluster: RabbitCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--quick", "--node-cpus", str(NODE_CPUS), "--logs", str(tmp_path)]
    argv += ["--shard-replicas", "0", "1"]  # N = 3 also with shards 2-3 at one replica
    args = bench_shards.build_parser().parse_args(argv)
    args.argv = argv
    cluster = QuotaCluster(
        tmp_path,
        NODE_CPUS,
        rig=shard_cluster,
        shares=args.node_shares,
        recorder_shares=args.recorder_shares,
    )
    cluster.start()
    try:
        data = await bench_shards.run(args, cluster)
    finally:
        cluster.stop()  # the nodes back in the root group, the groups removed
    captured = capsys.readouterr()
    out = captured.out
    with capsys.disabled():  # the run's tables and timings, in the suite's log
        print(captured.err + out)
    assert not cluster.groups
    assert cluster.recorder_group is None
    for node in shard_cluster.running_nodes():
        assert node.proc is not None
        assert "bulk-recorder-bench" not in cgroup_of(node.proc.pid)

    for title in ("### Machine", "### Each run", "### N = 1 against N = 3", "### A node lost"):
        assert title in out, out
    for fact in ("nproc", "postgresql", "rabbitmq (the rig's three nodes)", "quota", "command"):
        assert fact in data["facts"], data["facts"]
    assert "--quick" in data["facts"]["command"]
    assert "what bounds N = 3:" in out

    runs = data["runs"]
    assert sorted((r["shards"], r["replicas"]) for r in runs) == [(1, 0), (3, 0), (3, 1)]
    for run in runs:  # shards 2-3 at one replica each placed on a node of its own
        every = "+".join(
            sorted(n.name.removeprefix(shard_cluster.prefix) for n in shard_cluster.nodes)
        )
        expected = {"shard 1": every}
        if run["shards"] == 3:
            expected |= {f"shard {k}": every if not run["replicas"] else f"n{k}" for k in (2, 3)}
        assert run["members"] == expected, run
    assert set(data["summary"]["ratios_by_config"]) == {"3", "3r1"}, data["summary"]
    for run in runs:
        assert run["rate"] > 0, run
        assert run["seconds"] > 0, run
        assert len(set(run["leaders"].values())) == run["shards"], run["leaders"]
        assert sum(run["recorder_cores"]) > 0, run
        for name, use in run["nodes"].items():
            # each node worked, and no more than its quota (ticks of 10 ms: some slack)
            assert 0 < use["cores"] <= NODE_CPUS * 1.25 + 0.02, (name, use)
    for figure, value in data["summary"]["ceiling"].items():
        assert math.isfinite(value), figure
        assert value > 0, figure
    ratio = data["summary"]["median_ratio"]
    assert math.isfinite(ratio), data["summary"]
    assert ratio > 0, data["summary"]

    kill = data["kill"]
    victim_queue = [q for q, node in kill["leaders_before"].items() if node == kill["victim"]]
    assert kill["moved"] == victim_queue, kill
    assert kill["only_victims_moved"], kill
    seen = {k: kill[k] for k in ("per_shard_before", "per_shard_after", "left_in_shards")}
    assert math.isfinite(kill["gap_s"]), f"the killed node's shard never drained again: {seen}"
    assert kill["rate_before"] > 0, kill
    assert kill["rate_after"] > 0, kill  # nan is not
    victim_cores = kill["nodes_after"][kill["victim"]]["cores"]
    assert math.isnan(victim_cores), "the killed node reads as killed (nan), not as a number"
    # every recorder consumed every shard, and no consumer is left on the killed node
    assert sum(kill["consumers_before"].values()) == 3 * args.recorders, kill["consumers_before"]
    assert kill["victim"] not in kill["consumers_after"], kill["consumers_after"]
    assert len(kill["reconnects"]) == args.recorders, kill["reconnects"]


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()
