"""docker-compose.yml, checked without a Docker engine (none runs on this machine).

What is checked: the file against the Compose schema and its variable interpolation, by
Debian's ``docker-compose`` (1.29, which predates the top-level ``name`` key, so that one key is
left out of the copy it reads); every bind-mounted path exists; Prometheus scrapes each service
on the port that service is told to listen on; Grafana's provisioning points at the mounted
dashboards and at the Prometheus service. What is not: pulling the images and starting them.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bulk_recorder.infra.stop_budget import GRACE_MARGIN_S, stop_budget
from settings import Settings
from tests.ops.conftest import COMPOSE, GRAFANA_DIR, PROMETHEUS_DIR, REPO, load_yaml, run_tool

ENV_EXAMPLE = REPO / ".env.example"
INSTALL_HINT = "apt-get install -y docker-compose (Debian's; .ci/run does it when missing)"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE)
    return data


def _required_variables() -> set[str]:
    return set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path, for each bind mount (a named volume is not a path)."""
    mounts: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (REPO / source).resolve()
    return mounts


def test_compose_file_passes_docker_compose_config(tmp_path: Path) -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.fail(f"docker-compose is not installed: {INSTALL_HINT}")
    data = _compose()
    assert data.pop("name") == "bulk-recorder"
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    env.update({name: "not-a-secret" for name in _required_variables()})
    empty_env_file = tmp_path / "empty.env"  # never a developer's .env
    empty_env_file.write_text("")
    argv = [tool, "--project-directory", str(REPO), "--env-file", str(empty_env_file)]
    done = run_tool(*argv, "-f", str(copy), "config", "-q", env=env)
    assert done.ok, done.output
    # And it refuses to start without the passwords .env.example asks for.
    bare = {k: v for k, v in env.items() if k not in _required_variables()}
    refused = run_tool(*argv, "-f", str(copy), "config", "-q", env=bare)
    assert not refused.ok, refused.output
    assert "in .env" in refused.output, refused.output


def test_every_required_variable_is_in_env_example() -> None:
    example = set(re.findall(r"^(\w+)=", ENV_EXAMPLE.read_text(), re.MULTILINE))
    missing = sorted(_required_variables() - example)
    assert not missing, f"docker-compose.yml requires {missing}; add them to .env.example"


def test_the_whole_pipeline_is_in_compose() -> None:
    services = _compose()["services"]
    expected = {"api", "relay", "recorder", "rabbitmq", "postgres", "prometheus", "grafana"}
    assert expected <= set(services), sorted(services)
    commands = {name: services[name].get("command") for name in ("api", "relay", "recorder")}
    assert commands == {"api": ["api"], "relay": ["relay"], "recorder": ["consume"]}
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_every_bind_mount_exists() -> None:
    for name, service in _compose()["services"].items():
        for target, source in _bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
            assert source.is_relative_to(REPO), f"{name}: mounts {source} from outside the repo"
        if "build" in service:
            assert (REPO / service["build"] / "Dockerfile").is_file(), name


def test_prometheus_scrapes_each_role_on_the_port_compose_gives_it() -> None:
    services = _compose()["services"]
    mounts = _bind_mounts(services["prometheus"])
    assert mounts["/etc/prometheus"] == PROMETHEUS_DIR
    config = load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS_DIR / rule_file).is_file(), rule_file
    port_setting = {"recorder": "METRICS_PORT", "relay": "METRICS_PORT", "api": "API_PORT"}
    for job in config["scrape_configs"]:
        (sd,) = job["dns_sd_configs"]
        (service_name,) = sd["names"]
        assert service_name == job["job_name"], job
        environment = services[service_name]["environment"]
        assert str(sd["port"]) == str(environment[port_setting[service_name]]), (
            f"Prometheus scrapes {service_name} on {sd['port']}, compose gives "
            f"{port_setting[service_name]}={environment[port_setting[service_name]]}"
        )
    assert {job["job_name"] for job in config["scrape_configs"]} == set(port_setting)


def test_grafana_provisions_the_dashboard_and_the_prometheus_service() -> None:
    services = _compose()["services"]
    mounts = _bind_mounts(services["grafana"])
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning == GRAFANA_DIR / "provisioning"
    (provider,) = load_yaml(provisioning / "dashboards" / "bulk-recorder.yml")["providers"]
    dashboards = mounts[provider["options"]["path"]]
    assert (dashboards / "bulk-recorder.json").is_file()
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dashboards / Path(home).name).is_file(), home
    assert home.startswith(provider["options"]["path"]), home
    (source,) = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    url = urlsplit(source["url"])
    assert (url.hostname, url.port) == ("prometheus", 9090), source["url"]
    assert any(p.endswith(":9090") for p in services["prometheus"]["ports"])


def test_the_stop_grace_period_follows_from_the_stop_budget() -> None:
    """Each role's stop_grace_period is its stop budget, from the environment compose gives it,
    plus the margin: never shorter (a SIGKILLed stop), at most 5 s longer."""
    services = _compose()["services"]
    for service, role in (("recorder", "consume"), ("relay", "relay"), ("api", "api")):
        env = services[service].get("environment", {})
        values = {
            name.lower(): value
            for name, value in env.items()
            if name.lower() in Settings.model_fields and "${" not in str(value)
        }
        budget = stop_budget(role, Settings.model_validate(values))  # type: ignore[arg-type]
        grace = services[service]["stop_grace_period"]
        assert grace.endswith("s"), grace
        needed = budget.grace_period_s()
        assert needed <= int(grace[:-1]) <= needed + 5, (
            f"{service}: stopped by SIGKILL {grace} after SIGTERM; {budget.describe()} + margin"
            f" {GRACE_MARGIN_S:g} s = {needed} s"
        )
