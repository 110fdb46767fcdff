"""The producer-side commands: ``bulk-recorder api`` and ``bulk-recorder relay``.

Both get the settings built once by :func:`consumer.cli.main`. ``api`` runs uvicorn on uvloop
with httptools; uvicorn handles SIGTERM/SIGINT itself (stop accepting, finish requests in
flight within ``BULK_RECORDER_SHUTDOWN_TIMEOUT_S``, run the lifespan shutdown that closes the
pool). ``relay`` runs :class:`bulk_recorder.producer.relay.Relay` until SIGTERM/SIGINT; batches in
flight finish (confirmed and deleted, or rolled back and published again later).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys

from aio_pika.abc import AbstractChannel

from consumer.health import PortUnavailable
from settings import Settings

log = logging.getLogger(__name__)


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from bulk_recorder.producer.api import create_app
    from consumer.runner import run_async

    config = uvicorn.Config(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_config=None,  # keep the service's logging set-up
        access_log=False,  # one line a request would cost more than the request; see /metrics
        server_header=False,
        timeout_graceful_shutdown=int(settings.bulk_recorder_shutdown_timeout_s),
    )
    server = uvicorn.Server(config)
    # Bound here, before uvicorn starts: a taken port is one line naming API_PORT and exit 2
    # (uvicorn would log the OSError and exit 1).
    listener = bind_listener("API_PORT", settings.api_host, settings.api_port)
    # uvicorn re-raises the signal that stopped it once it has shut down; a graceful stop on
    # SIGTERM is a clean exit here (status 0), as for `consume` and `relay`.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _ignore)
    run_async(server.serve(sockets=[listener]))
    if not server.started:
        log.error("the API did not start (see the errors above)")
        return 1
    return 0


def bind_listener(variable: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; :class:`PortUnavailable` names ``variable``."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise PortUnavailable(variable, host, port, exc) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise PortUnavailable(variable, host, port, exc) from None
    sock.set_inheritable(True)
    return sock


def _ignore(signum: int, frame: object) -> None:
    log.debug("signal %d after shutdown ignored", signum)


def cmd_relay(settings: Settings, args: argparse.Namespace) -> int:
    from bulk_recorder.producer.relay import Relay, RelayConfig
    from consumer.health import HealthServer
    from consumer.runner import run_async, with_stop_signals
    from consumer.topology import Topology, declare_or_mismatch

    try:
        default = RelayConfig()
        config = RelayConfig(
            batch_size=default.batch_size if args.batch_size is None else args.batch_size,
            lanes=default.lanes if args.lanes is None else args.lanes,
            poll_interval_s=(
                default.poll_interval_s if args.poll_interval is None else args.poll_interval
            ),
        )
    except ValueError as exc:
        print(f"bulk-recorder relay: {exc}", file=sys.stderr)
        return 2
    topology = Topology.from_settings(settings)

    async def declare(channel: AbstractChannel) -> None:
        await declare_or_mismatch(channel, topology)

    async def body(stop: asyncio.Event) -> int:
        relay = Relay(settings, config=config, declare=declare)
        health: HealthServer | None = None
        if settings.metrics_port:
            health = HealthServer(
                relay.metrics.registry, relay.ready, settings.metrics_host, settings.metrics_port
            )
            await health.start()
        try:
            await relay.run(stop)  # a TopologyMismatch ends it: exit 3, as `consume`
        finally:
            if health is not None:
                await health.stop()
        return 0

    return run_async(with_stop_signals(body))
