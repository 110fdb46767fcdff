"""What the demo changes in its recorder's settings: the flush size of a bulk run, said on the
console, and only when the user left it to the default."""

from __future__ import annotations

import pytest

from consumer.tools.demo import DEMO_FLUSH_SIZE, _tuned
from settings import Settings


def test_the_demo_flushes_larger_batches_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(bulk_recorder_size=0)
    assert _tuned(settings) == {"BULK_RECORDER_SIZE": str(DEMO_FLUSH_SIZE)}
    said = capsys.readouterr().out
    assert f"BULK_RECORDER_SIZE={DEMO_FLUSH_SIZE}" in said
    assert f"workers x prefetch = {settings.effective_batch_size}" in said


@pytest.mark.parametrize(
    ("chosen", "size"),
    [({"bulk_recorder_size": 50}, 50), ({"bulk_recorder_enabled": False}, 1)],
)
def test_a_size_the_user_chose_is_kept(
    chosen: dict[str, object], size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(**chosen)  # type: ignore[arg-type]
    assert _tuned(settings) == {}
    assert f"yours (flush size {size})" in capsys.readouterr().out
