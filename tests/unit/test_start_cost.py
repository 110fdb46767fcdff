"""What starting a command loads and runs beyond what it needs (issue 40).

Every role start pays its imports (supervisors restart roles, a failover restarts several, and
the test suite starts a few hundred processes). With tracing off, nothing of the service loads
OpenTelemetry (the API aside: FastAPI imports it itself); it is loaded by
``bulk_recorder.infra.tracing.configure`` when an endpoint is set, and by the helpers that run
when tracing is on. A command other than ``--version`` and the roles' start-up line does not
describe the build, which runs ``git`` twice in a checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# Fresh interpreter: import every module of the service, except the API's package (FastAPI
# loads OpenTelemetry itself); name the first one after which OpenTelemetry is loaded.
_WALK = """
import importlib, json, pathlib, sys
loaded = None
for path in sorted(pathlib.Path().glob("bulk_recorder/**/*.py")) + sorted(
    pathlib.Path().glob("consumer/**/*.py")
):
    name = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
    if name.endswith(".__main__") or name.startswith("bulk_recorder.producer.api"):
        continue
    importlib.import_module(name)
    if "opentelemetry" in sys.modules:
        loaded = name
        break
print(json.dumps(loaded))
"""

# Fresh interpreter: run a command, then say what it loaded and whether it described the build.
_COMMAND = """
import json, sys
from consumer.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
build = sys.modules.get("bulk_recorder.build")
described = build is not None and build.revision.cache_info().misses > 0
otel = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
print(json.dumps({"code": code, "opentelemetry": otel, "described": described}))
"""


def _python(code: str, *argv: str, env: dict[str, str] | None = None) -> object:
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_module_of_the_service_outside_the_api_loads_opentelemetry_when_imported() -> None:
    loaded = _python(_WALK)
    assert loaded is None, f"importing {loaded} loaded opentelemetry with tracing off"


def _no_services() -> dict[str, str]:
    """A command's environment with both services unreachable (port 1 refuses at once) and no
    OTLP endpoint: it fails its start-up check, after the settings, logging and tracing steps."""
    return {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none",
        "RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:1/",
    }


@pytest.mark.parametrize("command", ["migrate", "api-key", "dlq"])
def test_a_one_shot_command_loads_no_opentelemetry_and_runs_no_git(command: str) -> None:
    argv = {"api-key": ["api-key", "list"], "dlq": ["dlq", "inspect"]}.get(command, [command])
    seen = _python(_COMMAND, *argv, env=_no_services())
    assert isinstance(seen, dict)
    assert seen["code"] != 0  # refused: the database is unreachable
    assert seen["opentelemetry"] == [], seen
    assert not seen["described"], f"bulk-recorder {command} described the build (ran git)"


@pytest.mark.parametrize("argv", [["--help"], ["consume", "--help"]], ids=["help", "consume-help"])
def test_help_runs_no_git(argv: list[str]) -> None:
    seen = _python(_COMMAND, *argv)
    assert isinstance(seen, dict)
    assert seen["code"] == 0
    assert not seen["described"]


def test_version_still_describes_the_build() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "consumer.cli", "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("bulk-recorder "), done.stdout
    assert "(revision " in done.stdout


def test_the_suite_does_not_load_the_schemathesis_plugin(pytestconfig: pytest.Config) -> None:
    """Every pytest start loaded schemathesis's plugin (about 1 CPU-s, a third of a start that
    runs one test) though no test uses it: the fuzz run is its CLI, the schema test its
    strategies. ``make mutants`` starts pytest over 300 times."""
    assert not pytestconfig.pluginmanager.has_plugin("schemathesis")


@pytest.mark.parametrize("setting", ["1", ""])
def test_make_runs_python_with_its_bytecode_written_whatever_the_shell_says(setting: str) -> None:
    """PYTHONDONTWRITEBYTECODE=1 in the shell (these machines set it) made every process of
    `make test` and `make mutants` compile the project and the tests again: the Makefile's
    targets write bytecode."""
    probe = "probe:\n\t@$(BIN)/python -c 'import sys; print(sys.dont_write_bytecode)'\n"
    done = subprocess.run(
        ["make", "--no-print-directory", "-s", "-f", "Makefile", "-f", "-", "probe"],
        cwd=REPO,
        input=probe,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": setting},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


@pytest.mark.parametrize(
    "module", ["aio_pika", "aiormq", "asyncpg", "pydantic", "prometheus_client"]
)
def test_the_install_compiled_the_dependencies_the_roles_import(module: str) -> None:
    """`make install` has uv compile the runtime dependencies' bytecode (uv does not by
    default): a role's start then compiles none of them (measured: the recorder's imports
    0.61 CPU-s uncompiled, 0.31 compiled; the API's 0.98 and 0.50). The bytecode dates from the
    install, not from a process that compiled it since."""
    installed = REPO / ".venv" / ".runtime"
    if not installed.exists():
        pytest.skip("not installed by make install")
    source = importlib.util.find_spec(module)
    assert source is not None
    assert source.origin is not None
    cached = Path(importlib.util.cache_from_source(source.origin))
    assert cached.exists(), f"{module}: no bytecode at {cached}"
    assert cached.stat().st_mtime <= installed.stat().st_mtime, (
        f"{module}: compiled after the install"
    )
