"""docs/high-availability.md's RabbitMQ cluster settings are the ones the partition runs measured.

The doc recommends ``cluster_partition_handling`` and ``net_ticktime`` with figures taken on the
partition rig (tests/partitions); the rig's nodes must run exactly what the doc ships, or the
figures belong to another setting.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.partitions.conftest import RABBIT_CONFIG

DOC = Path(__file__).resolve().parents[2] / "docs" / "high-availability.md"


def _settings(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs if not k.strip().startswith("#")}


def test_the_doc_ships_the_settings_the_partition_rig_runs() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```ini\n(.*?)```", text, flags=re.S)
    shipped = [b for b in blocks if "cluster_partition_handling" in b]
    assert len(shipped) == 1, "one rabbitmq.conf block names cluster_partition_handling"
    doc = _settings(shipped[0])
    rig = _settings(RABBIT_CONFIG)
    assert doc["cluster_partition_handling"] == rig["cluster_partition_handling"]
    assert doc["net_ticktime"] == rig["net_ticktime"]
