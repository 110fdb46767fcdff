"""The README's quick start, run as written: its block between the `<!-- quick-start -->` markers,
in a fresh directory, by bash, with a `docker` on PATH that hands `docker compose ARGS` to
podman-compose with the stand-ins (tests/compose/docker_shim.py).

The one change to the text: the API's published port, 127.0.0.1:8080 in the README (the compose
file's), is the port the test chose, since the machine's other work may hold 8080. The directory
holds the repository's `deploy/` (a link), so `deploy/compose/secrets.sh` writes the secrets
there, as it would in a clone; the project's env file points the compose file at them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.compose.conftest import Pipeline, _health_loop, _remove, _render
from tests.conftest import REPO, wait_for
from tests.image import podman

pytestmark = [pytest.mark.compose]

BLOCK = re.compile(r"<!-- quick-start -->\n```sh\n(.*?)\n```\n<!-- /quick-start -->", re.DOTALL)
README_API = "127.0.0.1:8080"
CHECK = "docker compose exec postgres psql"
TX_ID = "0193a3c4-7c8e-7d3a-9f1e-2b4c6d8e0f12"
ROW = re.compile(rf"^ *{TX_ID} *\| *APPROVED *\| *150\.0+ *\|", re.MULTILINE)


def quick_start() -> str:
    """The README's quick-start block; it must end with the query that shows the row."""
    blocks = BLOCK.findall((REPO / "README.md").read_text())
    assert len(blocks) == 1, "README.md: no block between <!-- quick-start --> markers"
    block = str(blocks[0])
    assert block.splitlines()[-1].startswith(CHECK), block.splitlines()[-1]
    assert README_API in block, f"the quick start's curl does not call {README_API}"
    assert TX_ID in block, f"the quick start's transaction is not {TX_ID}"
    return block


@dataclass
class QuickStart:
    block: str
    pipeline: Pipeline
    workdir: Path
    env: dict[str, str]

    def bash(self, script: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickStart]:
    block = quick_start()  # before anything is started: no block, no run
    where = tmp_path_factory.mktemp("quick-start")
    workdir = where / "clone"
    workdir.mkdir()
    (workdir / "deploy").symlink_to(REPO / "deploy")
    ports = {name: podman.fresh_port() for name in ("rabbitmq", "postgres", "api", "prometheus")}
    override = where / "standins.yml"
    override.write_text(_render(ports))
    env_file = where / ".env"
    env_file.write_text(f"BULK_RECORDER_SECRETS={workdir / 'secrets'}\n")
    project = f"brquick{uuid.uuid4().hex[:8]}"
    pipeline = Pipeline(project, {}, env_file, override, ports)
    shim_dir = where / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "docker"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.compose.docker_shim "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env.update(
        PATH=f"{shim_dir}:{env['PATH']}",
        PYTHONPATH=str(REPO),
        QUICK_START_PROJECT=project,
        QUICK_START_ENV_FILE=str(env_file),
        QUICK_START_OVERRIDE=str(override),
    )
    env.setdefault("CONTAINERS_CONF", str(podman.CONF))
    block = block.replace(README_API, f"127.0.0.1:{ports['api']}")
    stop = threading.Event()
    checker = threading.Thread(target=_health_loop, args=(pipeline, stop), daemon=True)
    checker.start()
    try:
        yield QuickStart(block, pipeline, workdir, env)
    finally:
        stop.set()
        checker.join(120)
        pipeline.compose("down", "-t", "40", timeout=300)
        _remove(project)


@pytest.mark.timeout(1200)  # the block builds the image and starts the pipeline
async def test_the_readme_quick_start_records_its_transaction(quick: QuickStart) -> None:
    ran = quick.bash(quick.block)
    assert ran.returncode == 0, f"{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
    assert f'"{TX_ID}"' in ran.stdout, ran.stdout[-3000:]  # the API's 202 names it
    check = quick.block.splitlines()[-1]
    shown = [ran.stdout]

    def recorded() -> bool:
        """The README's query shows the row: the outbox, the relay and the recorder did."""
        if not ROW.search(shown[-1]):
            again = quick.bash(check, timeout=120)
            assert again.returncode == 0, again.stderr[-2000:]
            shown.append(again.stdout)
        return bool(ROW.search(shown[-1]))

    try:
        await wait_for(recorded, timeout=120, interval=1)
    except AssertionError:
        raise AssertionError(f"not shown by {check!r}:\n{shown[-1]}") from None
