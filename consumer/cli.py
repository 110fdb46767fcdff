"""``bulk-recorder`` console script: the one place that reads the environment.

Sync shell, async core: each command builds the settings once, sets up logging, and runs its
coroutine on uvloop with cleanup in ``finally``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bulk_recorder.exceptions import (
    EXIT_SETTINGS,
    EXIT_TOPOLOGY,
    EXIT_UNREACHABLE,
    BulkRecorderError,
)
from consumer import healthcheck
from consumer.arguments import (
    DOCS_URL,
    HelpfulParser,
    add_dlq_parser,
    add_load_parsers,
    confirmed,
    documented,
    positive_int,
    positive_seconds,
    role_prefix,
)

# What a command runs (drivers, tracing, pydantic settings) is imported when it runs: the
# health check runs every 10 s in every container and `--help` at a terminal, and neither needs
# it (tests/unit/test_healthcheck_cost.py). Names, for the annotations only:
if TYPE_CHECKING:
    import asyncio

    from settings import Settings

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
    "retention": ("database",),
    "partitions": ("database",),
    "shards": ("broker",),
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
    from consumer.runner import run_async

    return run_async(run_migrate(settings.database_url, role_prefix=args.grant_roles))


def cmd_consume(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.app import Recorder
    from consumer.runner import run_async, with_stop_signals

    async def body(stop: asyncio.Event) -> int:
        await Recorder(settings).run(stop)  # a TopologyMismatch ends it: exit 3, in main()
        return 0

    return run_async(with_stop_signals(body))


def cmd_publish(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.runner import run_async
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
    from consumer.runner import run_async
    from consumer.tools.demo import run_demo

    return run_async(run_demo(settings, count=args.count, via=args.via))


def cmd_dlq(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.runner import run_async
    from consumer.tools.dlq import discard_dlq, inspect_dlq, replay_dlq

    if args.dlq_command == "inspect":
        return run_async(inspect_dlq(settings, samples=args.samples, as_json=args.json))
    if args.dlq_command == "discard":
        confirm = (lambda question: True) if args.yes else confirmed
        return run_async(discard_dlq(settings, args.reason, confirm, samples=args.samples))
    return run_async(
        replay_dlq(
            settings,
            limit=args.limit,
            reason=args.reason,
            dry_run=args.dry_run,
            samples=args.samples,
            as_json=args.json,
        )
    )


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.producer import cmd_api as run_api

    return run_api(settings, args)


def cmd_relay(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.producer import cmd_relay as run_relay

    return run_relay(settings, args)


def cmd_api_key(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.api_keys import cmd_api_key as run_api_key

    return run_api_key(settings, args)


def cmd_outbox(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.tools.outbox import cmd_outbox as run_outbox

    return run_outbox(settings, args)


def cmd_retention(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.tools.retention import cmd_retention as run_retention

    return run_retention(settings, args)


def cmd_partitions(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.tools.partitions import cmd_partitions as run_partitions

    return run_partitions(settings, args)


def cmd_shards(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.tools.shards import cmd_shards as run_shards

    return run_shards(settings, args)


class _BuildVersion(argparse._VersionAction):
    """``--version``: the build is described (its revision asked of git, in a checkout) only
    when the option is given, not by every command that builds the parser."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from bulk_recorder.build import describe

        self.version = f"%(prog)s {describe()}"
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    # the modules whose parsers these are: not imported by the health check, which has its own
    from consumer import api_keys
    from consumer.tools import outbox as outbox_tool
    from consumer.tools import partitions as partitions_tool
    from consumer.tools import retention as retention_tool
    from consumer.tools import shards as shards_tool
    from consumer.tools import tune

    parser: argparse.ArgumentParser = HelpfulParser(
        prog="bulk-recorder",
        description="RabbitMQ -> PostgreSQL bulk recorder. Settings come from the environment.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action=_BuildVersion)
    sub = parser.add_subparsers(dest="command", required=True)
    mig = sub.add_parser("migrate", help="create the database if missing and apply migrations")
    mig.add_argument(
        "--grant-roles",
        metavar="PREFIX",
        type=role_prefix,
        default=None,
        help="then create (if missing) and grant the roles PREFIX_recorder, PREFIX_relay and "
        "PREFIX_api, each with only what its service needs (run as the schema's owner)",
    )
    sub.add_parser("consume", help="run the recorder until SIGTERM/SIGINT")

    add_load_parsers(sub)
    add_dlq_parser(sub)

    sub.add_parser("api", help="serve the ingest API on API_HOST:API_PORT until SIGTERM")
    relay = sub.add_parser("relay", help="publish outbox rows with confirms until SIGTERM")
    relay.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="rows a claim (default: RELAY_BATCH_SIZE, 500)",
    )
    relay.add_argument(
        "--lanes",
        type=positive_int,
        default=None,
        help="concurrent batches (default: RELAY_LANES, 2)",
    )
    relay.add_argument(
        "--poll-interval",
        type=positive_seconds,
        default=None,
        help="seconds between polls without NOTIFY (default: RELAY_POLL_INTERVAL_S, 1.0)",
    )
    api_keys.add_parser(sub)
    outbox_tool.add_parser(sub)
    retention_tool.add_parser(sub)
    partitions_tool.add_parser(sub)
    shards_tool.add_parser(sub)
    tune.add_parser(sub)
    healthcheck.add_parser(sub)
    documented(parser)
    return parser


EPILOG = f"""example:
  bulk-recorder migrate && bulk-recorder consume   # the tables, then record until SIGTERM
  bulk-recorder dlq inspect                        # what was dead-lettered, and why

Each command's --help says what it does. Settings come from the environment: docs/settings.md; \
commands, exit codes, queues and metrics: docs/reference.md. Documentation: {DOCS_URL}"""


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "migrate": cmd_migrate,
    "consume": cmd_consume,
    "publish": cmd_publish,
    "demo": cmd_demo,
    "dlq": cmd_dlq,
    "api": cmd_api,
    "relay": cmd_relay,
    "api-key": cmd_api_key,
    "outbox": cmd_outbox,
    "retention": cmd_retention,
    "partitions": cmd_partitions,
    "shards": cmd_shards,
}


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if not words:  # nothing asked: the help, as a usage error (on stderr, exit 2)
        build_parser().print_help(sys.stderr)
        return EXIT_SETTINGS
    if words[:1] == ["healthcheck"]:  # its own parser, the standard library only: exit 0 or 1
        parser = HelpfulParser(prog="bulk-recorder")
        healthcheck.add_parser(parser.add_subparsers(dest="command", required=True))
        documented(parser)
        return healthcheck.cmd_healthcheck(parser.parse_args(words), os.environ)
    args = build_parser().parse_args(words)
    try:
        if args.command == "tune":  # reads only the URLs it is given: no settings needed
            from consumer.tools.tune import cmd_tune

            return cmd_tune(args)
        return _run(args)
    except BulkRecorderError as exc:  # by class: each carries its exit code
        from bulk_recorder.masking import masked

        logging.getLogger(__name__).debug("%s failed", args.command, exc_info=True)
        print(f"bulk-recorder {args.command}: {masked(str(exc))}", file=sys.stderr)
        return exc.exit_code


def _run(args: argparse.Namespace) -> int:
    from bulk_recorder.build import describe
    from bulk_recorder.infra import tracing
    from bulk_recorder.infra.logs import setup_logging
    from bulk_recorder.infra.reach import Unreachable, check_services, check_tls
    from bulk_recorder.unknown_settings import warn_unknown_settings
    from consumer.failures import failure_line
    from consumer.runner import run_async
    from consumer.tools.local_only import LOAD_COMMANDS, refuse_remote_targets
    from settings import load_settings

    settings = load_settings()
    setup_logging(settings.log_level, settings.log_format)
    warn_unknown_settings(os.environ)  # a misspelt variable: one line naming the real one
    if args.command in LOAD_COMMANDS and not args.allow_remote:
        refuse_remote_targets(args.command, settings)  # before anything is reached
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
    if args.command in LONG_RUNNING_NEEDS:  # a role's first line, once its start-up checks
        # passed (a refusal is one line); a one-shot command's output stays its own
        logging.getLogger(__name__).info("bulk-recorder %s: %s", describe(), args.command)
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
