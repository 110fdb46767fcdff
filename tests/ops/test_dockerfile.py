"""The Dockerfile, read without building it (`make test-image` builds and runs it).

What is checked: the base image is named once, by its full patch tag, and everything that
builds a stand-in for it (tests/image/base.sh, the compose stand-ins) takes the name from there;
the runtime stage carries the OCI labels with the project's version; and no role is told a port
in the image, so that each listens on its own documented default, which the image exposes.
"""

from __future__ import annotations

import re
import shlex
import tomllib

import bulk_recorder
from settings import DEFAULT_METRICS_PORTS, Settings
from tests.ops.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
# A full patch tag (python:3.11.13-slim-bookworm) or a digest: a tag like 3.11-slim moves.
PINNED = re.compile(
    r"python:3\.\d+\.\d+(-[\w.-]+)?(@sha256:[0-9a-f]{64})?|python@sha256:[0-9a-f]{64}"
)
REQUIRED_LABELS = {
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.version",
    "org.opencontainers.image.base.name",
}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) for each instruction, continuation lines joined, comments dropped."""
    text = DOCKERFILE.read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction:
            found.append((instruction.upper(), rest.strip()))
    return found


def _runtime_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def _pairs(rest: str) -> dict[str, str]:
    return dict(part.partition("=")[::2] for part in shlex.split(rest))


def _global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    found: dict[str, str] = {}
    for name, rest in _instructions():
        if name == "FROM":
            break
        if name == "ARG":
            found.update(_pairs(rest))
    return found


def test_the_base_is_pinned_in_one_place() -> None:
    base = _global_args()["PYTHON_IMAGE"]
    assert PINNED.fullmatch(base), f"{base}: pin a full patch tag or a digest"
    froms = [rest.split()[0] for name, rest in _instructions() if name == "FROM"]
    assert froms, "no FROM"
    assert all(f == "${PYTHON_IMAGE}" for f in froms), froms
    # The stand-ins take the name from the Dockerfile; none spells a python image of its own.
    builders = [
        REPO / "tests/image/base.sh",
        REPO / "tests/compose/run.sh",
        *sorted((REPO / "tests/compose/standins").glob("*/Dockerfile")),
    ]
    for path in builders:
        code = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        named = [line for line in code if re.search(r"python:3\.\d", line)]
        assert not named, f"{path.relative_to(REPO)} names a base: {named}"
    assert "ARG PYTHON_IMAGE=" in (REPO / "tests/image/base.sh").read_text()
    assert "ARG PYTHON_IMAGE=" in (REPO / "tests/compose/run.sh").read_text()


def test_the_image_carries_the_oci_labels_with_the_projects_version() -> None:
    labels: dict[str, str] = {}
    args: dict[str, str] = {}
    for name, rest in _runtime_stage():
        if name == "LABEL":
            labels.update(_pairs(rest))
        elif name == "ARG":
            args.update(_pairs(rest))
    assert set(labels) >= REQUIRED_LABELS, sorted(REQUIRED_LABELS - set(labels))
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.base.name"] == "${PYTHON_IMAGE}"
    # A plain `docker build` (compose's `build: .`) gets the right version too.
    assert args["VERSION"] == bulk_recorder.__version__, "ARG VERSION's default is stale"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.description"] == project["description"]
    # make test-image passes the package's own version.
    run = (REPO / "tests/image/run.sh").read_text()
    assert '--build-arg "VERSION=$version"' in run
    assert "bulk_recorder.__version__" in run


def test_each_role_listens_on_its_own_documented_port_in_the_image() -> None:
    env: dict[str, str] = {}
    exposed: set[int] = set()
    for name, rest in _runtime_stage():
        if name == "ENV":
            env.update(_pairs(rest))
        elif name == "EXPOSE":
            exposed |= {int(port.split("/")[0]) for port in rest.split()}
    told = sorted({"METRICS_PORT", "API_PORT"} & set(env))
    assert not told, f"the image sets {told}: every role would share one port"
    defaults = Settings.model_validate({k.lower(): v for k, v in env.items()})
    ports = {role: defaults.for_role(role).metrics_port for role in DEFAULT_METRICS_PORTS}
    assert ports == DEFAULT_METRICS_PORTS, ports
    assert exposed == {*DEFAULT_METRICS_PORTS.values(), defaults.api_port}, exposed
    # docs/settings.md documents the same per-role defaults.
    (row,) = [
        r
        for r in (REPO / "docs/settings.md").read_text().splitlines()
        if r.startswith("| `METRICS_PORT`")
    ]
    for role, port in DEFAULT_METRICS_PORTS.items():
        assert f"`{role}` `{port}`" in row, (role, port, row)
