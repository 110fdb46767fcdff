"""The give back's wait (``Kept._settled_to``) as pure logic: the DLQ's consumer counts it reads
are scripted, so each rule that ends the wait is seen alone. The real broker's side (the pace
those counts give, a second reader) is in tests/integration/test_dlq_give_back_pace.py and
test_dlq_arrivals.py."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.tools import dlq_pass

LEFT = 32  # messages not yet given back: the count the wait waits for


def scripted(monkeypatch: pytest.MonkeyPatch, counts: list[int | None]) -> list[int | None]:
    """``Kept._unsettled`` answers ``counts`` in turn; a poll past them fails the test at once
    (a wait that should have ended polls on). Returns the counts read."""
    read: list[int | None] = []

    async def unsettled(self: dlq_pass.Kept, channel: Any) -> int | None:
        assert len(read) < len(counts), f"polled on after {read}"
        read.append(counts[len(read)])
        return read[-1]

    monkeypatch.setattr(dlq_pass.Kept, "_unsettled", unsettled)
    # No deadline in these tests: only the counts end a wait.
    monkeypatch.setattr(dlq_pass, "GIVE_BACK_WAIT_S", 3600.0)
    return read


@pytest.mark.parametrize("count", [LEFT - 1, LEFT])
async def test_a_count_down_to_what_is_left_ends_the_wait_met(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    read = scripted(monkeypatch, [count])
    assert await dlq_pass.Kept()._settled_to(None, LEFT) is True  # type: ignore[arg-type]
    assert read == [count]


async def test_one_above_what_is_left_waits_on_until_it_comes_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts: list[int | None] = [LEFT + 3, LEFT + 2, LEFT + 1, LEFT]
    read = scripted(monkeypatch, counts)
    assert await dlq_pass.Kept()._settled_to(None, LEFT) is True  # type: ignore[arg-type]
    assert read == counts


async def test_the_same_count_again_is_no_rise(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[int | None] = [LEFT + 1, LEFT + 1, LEFT + 1, LEFT]
    read = scripted(monkeypatch, counts)
    assert await dlq_pass.Kept()._settled_to(None, LEFT) is True  # type: ignore[arg-type]
    assert read == counts


async def test_a_count_that_rises_ends_the_wait_unmet_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another client's gets raise the count: the wait ends on the first poll that shows it,
    not at GIVE_BACK_WAIT_S (an hour here)."""
    read = scripted(monkeypatch, [LEFT + 1, LEFT + 2, LEFT])
    assert await dlq_pass.Kept()._settled_to(None, LEFT) is False  # type: ignore[arg-type]
    assert read == [LEFT + 1, LEFT + 2]


async def test_a_rise_after_a_fall_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rise is against the count just before, not the first one."""
    read = scripted(monkeypatch, [LEFT + 5, LEFT + 2, LEFT + 3, LEFT])
    assert await dlq_pass.Kept()._settled_to(None, LEFT) is False  # type: ignore[arg-type]
    assert read == [LEFT + 5, LEFT + 2, LEFT + 3]


async def test_no_count_neither_ends_the_wait_nor_forgets_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader that answered too late gives no count: the wait goes on, and a rise is still
    measured against the last count it had."""
    read = scripted(monkeypatch, [None, LEFT + 1, None, LEFT + 2, LEFT])
    assert await dlq_pass.Kept()._settled_to(None, LEFT) is False  # type: ignore[arg-type]
    assert read == [None, LEFT + 1, None, LEFT + 2]


async def test_no_count_at_all_waits_on_until_one_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[int | None] = [None, None, LEFT]
    read = scripted(monkeypatch, counts)
    assert await dlq_pass.Kept()._settled_to(None, LEFT) is True  # type: ignore[arg-type]
    assert read == counts


class Channel:
    """What a give back uses of a channel: its nacks, recorded."""

    is_closed = False

    def __init__(self) -> None:
        self.nacks: list[tuple[int, bool, bool]] = []

    async def basic_nack(self, tag: int, multiple: bool, requeue: bool) -> None:
        self.nacks.append((tag, multiple, requeue))


async def test_once_a_wait_ends_unmet_the_rest_go_back_without_waiting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another reader holds a message and takes another as the first batch waits: that wait
    ends at the rise, and each later batch costs one round trip (a count asked), never a wait
    of its own (a wait per batch of 16 is minutes for thousands of messages)."""
    size = 3 * dlq_pass.GIVE_BACK_CHUNK
    read = scripted(monkeypatch, [size + 1, size + 2, size + 2, size + 2, size + 2])
    channel = Channel()
    kept = dlq_pass.Kept(queue="dlq", channel=channel)  # type: ignore[arg-type]
    kept.tags = [(index, index + 1) for index in range(size)]
    await kept.give_back()
    chunk = dlq_pass.GIVE_BACK_CHUNK
    assert channel.nacks == [(chunk, True, True), (2 * chunk, True, True), (size, True, True)]
    assert len(read) == 5  # two polls to the rise, then one a batch and one after the last
    warnings = [r for r in caplog.records if "another client reads the DLQ" in r.getMessage()]
    assert len(warnings) == 1
