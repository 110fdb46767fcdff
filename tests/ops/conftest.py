"""Shared paths and tools for the deploy/ tests: Debian's ``prometheus`` package gives both
``promtool`` and the ``prometheus`` server (``.ci/run`` installs it when it is missing)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TESTS = PROMETHEUS_DIR / "alerts.test.yml"
GRAFANA_DIR = DEPLOY / "grafana"
COMPOSE = REPO / "docker-compose.yml"
INSTALL_HINT = "apt-get install -y prometheus (Debian's package; .ci/run does it when missing)"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: {INSTALL_HINT}")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return _tool("prometheus")


@dataclass(frozen=True)
class ToolRun:
    ok: bool
    output: str


def run_tool(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> ToolRun:
    """Run a command; its stdout and stderr together, for a failure message."""
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return ToolRun(done.returncode == 0, f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    """Every alerting rule of a rule file, in file order."""
    return [
        rule for group in load_yaml(path)["groups"] for rule in group["rules"] if "alert" in rule
    ]
