"""`docker` for the quick-start test: `docker compose ARGS` as podman-compose runs them here.

tests/compose/test_quick_start.py puts a `docker` script on PATH that runs this module, so that
the README's quick start runs as written. Each command goes to podman-compose with the test's
project, env file (the secrets' directory) and stand-in override (tests/compose/standins.yml),
with three changes that stand in for what Docker's compose does and podman-compose with podman
4.3 does not (tests/compose/conftest.py says why):

- `up -d`: every service of the pipeline but Grafana, in the order of docker-compose.yml's
  depends_on conditions (RabbitMQ and PostgreSQL healthy, then `migrate` to exit 0, then the
  rest), returning once they are healthy;
- `run`: with `--no-deps` (what the service depends on is up already);
- `run` and `exec`: with `-T` when the output is not a terminal, as Docker's compose decides
  by itself (podman-compose allocates a terminal unless told, and `KEY=$(...)` would end in a
  carriage return).

The project comes from the environment: QUICK_START_PROJECT, QUICK_START_ENV_FILE and
QUICK_START_OVERRIDE.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.compose.conftest import Pipeline
from tests.compose.conftest import _wait_healthy as wait_healthy
from tests.image import podman

UP_FLAGS = {"-d", "--detach", "--build"}


def pipeline_from_env() -> Pipeline:
    return Pipeline(
        project=os.environ["QUICK_START_PROJECT"],
        env={},
        env_file=Path(os.environ["QUICK_START_ENV_FILE"]),
        override=Path(os.environ["QUICK_START_OVERRIDE"]),
        ports={},
    )


def up(pipeline: Pipeline) -> None:
    pipeline.up("rabbitmq", "postgres")
    wait_healthy(pipeline, ("rabbitmq", "postgres"))
    pipeline.up("migrate")
    (migrate,) = pipeline.containers("migrate", exited=True)
    code = podman.podman("wait", migrate, timeout=300).stdout.strip()
    assert code == "0", podman.podman("logs", migrate, check=False).stderr[-2000:]
    pipeline.up("recorder", "relay", "api", "prometheus")
    wait_healthy(pipeline, ("recorder", "relay", "api"))


def main(argv: list[str]) -> int:
    if argv[:1] != ["compose"]:
        print(f"docker shim: only `docker compose` is stood in, not {argv[:1]}", file=sys.stderr)
        return 2
    args = argv[1:]
    pipeline = pipeline_from_env()
    if args[:1] == ["up"] and set(args[1:]) <= UP_FLAGS and "-d" in args:
        up(pipeline)
        return 0
    no_tty = [] if sys.stdout.isatty() else ["-T"]
    if args[:1] == ["run"]:
        args = ["run", "--no-deps", *no_tty, *args[1:]]
    elif args[:1] == ["exec"]:
        args = ["exec", *no_tty, *args[1:]]
    done = pipeline.compose(*args)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
