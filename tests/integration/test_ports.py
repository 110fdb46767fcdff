"""Every listening command on one host: own default ports, and a taken port is exit 2.

Tried as a new user would: `consume`, `relay` and `api` started side by side with no port
settings. The relay used to die with an OSError traceback because it took the recorder's default
METRICS_PORT. Now each role has its own default (consume 9464, relay 9465; the API serves
/metrics on API_PORT), and a port that is taken stops the command at once with exit code 2 and
one line naming the variable and the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from settings import Settings
from tests.conftest import REPO, SettingsFactory, free_port, run_cli, settings_env, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

PORT_VARIABLES = ("METRICS_PORT", "API_PORT")


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    """The settings' environment with no port variable unless given in ``extra``."""
    env = settings_env(settings)
    for name in PORT_VARIABLES:
        env.pop(name, None)
    env.update(extra)
    return env


@contextlib.contextmanager
def _occupied() -> Iterator[int]:
    """A port held by a listening socket of the test's own."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("command", "variable"),
    [("consume", "METRICS_PORT"), ("relay", "METRICS_PORT"), ("api", "API_PORT")],
)
def test_a_taken_port_is_exit_2_with_one_line_naming_it(
    make_settings: SettingsFactory, command: str, variable: str
) -> None:
    with _occupied() as port:
        done = run_cli([command], _env(make_settings(), **{variable: str(port)}))
    code, output = done.returncode, done.stdout + done.stderr
    assert code == 2, output
    assert "Traceback" not in output, output
    problem = [line for line in output.splitlines() if variable in line]
    assert len(problem) == 1, output
    assert str(port) in problem[0], output
    assert "in use" in problem[0], output


class _Process:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def _started(command: str, env: dict[str, str], log: Path) -> AsyncIterator[_Process]:
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "consumer.cli",
            command,
            cwd=REPO,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        yield _Process(proc, log)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _answers(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            return (await client.get(url)).status_code == 200
    except httpx.HTTPError:
        return False


# Not exclusive: the test faults nothing and times nothing, it only needs these three ports to
# itself. The suite's other roles run with METRICS_PORT=0 or a free port and a free API_PORT
# (the partitions' API binds 8080 in a namespace of its own), so only this test binds them.
@pytest.mark.fixed_ports(9464, 9465, 8080, reason="the roles' default ports")
async def test_consume_relay_and_api_run_side_by_side_with_default_ports(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    defaults = {"consume": 9464, "relay": 9465, "api": 8080}
    busy = []
    for port in defaults.values():
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    assert not busy, f"default ports {busy} are taken on this host before the test started"
    env = _env(make_settings())
    # A second recorder on the same host needs one variable: its own METRICS_PORT.
    second = free_port()
    ports = {**defaults, "consume-2": second}
    async with contextlib.AsyncExitStack() as stack:
        procs = {
            name: await stack.enter_async_context(
                _started(
                    name.split("-")[0],
                    {**env, "METRICS_PORT": str(second)} if name == "consume-2" else env,
                    tmp_path / f"{name}.log",
                )
            )
            for name in ports
        }
        for command, port in ports.items():
            url = f"http://127.0.0.1:{port}/healthz"
            proc = procs[command].proc

            async def up(url: str = url, proc: asyncio.subprocess.Process = proc) -> bool:
                return proc.returncode is not None or await _answers(url)

            await wait_for(up, timeout=60)
            assert proc.returncode is None, f"{command} exited:\n{procs[command].text()}"
        for command, port in ports.items():
            assert await _answers(f"http://127.0.0.1:{port}/metrics"), command
        codes = {}
        for command, process in procs.items():
            process.proc.send_signal(signal.SIGTERM)
            codes[command] = await asyncio.wait_for(process.proc.wait(), 60)
        logs = {c: p.text() for c, p in procs.items()}
    assert codes == dict.fromkeys(ports, 0), logs
    for command, text in logs.items():
        assert "Traceback" not in text, f"{command}:\n{text}"
