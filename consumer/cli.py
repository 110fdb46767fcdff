"""``bulk-recorder`` console script: the one place that reads the environment.

Sync shell, async core: each command builds the settings once, sets up logging, and runs its
coroutine on uvloop with cleanup in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from bulk_recorder.exceptions import (
    EXIT_SETTINGS,
    EXIT_TOPOLOGY,
    EXIT_UNREACHABLE,
    BulkRecorderError,
)
from bulk_recorder.infra import tracing
from bulk_recorder.infra.logs import setup_logging
from bulk_recorder.infra.reach import Unreachable, check_services, check_tls
from consumer import api_keys, healthcheck
from consumer.failures import failure_line
from consumer.producer import cmd_api, cmd_relay
from consumer.runner import run_async, with_stop_signals
from consumer.tools import outbox as outbox_tool
from consumer.tools import tune
from settings import Settings, SettingsError, load_settings

log = logging.getLogger(__name__)

# The exit codes (docs/reference.md); each error class carries its own (bulk_recorder.exceptions).
__all__ = ["EXIT_SETTINGS", "EXIT_TOPOLOGY", "EXIT_UNREACHABLE", "main"]

# The commands that export traces when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set.
TRACED_ROLES = ("consume", "relay", "api")

# What each one-shot command must reach before it starts; long-running commands retry instead.
ONE_SHOT_NEEDS: dict[str, tuple[str, ...]] = {
    "migrate": ("database",),
    "publish": ("broker",),
    "dlq": ("broker",),
    "demo": ("database", "broker"),
    "api-key": ("database",),
    "outbox": ("database",),
}
# Long-running commands wait for a service that is down, but not for a certificate that their
# settings refuse: with TLS configured, they try it once at start-up.
LONG_RUNNING_NEEDS: dict[str, tuple[str, ...]] = {
    "consume": ("database", "broker"),
    "relay": ("database", "broker"),
    "api": ("database",),
}

# -- commands ------------------------------------------------------------------------------


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.migrate_cmd import run_migrate

    return run_async(run_migrate(settings.database_url, role_prefix=args.grant_roles))


def cmd_consume(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.app import Recorder

    async def body(stop: asyncio.Event) -> int:
        await Recorder(settings).run(stop)  # a TopologyMismatch ends it: exit 3, in main()
        return 0

    return run_async(with_stop_signals(body))


def cmd_publish(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.tools.loadgen import LoadSpec, ProgressBar, publish_load

    spec = LoadSpec(
        record_type=args.type,
        count=args.count,
        duplicates=args.duplicates,
        invalid=args.invalid,
        in_flight=args.in_flight,
        seed=args.seed,
    )
    bar = None if args.quiet else ProgressBar("published", spec.total_messages)
    report = run_async(
        publish_load(
            settings.rabbitmq_url,
            settings.rabbitmq_exchange,
            spec,
            progress=bar.update if bar else None,
            declare=_declare(settings),
        )
    )
    if bar:
        bar.close()
    print(report.summary())
    return 0


def _declare(settings: Settings) -> Callable[[Any], Awaitable[None]]:
    from consumer.topology import Topology, declare_topology

    topology = Topology.from_settings(settings)

    async def declare(channel: Any) -> None:
        await declare_topology(channel, topology)

    return declare


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.tools.demo import run_demo

    return run_async(run_demo(settings, count=args.count, via=args.via))


def _confirmed(question: str) -> bool:
    """Ask on the terminal; anything but y/yes (or no answer at all) is a no."""
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_dlq(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.tools.dlq import discard_dlq, inspect_dlq, replay_dlq

    if args.dlq_command == "inspect":
        return run_async(inspect_dlq(settings, samples=args.samples, as_json=args.json))
    if args.dlq_command == "discard":
        confirm = (lambda question: True) if args.yes else _confirmed
        return run_async(discard_dlq(settings, args.reason, confirm, samples=args.samples))
    return run_async(
        replay_dlq(
            settings,
            limit=args.limit,
            reason=args.reason,
            dry_run=args.dry_run,
            samples=args.samples,
        )
    )


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """Exit 0 or 1 only: a container engine reads 1 as unhealthy and reserves 2. The settings
    are not resolved for this command: the check resolves those of the role it checks."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"unhealthy: {exc}")
        return healthcheck.UNHEALTHY
    code, line = healthcheck.check(settings, pid=args.pid, timeout_s=args.timeout)
    print(line)
    return code


def _add_dlq_parser(sub: Any) -> None:
    dlq = sub.add_parser("dlq", help="inspect, replay or discard dead letters, by reason")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    ins = dlq_sub.add_parser("inspect", help="counts by reason and sample bodies")
    ins.add_argument("--samples", type=int, default=3)
    ins.add_argument("--json", action="store_true", help="the same as one JSON document")
    rep = dlq_sub.add_parser("replay", help="move messages back to the main exchange")
    rep.add_argument("--limit", type=_positive_int, default=None)
    rep.add_argument("--reason", default=None, help="only this reason group (as inspect prints)")
    rep.add_argument("--dry-run", action="store_true", help="show what would move; move nothing")
    rep.add_argument("--samples", type=int, default=3)
    dis = dlq_sub.add_parser("discard", help="remove the messages of one reason for good")
    dis.add_argument("--reason", required=True, help="the reason group (as inspect prints)")
    dis.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dis.add_argument("--samples", type=int, default=3)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bulk-recorder",
        description="RabbitMQ -> PostgreSQL bulk recorder. Settings come from the environment.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    mig = sub.add_parser("migrate", help="create the database if missing and apply migrations")
    mig.add_argument(
        "--grant-roles",
        metavar="PREFIX",
        type=_role_prefix,
        default=None,
        help="then create (if missing) and grant the roles PREFIX_recorder, PREFIX_relay and "
        "PREFIX_api, each with only what its service needs (run as the schema's owner)",
    )
    sub.add_parser("consume", help="run the recorder until SIGTERM/SIGINT")

    pub = sub.add_parser("publish", help="load generator: publish records with confirms")
    pub.add_argument(
        "--type", choices=("transaction", "credit_annotation", "mixed"), default="transaction"
    )
    pub.add_argument("--count", type=_positive_int, default=10_000, help="valid records")
    pub.add_argument(
        "--duplicates", type=_fraction, default=0.0, help="fraction re-published (e.g. 0.05)"
    )
    pub.add_argument(
        "--invalid", type=_fraction, default=0.0, help="fraction of extra invalid messages"
    )
    pub.add_argument("--in-flight", type=_positive_int, default=1000, help="unconfirmed window")
    pub.add_argument("--seed", type=int, default=None)
    pub.add_argument("--quiet", action="store_true", help="no progress bar")

    demo = sub.add_parser("demo", help="the main job end to end, with a checked summary")
    demo.add_argument("--count", type=_positive_int, default=300_000)
    demo.add_argument("--via", choices=("queue", "api"), default="queue")

    _add_dlq_parser(sub)

    sub.add_parser("api", help="serve the ingest API on API_HOST:API_PORT until SIGTERM")
    relay = sub.add_parser("relay", help="publish outbox rows with confirms until SIGTERM")
    # no defaults here: RelayConfig's are the relay's (a default of None means "not given")
    relay.add_argument("--batch-size", type=_positive_int, help="rows a claim (500)")
    relay.add_argument("--lanes", type=_positive_int, help="concurrent batches (2)")
    relay.add_argument(
        "--poll-interval", type=float, help="seconds between polls without NOTIFY (1)"
    )
    api_keys.add_parser(sub)
    outbox_tool.add_parser(sub)
    tune.add_parser(sub)
    healthcheck.add_parser(sub)
    return parser


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "migrate": cmd_migrate,
    "consume": cmd_consume,
    "publish": cmd_publish,
    "demo": cmd_demo,
    "dlq": cmd_dlq,
    "api": cmd_api,
    "relay": cmd_relay,
    "api-key": api_keys.cmd_api_key,
    "outbox": outbox_tool.cmd_outbox,
}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _role_prefix(text: str) -> str:
    from bulk_recorder.infra.roles import role_names

    try:
        role_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "healthcheck":
        return cmd_healthcheck(args)
    try:
        if args.command == "tune":  # reads only the URLs it is given: no settings needed
            return tune.cmd_tune(args)
        return _run(args)
    except BulkRecorderError as exc:  # by class: each carries its exit code
        log.debug("%s failed", args.command, exc_info=True)
        print(f"bulk-recorder {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code


def _run(args: argparse.Namespace) -> int:
    settings = load_settings()
    setup_logging(settings.log_level, settings.log_format)
    one_shot = args.command in ONE_SHOT_NEEDS
    needs = ONE_SHOT_NEEDS.get(args.command) or LONG_RUNNING_NEEDS.get(args.command, ())
    if needs:
        check = check_services if one_shot else check_tls
        run_async(
            check(
                database_url=settings.database_url if "database" in needs else None,
                rabbitmq_url=settings.rabbitmq_url if "broker" in needs else None,
            )
        )
    role_settings = settings.for_role(args.command)
    # The long-running roles trace when an OTLP endpoint is set; the provider is built here,
    # from the settings, and flushed at the end (a clean exit or an error).
    traced = args.command in TRACED_ROLES and tracing.configure(role_settings, args.command)
    try:
        return COMMANDS[args.command](role_settings, args)
    except BulkRecorderError:
        raise
    except Exception as exc:  # a driver's: a service refused or dropped a one-shot command
        line = failure_line(exc, needs=needs, settings=settings) if one_shot else None
        if line is None:
            raise
        raise Unreachable(line) from exc
    finally:
        if traced:
            tracing.shutdown()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
