"""docker-compose.yml, checked without a Docker engine (none runs on this machine).

What is checked: the file against the Compose schema and its variable interpolation, by
Debian's ``docker-compose`` (1.29, which predates the top-level ``name`` key, so that one key is
left out of the copy it reads); every bind-mounted path exists; Prometheus scrapes each service
on the port that service is told to listen on; Grafana's provisioning points at the mounted
dashboards and at the Prometheus service; no password is in an environment variable, every
``*_FILE`` names a secret the service mounts, and deploy/compose/secrets.sh writes them all, in
agreement with each other; every container has limits, and the recorder's memory covers what
it may hold; the retention service's loop runs the command and stops on SIGTERM. What is not:
pulling the images and starting them (``make test-compose`` does).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bulk_recorder.infra.stop_budget import GRACE_MARGIN_S, stop_budget
from settings import Settings
from tests.ops.conftest import COMPOSE, GRAFANA_DIR, PROMETHEUS_DIR, REPO, load_yaml, run_tool
from tests.ops.test_kubernetes import RECORDER_BASELINE_BYTES
from tests.rigs.wait import poll

ENV_EXAMPLE = REPO / ".env.example"
SECRETS_SCRIPT = REPO / "deploy" / "compose" / "secrets.sh"
INITDB = REPO / "deploy" / "postgres" / "initdb" / "10-service-logins.sh"
SECRETS_DIR = "/run/secrets/"
# Variables that may hold a password, a token, or a URL with one in it.
SECRET_LIKE = re.compile(r"PASS|SECRET|TOKEN|_URL$|_KEY$")
COMPOSE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
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
    if _required_variables():  # and it refuses to start without what .env.example asks for
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


def _secret_targets(service: dict[str, Any]) -> dict[str, str]:
    """Where each secret the service mounts appears in it -> the secret's name."""
    found = {}
    for secret in service.get("secrets", []):
        name = secret if isinstance(secret, str) else secret["source"]
        target = name if isinstance(secret, str) else secret.get("target", name)
        found[target if target.startswith("/") else SECRETS_DIR + target] = name
    return found


def _written_secrets(tmp_path: Path) -> Path:
    directory = tmp_path / "secrets"
    subprocess.run(["sh", str(SECRETS_SCRIPT), str(directory)], check=True, capture_output=True)
    return directory


def _default(value: object) -> str:
    """A compose value with its ${VAR:-default} interpolations resolved to the defaults."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def test_no_password_is_in_an_environment_variable() -> None:
    """`docker inspect` and every child process see the environment: passwords are files."""
    leaks = []
    for name, service in _compose()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if key.endswith("_FILE"):
                continue
            text = str(value)
            with_password = re.search(r"://[^/@\s]*:[^@\s]*@", text)
            from_password = re.search(r"\$\{\w*(PASS|SECRET)\w*", text)
            if SECRET_LIKE.search(key) or with_password or from_password:
                leaks.append(f"{name}: {key}={text}")
    assert leaks == []


def test_every_file_variable_names_a_secret_its_service_mounts(tmp_path: Path) -> None:
    compose = _compose()
    declared = compose["secrets"]
    used = set()
    for name, service in compose["services"].items():
        mounted = _secret_targets(service)
        assert set(mounted.values()) <= set(declared), (name, sorted(mounted.values()))
        used |= set(mounted.values())
        for key, value in (service.get("environment") or {}).items():
            if key.endswith("_FILE"):
                assert value in mounted, f"{name}: {key}={value} is not a secret it mounts"
    assert used == set(declared), "a secret no service mounts"
    # The script writes every file the compose file reads, where it reads them by default.
    written = _written_secrets(tmp_path)
    for name, secret in declared.items():
        file = _default(secret["file"])
        assert file.startswith("./secrets/"), (name, file)
        assert (written / file.removeprefix("./secrets/")).is_file(), f"{name}: not written"
    # Each role reads only its own login.
    own = {"recorder": "database-url-recorder", "relay": "database-url-relay"}
    own |= {"api": "database-url-api", "migrate": "database-url-owner"}
    own |= {"retention": "database-url-owner"}
    for role, secret in own.items():
        mounted = _secret_targets(compose["services"][role])
        assert mounted[SECRETS_DIR + "database-url"] == secret, (role, mounted)
        assert not {s for s in mounted.values() if s.startswith("database-url")} - {secret}


def test_the_secrets_agree_with_each_other_and_the_settings(tmp_path: Path) -> None:
    written = _written_secrets(tmp_path)
    read = {path.name: path.read_text().strip() for path in written.iterdir()}
    assert (written.stat().st_mode & 0o777) == 0o700, "the directory is its owner's only"
    urls = {name: value for name, value in read.items() if name.endswith("-url") or "-url-" in name}
    for name, url in urls.items():
        setting = "rabbitmq_url" if name.startswith("rabbitmq") else "database_url"
        Settings.model_validate({setting: url})
    password = {name: re.sub(r"^\w+://[^:]+:([^@]*)@.*", r"\1", url) for name, url in urls.items()}
    assert password["database-url-owner"] == read["postgres-password"]
    conf = dict(line.split(" = ", 1) for line in read["rabbitmq-user.conf"].splitlines())
    assert password["rabbitmq-url"] == conf["default_pass"]
    assert urls["rabbitmq-url"].startswith(f"amqp://{conf['default_user']}:")
    assert len(set(password.values())) == len(password), "one password per login"
    # deploy/postgres/initdb gives each login the password of the URL its service reads.
    (function,) = [line for line in INITDB.read_text().splitlines() if "password_of()" in line]
    for role in ("recorder", "relay", "api"):
        script = function.replace(SECRETS_DIR, f"{written}/") + f"\npassword_of {role}\n"
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
        assert done.stdout.strip() == password[f"database-url-{role}"], role
    # Run again, it keeps what is there (a running database keeps its passwords).
    _written_secrets(tmp_path)
    assert {path.name: path.read_text().strip() for path in written.iterdir()} == read


def _memory(quantity: str) -> int:
    unit = quantity[-1].upper()
    return int(quantity[:-1]) * COMPOSE_UNITS[unit] if unit in COMPOSE_UNITS else int(quantity)


def test_every_container_has_limits_and_the_recorders_memory_covers_what_it_may_hold() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        limits = service.get("deploy", {}).get("resources", {}).get("limits", {})
        assert {"cpus", "memory"} <= set(limits), f"{name} has no cpu and memory limits"
    recorder = services["recorder"]
    env = {k.lower(): _default(v) for k, v in recorder["environment"].items()}
    settings = Settings.model_validate({k: v for k, v in env.items() if k in Settings.model_fields})
    needed = settings.channel_prefetch * settings.bulk_recorder_max_message_bytes
    needed += RECORDER_BASELINE_BYTES
    limit = _memory(recorder["deploy"]["resources"]["limits"]["memory"])
    assert limit >= needed, f"the recorder's {limit / 2**20:.0f} MiB < {needed / 2**20:.0f} MiB"


def test_where_the_alerts_go_is_said() -> None:
    """Without an Alertmanager the rules fire into Prometheus's page only: say so."""
    config = load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    services = _compose()["services"]
    if config.get("alerting"):
        targets = str(config["alerting"])
        assert any(name in targets for name in services), "alerting to no compose service"
        return
    operations = (REPO / "docs" / "operations.md").read_text()
    assert "no Alertmanager runs" in operations
    assert "no Alertmanager runs" in " ".join(
        line.lstrip("# ") for line in COMPOSE.read_text().splitlines()
    )


def test_retention_runs_daily_as_the_owner_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The retention service's shell loop, as compose hands it to ``sh -c`` ($$ is $), with a
    stand-in ``bulk-recorder`` that notes its arguments: it runs ``retention`` at once, then
    sleeps a day, and SIGTERM ends it at once with exit 0 (PID 1 ignores a signal it has no
    handler for: without the trap the container would wait for its SIGKILL)."""
    services = _compose()["services"]
    service = services["retention"]
    assert service["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert service["environment"]["DATABASE_URL_FILE"] == SECRETS_DIR + "database-url"
    assert service["restart"] == "unless-stopped"
    assert service["healthcheck"] == {"disable": True}, "the image's check asks a role's port"
    assert "ports" not in service
    assert "expose" not in service
    assert service["entrypoint"] == ["/bin/sh", "-c"]
    (script,) = service["command"]
    script = script.replace("$$", "$")
    assert "sleep 86400" in script, "once a day"
    stand_in = tmp_path / "bin" / "bulk-recorder"
    stand_in.parent.mkdir()
    runs = tmp_path / "runs"
    stand_in.write_text(f'#!/bin/sh\necho "$*" >> {runs}\n')
    stand_in.chmod(0o755)
    env = {"PATH": f"{stand_in.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    loop = subprocess.Popen(["/bin/sh", "-c", script], env=env)
    try:
        poll(lambda: runs.exists() and runs.read_text() != "", 30, "the first run")
        loop.send_signal(signal.SIGTERM)
        assert loop.wait(timeout=10) == 0
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()
    assert runs.read_text().splitlines() == ["retention"]
