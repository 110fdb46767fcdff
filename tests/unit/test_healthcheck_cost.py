"""What `bulk-recorder healthcheck` costs: it runs every 10 s in every container, for ever.

It used to import the whole CLI (drivers, tracing, pydantic settings: 0.4 s of CPU a run, most
of an idle recorder's CPU). The check and `--help` import only the standard library now, and the
check reads its four settings by the rules of `settings.Settings`, which these tests hold it to.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from consumer.healthcheck import ProbeSettings, ProbeSettingsError, target
from settings import Settings, SettingsError, load_settings
from tests.conftest import REPO

# What a check must not import: the drivers, tracing, the message codec, the settings' pydantic.
HEAVY = (
    "aio_pika",
    "aiormq",
    "asyncpg",
    "opentelemetry",
    "msgspec",
    "pydantic",
    "pydantic_settings",
    "prometheus_client",
    "settings",
    "asyncio",
)

_IMPORTED = """
import json, sys
from consumer.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})), file=sys.stderr)
"""


def _imported(*argv: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after ``bulk-recorder ARGV``."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ("healthcheck", "--pid", "1"),
        ("healthcheck", "--ready", "--pid", "1"),
        ("healthcheck", "--help"),
        ("--help",),
        ("consume", "--help"),
    ],
    ids=["healthcheck", "healthcheck-ready", "healthcheck-help", "help", "consume-help"],
)
def test_the_healthcheck_and_help_import_no_driver_tracing_or_settings_library(
    argv: tuple[str, ...],
) -> None:
    heavy = _imported(*argv).intersection(HEAVY)
    assert not heavy, f"bulk-recorder {' '.join(argv)} imported {sorted(heavy)}"


_ENVIRONMENTS = [
    {},
    {"METRICS_PORT": "9470"},
    {"METRICS_PORT": "0"},
    {"metrics_port": "9471", "api_port": "8181"},  # Settings reads names in any case
    {"METRICS_PORT": " 9472 "},
    {"METRICS_PORT": "9473.0"},
    {"METRICS_PORT": "+9474"},
    {"METRICS_PORT": "9_475"},
    {"METRICS_HOST": "0.0.0.0", "API_HOST": "::", "API_PORT": "65535"},
    {"METRICS_PORT": "9464.5"},
    {"METRICS_PORT": "1e3"},
    {"METRICS_PORT": "65536"},
    {"METRICS_PORT": "-1"},
    {"METRICS_PORT": ""},
    {"METRICS_PORT": "inf"},
    {"METRICS_PORT": "\u0663"},  # an Arabic-Indic digit: int() takes it, pydantic does not
    {"API_PORT": "0"},
    {"API_PORT": "http"},
    {"METRICS_HOST": ""},
    {"API_HOST": ""},
]


@pytest.mark.parametrize("environ", _ENVIRONMENTS, ids=[repr(e) for e in _ENVIRONMENTS])
def test_the_healthcheck_resolves_each_roles_port_as_the_role_does(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same answer as `Settings.for_role` for every role, or refused when the role would
    refuse to start, naming the same variable."""
    for name in ("METRICS_PORT", "METRICS_HOST", "API_PORT", "API_HOST"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    try:
        settings: Settings | None = load_settings()
    except SettingsError as exc:
        settings, refused = None, str(exc)
    if settings is None:
        with pytest.raises(ProbeSettingsError) as caught:
            ProbeSettings.from_environ(environ)
        variable = str(caught.value).split(":")[1].strip()
        assert variable in refused, (caught.value, refused)
        return
    probe = ProbeSettings.from_environ(environ)
    assert probe == ProbeSettings(
        settings.metrics_host, settings.metrics_port, settings.api_host, settings.api_port
    )
    for role in ("consume", "relay", "api"):
        resolved = settings.for_role(role)
        port = resolved.api_port if role == "api" else resolved.metrics_port
        assert target(probe, role)[1] == port, (role, environ)
