"""The CLI's argument parsing: the help formatter that shows every default, the parser that
answers a mistake in the user's words with the sub-command's own usage, the value types of its
options, the parsers of the load generator and the DLQ commands (``consumer.cli`` assembles
them), and the one yes/no question the CLI asks. Only the standard library (and the service's
exit codes) at import time: ``--help`` stays cheap."""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError

SAMPLES_HELP = "sample bodies shown per reason"
ALLOW_REMOTE_HELP = "write test records to a broker or database on another host"
# The project's documentation (the image's org.opencontainers.image.documentation label).
DOCS_URL = "https://github.com/bulk-recorder/bulk-recorder/tree/main/docs"
SETTINGS_EPILOG = (
    "Settings come from the environment: docs/settings.md. Commands, exit codes, queues and "
    f"metrics: docs/reference.md. Documentation: {DOCS_URL}"
)

# A check of a parsed sub-command's options together: the problem in words, or None.
Check = Callable[[argparse.Namespace], str | None]


class DefaultsShown(argparse.HelpFormatter):
    """Each option's help ends with its default; a flag (default off) or an option whose
    default is None (its help says what happens without it) has none to show. In a description
    or epilog, a paragraph whose lines are indented (an example) is kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        default = action.default
        if text is None or "%(default" in text or "(default:" in text or not action.option_strings:
            return text
        if default is None or isinstance(default, bool) or default == argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            if paragraph.startswith("  ") or "\n  " in paragraph:
                paragraphs.append("\n".join(indent + line for line in paragraph.splitlines()))
            else:  # never a break inside a word: a URL's hyphens stay on their line
                words = " ".join(paragraph.split())
                paragraphs.append(
                    textwrap.fill(
                        words,
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                        break_on_hyphens=False,
                        break_long_words=False,
                    )
                )
        return "\n\n".join(paragraphs)


class HelpfulParser(argparse.ArgumentParser):
    """Every ``--help`` of the CLI shows each option's default (its sub-commands' too: argparse
    builds them with the parser's own class). A mistake is answered by the parser of the
    sub-command it was made in, with that sub-command's usage: an unknown argument, a missing
    sub-command (its choices named in words), options that do not go together (:meth:`check`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)
        self.checks: list[Check] = []

    def check(self, rule: Check) -> None:
        """Refuse, as a usage error of this parser, the options that ``rule`` finds wrong."""
        self.checks.append(rule)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:  # here, not at the top: the usage shown is this sub-command's
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        for rule in self.checks:
            problem = rule(parsed)
            if problem:
                self.error(problem)
        return parsed, extras

    def error(self, message: str) -> Any:  # NoReturn, as argparse's
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and message == (
                f"the following arguments are required: {action.dest}"
            ):
                message = f"a command is needed: {in_words(list(action.choices))}"
        super().error(message)


def in_words(names: list[str]) -> str:
    """``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def documented(parser: argparse.ArgumentParser) -> None:
    """Each sub-command's ``--help`` (nested ones too) says what it does (its one-line help,
    unless it has a description) and where its settings and commands are documented."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, child in action.choices.items():
            if not child.description and helps.get(name):
                text = str(helps[name])
                child.description = text[0].upper() + text[1:] + "."
            child.epilog = child.epilog or SETTINGS_EPILOG
            documented(child)


def add_load_parsers(sub: Any) -> None:
    """``publish`` and ``demo``: generated records, to this machine's services unless told."""
    pub = sub.add_parser("publish", help="load generator: publish records with confirms")
    pub.add_argument(
        "--type",
        choices=("transaction", "credit_annotation", "mixed"),
        default="transaction",
        help="the record type published (mixed: both types)",
    )
    pub.add_argument("--count", type=positive_int, default=10_000, help="valid records")
    pub.add_argument(
        "--duplicates", type=fraction, default=0.0, help="fraction re-published (e.g. 0.05)"
    )
    pub.add_argument(
        "--invalid", type=fraction, default=0.0, help="fraction of extra invalid messages"
    )
    pub.add_argument("--in-flight", type=positive_int, default=1000, help="unconfirmed window")
    pub.add_argument(
        "--seed",
        type=int,
        default=None,
        help="random seed, to publish the same records again (unset: new records)",
    )
    pub.add_argument("--quiet", action="store_true", help="no progress bar")
    pub.add_argument("--allow-remote", action="store_true", help=ALLOW_REMOTE_HELP)

    demo = sub.add_parser("demo", help="the main job end to end, with a checked summary")
    demo.add_argument("--count", type=positive_int, default=300_000, help="records in the job")
    demo.add_argument(
        "--via",
        choices=("queue", "api"),
        default="queue",
        help="queue: published to the exchange; api: posted as an API job, through the relay",
    )
    demo.add_argument("--allow-remote", action="store_true", help=ALLOW_REMOTE_HELP)


def add_dlq_parser(sub: Any) -> None:
    dlq = sub.add_parser("dlq", help="inspect, replay or discard dead letters, by reason")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    ins = dlq_sub.add_parser("inspect", help="counts by reason and sample bodies")
    ins.add_argument("--samples", type=whole_number, default=3, help=SAMPLES_HELP)
    ins.add_argument("--json", action="store_true", help="the same as one JSON document")
    rep = dlq_sub.add_parser("replay", help="move messages back to the main exchange")
    rep.add_argument(
        "--limit", type=positive_int, default=None, help="move at most N messages (unset: all)"
    )
    rep.add_argument("--reason", default=None, help="only this reason group (as inspect prints)")
    rep.add_argument("--dry-run", action="store_true", help="show what would move; move nothing")
    rep.add_argument(
        "--json", action="store_true", help="with --dry-run: the plan as one JSON document"
    )
    rep.add_argument("--samples", type=whole_number, default=3, help=SAMPLES_HELP)
    rep.check(_json_needs_dry_run)
    dis = dlq_sub.add_parser("discard", help="remove the messages of one reason for good")
    dis.add_argument("--reason", required=True, help="the reason group (as inspect prints)")
    dis.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dis.add_argument("--samples", type=whole_number, default=3, help=SAMPLES_HELP)


def _json_needs_dry_run(args: argparse.Namespace) -> str | None:
    if args.json and not args.dry_run:
        return "--json needs --dry-run (it shows a plan)"
    return None


def _whole(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def positive_int(text: str) -> int:
    value = _whole(text)
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return value


def whole_number(text: str) -> int:
    value = _whole(text)
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, got {text!r}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def positive_seconds(text: str) -> float:
    value = _number(text)
    if not value > 0:  # nan too
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def role_prefix(text: str) -> str:
    from bulk_recorder.infra.roles import role_names

    try:
        role_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def fraction(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value <= 1.0:  # nan too
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


class NoTerminal(BulkRecorderError):
    """A question with no terminal to ask it on (a pipe, a script, a job): a usage error."""

    exit_code = EXIT_SETTINGS


def confirmed(question: str) -> bool:
    """Ask on the terminal; anything but y/yes (or no answer at all) is a no. Without a terminal
    on standard input nothing is read: :class:`NoTerminal` says to pass ``--yes``."""
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        asked = question.removesuffix(" [y/N] ").rstrip("?")
        raise NoTerminal(
            f"not done: {asked} needs a yes, and there is no terminal to ask on: pass --yes"
        )
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
