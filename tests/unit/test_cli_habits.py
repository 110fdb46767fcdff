"""The command line by a person's habits (clig.dev): errors in the user's words naming the
option, each sub-command's own usage on a mistake, usage errors before any network, no question
without a terminal, a help that says what a command does and where its settings are."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest

from consumer.cli import build_parser, main
from tests.conftest import REPO, free_port

DOCS = "https://github.com/bulk-recorder/bulk-recorder/tree/main/docs"


def _refused(capsys: pytest.CaptureFixture[str], words: list[str]) -> str:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(words)
    assert done.value.code == 2
    return capsys.readouterr().err


def _cli(*words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consumer.cli", *words],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["publish", "--count", "abc"], "--count: expected a whole number of 1 or more, got 'abc'"),
        (["publish", "--count", "0"], "--count: expected a whole number of 1 or more, got '0'"),
        (["publish", "--count", "2.5"], "--count: expected a whole number of 1 or more, got '2.5'"),
        (["publish", "--invalid", "x"], "--invalid: expected a number from 0 to 1, got 'x'"),
        (["relay", "--lanes", "-1"], "--lanes: expected a whole number of 1 or more, got '-1'"),
    ],
)
def test_a_bad_value_is_refused_in_words_naming_the_option(
    capsys: pytest.CaptureFixture[str], words: list[str], expected: str
) -> None:
    err = _refused(capsys, words)
    assert expected in err
    assert "invalid" not in err.replace("--invalid", "")  # not argparse's "invalid int value"


def test_a_poll_interval_of_0_or_below_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    for bad in ("-1", "0", "abc", "nan", "inf"):
        err = _refused(capsys, ["relay", "--poll-interval", bad])
        assert f"--poll-interval: expected a number of seconds above 0, got '{bad}'" in err
    assert parse(["relay", "--poll-interval", "0.001"]).poll_interval == 0.001
    assert parse(["relay", "--poll-interval", "1"]).poll_interval == 1.0


@pytest.mark.parametrize("command", [["inspect"], ["replay"], ["discard", "--reason", "r"]])
def test_a_negative_number_of_samples_is_refused(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    parse = build_parser().parse_args
    assert parse(["dlq", *command, "--samples", "0"]).samples == 0
    assert parse(["dlq", *command, "--samples", "1"]).samples == 1
    err = _refused(capsys, ["dlq", *command, "--samples", "-1"])
    assert "--samples: expected a whole number of 0 or more, got '-1'" in err


@pytest.mark.parametrize(
    ("words", "choices"),
    [
        (["dlq"], "inspect, replay or discard"),
        (["api-key"], "create, list or revoke"),
    ],
)
def test_a_missing_sub_command_names_the_choices_in_words(
    capsys: pytest.CaptureFixture[str], words: list[str], choices: str
) -> None:
    err = _refused(capsys, words)
    assert f"usage: bulk-recorder {words[0]} " in err
    assert f"a command is needed: {choices}" in err
    assert "_command" not in err


@pytest.mark.parametrize(
    "words", [["consume", "--bogus"], ["dlq", "replay", "--bogus"], ["migrate", "extra"]]
)
def test_an_unknown_argument_shows_the_sub_commands_own_usage(
    capsys: pytest.CaptureFixture[str], words: list[str]
) -> None:
    err = _refused(capsys, words)
    command = " ".join(w for w in words if not w.startswith("-") and w != "extra")
    assert err.startswith(f"usage: bulk-recorder {command} "), err
    assert f"bulk-recorder {command}: error: unrecognized arguments: {words[-1]}" in err


def test_healthcheck_with_an_unknown_option_shows_its_own_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["healthcheck", "--bogus"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: bulk-recorder healthcheck [-h] [--ready]"), err
    assert "bulk-recorder healthcheck: error: unrecognized arguments: --bogus" in err
    assert "{healthcheck}" not in err


def _sub_commands(
    parser: argparse.ArgumentParser, path: str = "bulk-recorder"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.append((f"{path} {name}", child))
                found.extend(_sub_commands(child, f"{path} {name}"))
    return found


def test_each_sub_commands_help_says_what_it_does_and_where_its_settings_are() -> None:
    missing = []
    for path, parser in _sub_commands(build_parser()):
        text = parser.format_help()
        says = parser.description and len(parser.description) > 10
        if not says or "docs/settings.md" not in text or "docs/reference.md" not in text:
            missing.append(path)
    assert missing == []


def test_the_top_level_help_ends_with_an_example_and_the_docs_link() -> None:
    text = build_parser().format_help().rstrip()
    assert text.endswith(DOCS), text[-300:]
    assert "example" in text.lower()
    assert "bulk-recorder migrate && bulk-recorder consume" in text


def test_no_argument_prints_the_help_on_stderr_and_exits_2() -> None:
    done = _cli()
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("usage: bulk-recorder")
    assert DOCS in done.stderr  # the whole help, its commands and the docs link
    assert "migrate" in done.stderr
    assert "healthcheck" in done.stderr


def test_replay_json_without_dry_run_is_a_usage_error_before_the_broker() -> None:
    closed = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    env = {"PATH": "/usr/bin:/bin", "RABBITMQ_URL": closed}
    done = _cli("dlq", "replay", "--json", env=env)
    assert done.returncode == 2, done.stderr
    assert "usage: bulk-recorder dlq replay" in done.stderr
    assert "--json needs --dry-run" in done.stderr
    assert "reach" not in done.stderr
    assert "127.0.0.1" not in done.stderr


def test_no_question_is_asked_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from consumer.arguments import NoTerminal, confirmed

    read: list[str] = []

    class Pipe(io.StringIO):
        def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
            read.append("readline")
            return "y\n"

    monkeypatch.setattr(sys, "stdin", Pipe("y\n"))
    with pytest.raises(NoTerminal, match="pass --yes") as refused:
        confirmed("discard these 3 messages for good? [y/N] ")
    assert refused.value.exit_code == 2
    assert read == []  # no answer was waited for, not even one in the pipe
