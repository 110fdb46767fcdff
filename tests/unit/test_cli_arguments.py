"""The CLI's value types on their bounds: a count, size or timeout is at least 1 (0 is refused
with exit 2, 1 is taken), and a fraction runs from 0 to 1, both ends included."""

from __future__ import annotations

import pytest

from consumer.cli import build_parser

# Each a count or a bound where 0 would do harm: retention batches of 0 rows never end (a batch
# ends the run only when it deletes fewer rows than its size), a lock timeout of 0 is
# PostgreSQL's "wait for ever", and a window of 0 unconfirmed messages never publishes.
POSITIVE = [
    ("retention", "--batch-size"),
    ("retention", "--lock-timeout-ms"),
    ("publish", "--count"),
    ("publish", "--in-flight"),
    ("demo", "--count"),
]


@pytest.mark.parametrize(("command", "option"), POSITIVE)
def test_a_count_or_timeout_of_0_is_refused_and_1_is_taken(
    capsys: pytest.CaptureFixture[str], command: str, option: str
) -> None:
    parse = build_parser().parse_args
    attribute = option.lstrip("-").replace("-", "_")
    assert getattr(parse([command, option, "1"]), attribute) == 1
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit) as refused:
            parse([command, option, bad])
        assert refused.value.code == 2
        expected = f"argument {option}: expected a whole number of 1 or more, got '{bad}'"
        assert expected in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--duplicates", "--invalid"])
def test_a_fraction_runs_from_0_to_1_both_included(
    capsys: pytest.CaptureFixture[str], option: str
) -> None:
    parse = build_parser().parse_args
    attribute = option.lstrip("-")
    for good in ("0", "1", "0.5"):
        assert getattr(parse(["publish", option, good]), attribute) == float(good)
    for bad in ("-0.01", "1.01"):
        with pytest.raises(SystemExit) as refused:
            parse(["publish", option, bad])
        assert refused.value.code == 2
        assert f"expected a number from 0 to 1, got '{bad}'" in capsys.readouterr().err
