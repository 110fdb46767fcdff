"""Every option of every sub-command says what it does and, where it has one, its default."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from bulk_recorder import __version__
from bulk_recorder.build import revision
from consumer.cli import build_parser


def _parsers(
    parser: argparse.ArgumentParser, path: str = "bulk-recorder"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def _options() -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                yield path, parser, action


def test_every_option_has_help_and_shows_its_default() -> None:
    missing, no_default = [], []
    for path, parser, action in _options():
        name = action.option_strings[-1] if action.option_strings else action.dest
        if not action.help:
            missing.append(f"{path} {name}")
            continue
        default = action.default
        shown = default is None or isinstance(default, bool) or default == argparse.SUPPRESS
        if (
            not shown
            and action.option_strings
            and f"(default: {default})"
            not in (parser.format_help().replace("\n", " ").replace("  ", " "))
        ):
            no_default.append(f"{path} {name} ({default!r})")
    assert missing == [], missing
    assert no_default == [], no_default


def test_the_options_the_issue_named_have_help() -> None:
    helps = {
        (path, a.option_strings[-1] if a.option_strings else a.dest): a.help
        for path, _, a in _options()
    }
    for path, option in [
        ("bulk-recorder demo", "--count"),
        ("bulk-recorder demo", "--via"),
        ("bulk-recorder publish", "--type"),
        ("bulk-recorder publish", "--seed"),
        ("bulk-recorder dlq inspect", "--samples"),
        ("bulk-recorder dlq replay", "--limit"),
        ("bulk-recorder api-key revoke", "name_or_id"),
    ]:
        assert helps[(path, option)], (path, option)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"bulk-recorder {__version__} (revision {revision()})"
