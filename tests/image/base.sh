#!/usr/bin/env bash
# The stand-in for the Dockerfile's base image, built from Debian's packages where no container
# registry is reachable: Debian 12 (bookworm) minbase with its Python 3.11 (python3, the venv
# module, `python` as a name for python3, the CA certificates, and Python's headers, which the
# official image has and the build compiles against), tagged as the name the Dockerfile starts
# from, so that the Dockerfile is built unchanged. Skipped when that image exists already with
# the headers (one built before they were added is built again).
# Usage: base.sh [IMAGE]   (default: the Dockerfile's ARG PYTHON_IMAGE, e.g.
#                            python:3.11.13-slim-bookworm, under podman's name for it,
#                            docker.io/library/python:3.11.13-slim-bookworm)
set -euo pipefail
default=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$(dirname "$0")/../../Dockerfile")
[[ -n $default ]] || { echo "base.sh: no ARG PYTHON_IMAGE=... in the Dockerfile" >&2; exit 1; }
image=${1:-docker.io/library/$default}
headers=/usr/include/python3.11/Python.h
if podman image exists "$image"; then
  if podman run --rm --network none "$image" test -f "$headers"; then
    echo "stand-in base $image: already built"
    exit 0
  fi
  echo "stand-in base $image: built without Python's headers; building it again"
  podman rmi --force "$image" >/dev/null
fi
# The Debian mirror the machine's own apt uses (deb822 or one-line sources).
mirror=$(
  { grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
    grep -h -m1 -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}'; } |
    grep -v -- '-security' | head -n1
) || true
[[ -n $mirror ]] || { echo "base.sh: no Debian mirror in /etc/apt/sources*" >&2; exit 1; }
root=$(mktemp -d /var/tmp/bulk-recorder-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "stand-in base $image: debootstrap bookworm (minbase + python3.11)"
debootstrap --variant=minbase \
  --include=python3,python3-venv,python-is-python3,ca-certificates,netbase,libpython3.11-dev \
  bookworm "$root/rootfs" "$mirror" >"$root/debootstrap.log" 2>&1 ||
  { tail -n 20 "$root/debootstrap.log" >&2; exit 1; }
# What the real slim image leaves out too: apt's lists, docs, man pages.
rm -rf "$root"/rootfs/var/lib/apt/lists/* "$root"/rootfs/var/cache/apt/*.bin \
  "$root"/rootfs/usr/share/doc/* "$root"/rootfs/usr/share/man/*
tar -C "$root/rootfs" -c . | podman import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$image" >/dev/null
echo "stand-in base $image: built ($(podman run --rm --network none "$image" python --version))"
