"""Every package the service imports is declared, and every declared range is bounded.

aio-pika 9.4 (admitted by an old ``>=9.4`` range) brings aiormq 6.8, on which the recorder's
broker loop failed on ``Connection.closed()``: 52 reconnects in 6 s, never ready.
So the ranges start at the versions CI tests and stop before the next release that could change
what we rely on; the lock file pins the exact versions.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"bulk_recorder", "consumer", "settings", "tests", "benchmarks"}
SERVICE_CODE = ["bulk_recorder", "consumer", "settings.py"]


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(text) for text in project["dependencies"]]
    return {_canonical(r.name): r for r in requirements}


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def _imported_modules() -> dict[str, set[str]]:
    """Top-level module -> files importing it, for every import in the service's code."""
    found: dict[str, set[str]] = {}
    files: list[Path] = []
    for entry in SERVICE_CODE:
        path = REPO / entry
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    for file in files:
        tree = ast.parse(file.read_text(), filename=str(file))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(file.relative_to(REPO)))
    return found


def test_every_imported_package_is_declared() -> None:
    declared = _declared()
    owners = packages_distributions()
    missing: list[str] = []
    for module, files in sorted(_imported_modules().items()):
        if module in FIRST_PARTY or module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = {_canonical(d) for d in owners.get(module, [])}
        assert dists, f"no installed distribution provides {module!r} (imported in {files})"
        if not dists & declared.keys():
            missing.append(f"{module} ({', '.join(sorted(dists))}) imported in {sorted(files)}")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_every_declared_range_is_bounded_and_admits_what_ci_tests() -> None:
    for name, requirement in _declared().items():
        operators = {spec.operator for spec in requirement.specifier}
        assert operators & {">=", "==", "~="}, f"{name}: no lower bound ({requirement})"
        assert operators & {"<", "<=", "==", "~="}, f"{name}: no upper bound ({requirement})"
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        installed = version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{name} {installed} is installed but {requirement} excludes it"
        )


def test_the_client_library_has_what_the_reconnect_loops_need() -> None:
    """The symptom of the old range, checked where it starts: ``Connection.closed()``."""
    import aio_pika

    assert callable(getattr(aio_pika.Connection, "closed", None)), (
        f"aio-pika {version('aio-pika')} (aiormq {version('aiormq')}) has no "
        "Connection.closed(); the broker loops of the recorder and the relay wait on it"
    )


def _locked(name: str) -> dict[str, str]:
    """package -> exact version of a lock file; every pin must carry a hash."""
    pins: dict[str, str] = {}
    lines = (REPO / name).read_text().splitlines()
    for number, line in enumerate(lines):
        if not line or line.startswith((" ", "#")):
            continue
        requirement = Requirement(line.rstrip(" \\"))
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{name}: {line} is not an exact pin"
        assert "--hash=sha256:" in lines[number + 1], f"{name}: {line} has no hash"
        pins[_canonical(requirement.name)] = spec.version
    return pins


def test_the_lock_files_pin_every_dependency_in_its_range_and_are_what_is_installed() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = _locked("requirements.lock")
    dev = _locked("requirements-dev.lock")
    for lock, texts in (
        (runtime, project["dependencies"]),
        (dev, project["dependencies"] + project["optional-dependencies"]["dev"]),
    ):
        for text in texts:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            name = _canonical(requirement.name)
            assert name in lock, f"{name} is declared but not locked: run make lock"
            assert requirement.specifier.contains(lock[name], prereleases=True), (
                f"{name}=={lock[name]} is locked but pyproject asks {requirement}: run make lock"
            )
    for name, pinned in runtime.items():
        assert dev.get(name) == pinned, f"{name}: the two lock files disagree"
    stale = {n: (v, version(n)) for n, v in dev.items() if version(n) != v}
    assert not stale, f"installed versions differ from requirements-dev.lock: {stale}"


def test_installs_go_through_the_locks_with_hashes() -> None:
    makefile = (REPO / "Makefile").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "--require-hashes -r requirements-dev.lock" in makefile
    assert "--require-hashes -r requirements.lock" in makefile
    # the installer itself comes pinned, with its hashes checked by pip
    assert "--require-hashes -r requirements-uv.lock" in makefile
    assert list(_locked("requirements-uv.lock")) == ["uv"]
    assert "--no-deps -e ." in makefile
    assert "--require-hashes -r requirements.lock" in dockerfile
    assert "pip install --no-deps ." in dockerfile


def test_the_build_compiles_with_the_locked_versions() -> None:
    """setup.py compiles the record rules with mypyc, which type-checks them against msgspec:
    the build pins both to the versions the locks install, so the compiled modules are built by
    the mypy `make lint` runs, against the msgspec the service imports."""
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    pins = {_canonical(r.name): r for r in map(Requirement, build)}
    locked = {"mypy": _locked("requirements-dev.lock"), "msgspec": _locked("requirements.lock")}
    for name, lock in locked.items():
        assert name in pins, f"{name} is not a build requirement"
        assert str(pins[name].specifier) == f"=={lock[name]}", (
            f"the build pins {pins[name]}, the lock {name}=={lock[name]}"
        )
