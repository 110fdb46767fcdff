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
from types import FrameType
from typing import TYPE_CHECKING

from aio_pika.abc import AbstractChannel

from consumer.health import PortUnavailable
from settings import Settings

if TYPE_CHECKING:
    from bulk_recorder.producer.relay_batch import RelayConfig

log = logging.getLogger(__name__)


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from bulk_recorder.infra.stop_budget import Deadline, stop_budget
    from bulk_recorder.producer.api import create_app
    from bulk_recorder.producer.api.asgi import uvicorn_loggers
    from consumer.runner import run_async

    class Server(uvicorn.Server):
        """uvicorn's server, starting the stop budget's clock on the signal."""

        def __init__(self, config: uvicorn.Config, deadline: Deadline) -> None:
            super().__init__(config)
            self.deadline = deadline

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            self.deadline.start()
            super().handle_exit(sig, frame)

    budget = stop_budget("api", settings)
    log.info("%s", budget.describe())
    deadline = budget.deadline()
    config = uvicorn.Config(
        create_app(settings, stop_deadline=deadline),
        host=settings.api_host,
        port=settings.api_port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_config=None,  # keep the service's logging set-up; its lines under "uvicorn":
        access_log=False,  # one line a request would cost more than the request; see /metrics
        server_header=False,
        timeout_graceful_shutdown=int(budget.step("requests")),
        # behind a proxy that strips this prefix: uvicorn puts it back in front of each path
        # (as ASGI asks), so /docs, its assets and openapi.json resolve under it
        root_path=settings.api_root_path,
    )
    uvicorn_loggers()
    server = Server(config, deadline)
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


def relay_config(settings: Settings, args: argparse.Namespace) -> RelayConfig:
    """The relay's batch size, lanes and poll interval: an option wins over its RELAY_* setting;
    ``ValueError`` for a value RelayConfig refuses."""
    from bulk_recorder.producer.relay import RelayConfig

    def chosen(option: float | None, setting: float) -> float:
        return setting if option is None else option

    return RelayConfig(
        batch_size=int(chosen(args.batch_size, settings.relay_batch_size)),
        lanes=int(chosen(args.lanes, settings.relay_lanes)),
        poll_interval_s=chosen(args.poll_interval, settings.relay_poll_interval_s),
    )


def cmd_relay(settings: Settings, args: argparse.Namespace) -> int:
    from bulk_recorder.producer.relay import Relay
    from consumer.health import HealthServer
    from consumer.runner import run_async, with_stop_signals
    from consumer.topology import Topology, declare_or_mismatch

    try:
        config = relay_config(settings, args)
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
