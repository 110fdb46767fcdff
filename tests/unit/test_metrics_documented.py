"""Every metric a role exports is in docs/reference.md's list (issue 29: keep the list true), and
the reasons exported at 0 are the ones the code counts."""

from __future__ import annotations

import re
from pathlib import Path

from bulk_recorder.infra.metrics import DEAD_LETTER_REASONS, PUBLISH_FAILURE_REASONS, Metrics
from consumer.delivery import dead_letter_class

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


def test_the_reasons_exported_at_zero_are_every_reason_the_code_counts() -> None:
    """The failure counters' reasons are exported from 0 so rate() sees the first event: a
    reason the code counts but the list misses would be born at 1 again, unseen by the alert."""
    code = REFERENCE.parents[1] / "bulk_recorder"
    flusher = (code / "recorder" / "flusher.py").read_text()
    dead = set(re.findall(r"count_dead_letter\([^)]*\"(\w+)\"", flusher))
    classes = {
        dead_letter_class(reason)
        for reason in ("body too large", "invalid JSON", "nesting", "missing type", "unknown type")
    }
    classes.add(dead_letter_class("any other reason"))
    assert dead | classes == set(DEAD_LETTER_REASONS)
    relay = (code / "producer" / "relay_batch.py").read_text()
    failures = set(re.findall(r"outbox_publish_failures\.labels\(reason=\"(\w+)\"\)", relay))
    assert failures == set(PUBLISH_FAILURE_REASONS)
