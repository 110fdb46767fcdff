"""Every metric a role exports is in docs/reference.md's list (issue 29: keep the list true)."""

from __future__ import annotations

import re
from pathlib import Path

from bulk_recorder.infra.metrics import Metrics

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_every_bulk_recorder_metric_is_in_the_reference_list() -> None:
    text = REFERENCE.read_text()
    listed = set(re.findall(r"`(bulk_recorder_\w+?)(?:\{[^}]*\})?`", text))
    # a row may shorten its siblings: `bulk_recorder_messages_rejected_total`, `_released_total`
    shortened = set(re.findall(r"`(_\w+?)`", text))
    missing = []
    for family in Metrics().registry.collect():
        if not family.name.startswith("bulk_recorder_"):
            continue
        exposed = family.name + ("_total" if family.type == "counter" else "")
        short = "_" + exposed.split("_", 3)[-1]
        if exposed not in listed and short not in shortened:
            missing.append(exposed)
    assert missing == [], f"not in {REFERENCE.name}: {missing}"
    assert "process_*" in text, "the standard collectors are not listed"
