"""`bulk-recorder healthcheck`: one health check for every role, on that role's own port.

The image's HEALTHCHECK used to probe 127.0.0.1:9464 whatever the role, so an `api` container,
or a relay with its own METRICS_PORT, was reported unhealthy while it served (and a check on a
host network could be answered by some other process on 9464). The subcommand finds the role of
the process it checks and asks that role's /healthz (alive; /readyz with --ready), from the
settings the role resolves.

Here against real `consume`, `relay` and `api` processes on ports chosen by the test (never the
defaults, which other processes on this host may hold); tests/image runs the same check inside
the image.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer.healthcheck import role_of
from settings import Settings
from tests.conftest import REPO, SettingsFactory, free_port, run_cli, settings_env, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


@contextlib.contextmanager
def _running(
    command: str, env: dict[str, str], log: Path, argv: list[str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The role ``command`` as ``python -m consumer.cli COMMAND``, or started by ``argv``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv or [sys.executable, "-m", "consumer.cli", command],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _role_env(settings: Settings, role: str, port: int) -> dict[str, str]:
    """The role's environment with its own port set explicitly, and the other port unset."""
    env = settings_env(settings)
    env.pop("METRICS_PORT", None)
    env.pop("API_PORT", None)
    env["API_PORT" if role == "api" else "METRICS_PORT"] = str(port)
    return env


def _healthcheck(env: dict[str, str], pid: int, *extra: str) -> tuple[int, str]:
    done = run_cli(["healthcheck", "--pid", str(pid), *extra], env, timeout=30)
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.mark.parametrize("role", ["consume", "relay", "api"])
async def test_healthcheck_is_healthy_on_the_roles_own_port_and_unhealthy_when_it_stops(
    make_settings: SettingsFactory, tmp_path: Path, role: str
) -> None:
    if role != "consume":  # the API and the relay need the schema; the recorder makes it
        assert run_cli(["migrate"], settings_env(make_settings())).returncode == 0
    port = free_port()
    env = _role_env(make_settings(metrics_port=None), role, port)
    with _running(role, env, tmp_path / f"{role}.log") as proc:
        results: list[tuple[int, str]] = []

        def healthy() -> bool:
            assert proc.poll() is None, (tmp_path / f"{role}.log").read_text()
            results.append(_healthcheck(env, proc.pid))
            return results[-1][0] == 0

        await wait_for(healthy, timeout=60, interval=0.5)
        code, line = results[-1]
        assert f":{port}/healthz answered 200" in line, line
        assert line.startswith(f"healthy: {role} "), line
        # Alive comes first (the port answers before the broker and the database are reached):
        # readiness is waited for, then its line checked.
        ready: list[tuple[int, str]] = []

        def is_ready() -> bool:
            assert proc.poll() is None, (tmp_path / f"{role}.log").read_text()
            ready.append(_healthcheck(env, proc.pid, "--ready"))
            return ready[-1][0] == 0

        await wait_for(is_ready, timeout=60, interval=0.5)
        assert f":{port}/readyz answered 200" in ready[-1][1], ready[-1][1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    code, line = _healthcheck(env, proc.pid)
    assert code == 1, line


@pytest.mark.parametrize("role", ["consume", "relay", "api"])
async def test_healthcheck_is_healthy_while_the_role_is_alive_but_not_ready(
    make_settings: SettingsFactory, tmp_path: Path, role: str
) -> None:
    """The role is up and answers on its port, but what it needs is refused. Health is
    liveness: exit 0, so a database or broker outage never marks every container unhealthy (and
    Swarm or an autoheal never replaces them). With --ready: exit 1, and the line says what
    /readyz answered (503), not that nothing listens."""
    nowhere = free_port()  # nothing listens there: the broker (or the database) is refused
    if role == "api":
        broken = make_settings(
            metrics_port=None, database_url=f"postgresql://postgres@127.0.0.1:{nowhere}/x"
        )
    else:
        broken = make_settings(
            metrics_port=None, rabbitmq_url=f"amqp://guest:guest@127.0.0.1:{nowhere}/"
        )
    while (port := free_port()) == nowhere:
        pass
    env = _role_env(broken, role, port)
    with _running(role, env, tmp_path / f"{role}.log") as proc:
        results: list[tuple[int, str]] = []

        def answered() -> bool:
            assert proc.poll() is None, (tmp_path / f"{role}.log").read_text()
            results.append(_healthcheck(env, proc.pid, "--ready"))
            return " answered " in results[-1][1]

        await wait_for(answered, timeout=60, interval=0.5)
        alive = _healthcheck(env, proc.pid)
    code, line = results[-1]
    assert code == 1, line
    assert line.startswith(f"unhealthy: {role} "), line
    assert f":{port}/readyz answered 503" in line, line
    code, line = alive
    assert code == 0, line
    assert line.startswith(f"healthy: {role} "), line
    assert f":{port}/healthz answered 200" in line, line


# Every way docs/reference.md gives to start a role: the console script, and `python -m consumer`
# ("the same as `bulk-recorder consume`"), whose command line names no role at all.
_CONSOLE_SCRIPT = str(Path(sys.executable).with_name("bulk-recorder"))


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        ([sys.executable, "-m", "consumer"], "consume"),
        ([_CONSOLE_SCRIPT, "consume"], "consume"),
        ([_CONSOLE_SCRIPT, "relay"], "relay"),
    ],
    ids=["python-m-consumer", "console-script-consume", "console-script-relay"],
)
async def test_healthcheck_is_healthy_for_every_documented_way_to_start_a_role(
    make_settings: SettingsFactory, tmp_path: Path, argv: list[str], role: str
) -> None:
    """A role started as docs/reference.md says is recognised: a container started that way
    is healthy once it serves, never restarted for ever as "runs no bulk-recorder role"."""
    if role != "consume":
        assert run_cli(["migrate"], settings_env(make_settings())).returncode == 0
    port = free_port()
    env = _role_env(make_settings(metrics_port=None), role, port)
    log = tmp_path / f"{role}.log"
    with _running(role, env, log, argv=argv) as proc:
        results: list[tuple[int, str]] = []

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            results.append(_healthcheck(env, proc.pid))
            assert "runs no bulk-recorder role" not in results[-1][1], results[-1][1]
            return results[-1][0] == 0

        await wait_for(healthy, timeout=60, interval=0.5)
    line = results[-1][1]
    assert line.startswith(f"healthy: {role} (pid {proc.pid}) at "), line
    assert f":{port}/" in line, line


def test_healthcheck_of_a_process_that_runs_no_role_is_unhealthy(
    make_settings: SettingsFactory,
) -> None:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as sleeper:
        try:
            code, line = _healthcheck(settings_env(make_settings()), sleeper.pid)
        finally:
            sleeper.kill()
    assert code == 1, line
    assert "runs no bulk-recorder role" in line, line


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["/opt/venv/bin/python", "/opt/venv/bin/bulk-recorder", "relay", "--lanes", "2"], "relay"),
        (["bulk-recorder", "api"], "api"),
        (["python3", "-m", "consumer.cli", "consume"], "consume"),
        (["python3", "-m", "consumer"], "consume"),
        (["/usr/bin/python3.11", "-X", "dev", "-m", "consumer", "--log"], "consume"),
        (["python3", "-mconsumer"], "consume"),
        (["python3", "-m", "consumer.cli"], None),
        (["python3", "-m", "consumer_other"], None),
        (["python3", "/srv/consumer", "relay"], None),
        (["python3", "-c", "import consumer", "-m", "consumer"], None),
        (["bulk-recorder", "migrate", "--grant-roles", "br"], None),
        (["bulk-recorder", "healthcheck"], None),
        (["python3", "-c", "print('consume')"], None),
        (["catatonit", "--", "sleep", "relay"], None),
    ],
)
def test_role_of_reads_the_command_that_follows_the_program(
    argv: list[str], role: str | None
) -> None:
    assert role_of(argv) == role


def test_healthcheck_with_a_bad_setting_is_unhealthy_exit_1_never_2(
    make_settings: SettingsFactory,
) -> None:
    """A container engine reads exit 1 as unhealthy and reserves 2 (the CLI's bad-settings
    code), so the health check turns a bad setting into 1 with one line naming it."""
    env = settings_env(make_settings(), METRICS_PORT="not-a-port")
    code, line = _healthcheck(env, 1)
    assert code == 1, line
    assert line.startswith("unhealthy: invalid settings: METRICS_PORT"), line
