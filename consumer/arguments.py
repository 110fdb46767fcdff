"""The CLI's argument parsing: the help formatter that shows every default, the value types
of its options, and the parsers of the load generator and the DLQ commands (``consumer.cli``
assembles them), and the one yes/no question the CLI asks. Only the standard library at import
time: ``--help`` stays cheap."""

from __future__ import annotations

import argparse
from typing import Any

SAMPLES_HELP = "sample bodies shown per reason"
ALLOW_REMOTE_HELP = "write test records to a broker or database on another host"


class DefaultsShown(argparse.HelpFormatter):
    """Each option's help ends with its default; a flag (default off) or an option whose
    default is None (its help says what happens without it) has none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        default = action.default
        if text is None or "%(default" in text or "(default:" in text or not action.option_strings:
            return text
        if default is None or isinstance(default, bool) or default == argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"


class HelpfulParser(argparse.ArgumentParser):
    """Every ``--help`` of the CLI shows each option's default (its sub-commands' too: argparse
    builds them with the parser's own class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)


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
    ins.add_argument("--samples", type=int, default=3, help=SAMPLES_HELP)
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
    rep.add_argument("--samples", type=int, default=3, help=SAMPLES_HELP)
    dis = dlq_sub.add_parser("discard", help="remove the messages of one reason for good")
    dis.add_argument("--reason", required=True, help="the reason group (as inspect prints)")
    dis.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dis.add_argument("--samples", type=int, default=3, help=SAMPLES_HELP)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def role_prefix(text: str) -> str:
    from bulk_recorder.infra.roles import role_names

    try:
        role_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def confirmed(question: str) -> bool:
    """Ask on the terminal; anything but y/yes (or no answer at all) is a no."""
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
