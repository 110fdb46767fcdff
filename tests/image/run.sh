#!/usr/bin/env bash
# `make test-image`: the Debian tools, the stand-in base (once), the image, then tests/image.
# The image is built from the Dockerfile unchanged, with --format docker (an OCI image would drop
# the HEALTHCHECK), on the host's network; pip inside the build trusts the machine's CA bundle,
# mounted for the build only (it is in no layer). Prints the build time and the image's size.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tests/image/containers.conf}
image=${TEST_IMAGE:-localhost/bulk-recorder:test}
# podman with runc (crun refuses this machine's hybrid cgroups), netavark (podman's network
# backend) and debootstrap (the stand-in base image, tests/image/base.sh).
bash tests/system_tools.sh 'make test-image' podman=podman runc=runc \
  netavark='/usr/lib/podman/netavark|netavark' debootstrap=debootstrap
bash tests/image/base.sh
ca=/etc/ssl/certs/ca-certificates.crt
mounts=()
[[ -r $ca ]] && mounts=(--volume "$ca:$ca:ro")
started=$(date +%s%N)
version=$(.venv/bin/python -c 'import bulk_recorder; print(bulk_recorder.__version__)')
if ! podman build --quiet --pull=never --format docker --network host "${mounts[@]}" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$(git rev-parse HEAD)" \
  --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --tag "$image" . >/tmp/bulk-recorder-image-build.$$.log 2>&1; then
  tail -n 40 /tmp/bulk-recorder-image-build.$$.log >&2
  rm -f /tmp/bulk-recorder-image-build.$$.log
  exit 1
fi
rm -f /tmp/bulk-recorder-image-build.$$.log
size=$(podman image inspect --format '{{.Size}}' "$image")
took_ms=$((($(date +%s%N) - started) / 1000000))
printf 'image %s: built in %d.%01d s, %d MB\n' "$image" "$((took_ms / 1000))" \
  "$((took_ms % 1000 / 100))" "$((size / 1000000))"
TEST_IMAGE=$image exec .venv/bin/pytest -q -p no:cacheprovider -m image tests/image "$@"
