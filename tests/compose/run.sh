#!/usr/bin/env bash
# `make test-compose`: the Debian tools and the stand-in base (as make test-image), podman-compose
# from PyPI in its own virtualenv (.venv/compose), the stand-ins for RabbitMQ, PostgreSQL and
# Prometheus built from Debian's packages (tests/compose/standins/, cached layers), then
# tests/compose: docker-compose.yml up with podman-compose and the stand-in override.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tests/image/containers.conf}
# what make test-image needs, and the bridge network's DNS (service names) and NAT for
# published ports
bash tests/system_tools.sh 'make test-compose' podman=podman runc=runc \
  netavark='/usr/lib/podman/netavark|netavark' debootstrap=debootstrap \
  aardvark-dns=/usr/lib/podman/aardvark-dns iptables=iptables
bash tests/image/base.sh
tools=.venv/compose
if [[ ! -x $tools/bin/podman-compose ]]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet podman-compose==1.6.0
fi
base=docker.io/library/$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
for standin in rabbitmq postgres prometheus; do
  podman build --quiet --pull=never --format docker --network host --build-arg "BASE=$base" \
    --tag "localhost/bulk-recorder-standin-$standin:test" "tests/compose/standins/$standin" \
    >/dev/null
done
TEST_COMPOSE=1 PODMAN_COMPOSE=$PWD/$tools/bin/podman-compose \
  exec .venv/bin/pytest -q -p no:cacheprovider -m compose tests/compose "$@"
