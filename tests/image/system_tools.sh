#!/usr/bin/env bash
# The Debian tools that `make test-image` needs (as tests/system_tools.sh for `make test`):
# podman with runc (crun refuses this machine's hybrid cgroups), netavark (podman's network
# backend) and debootstrap (the stand-in base image, tests/image/base.sh). Missing ones are
# installed where we run as root with apt-get and the package mirror reachable; elsewhere this
# stops at once with one line naming the packages.
set -uo pipefail
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
[[ -x /usr/lib/podman/netavark ]] || command -v netavark >/dev/null 2>&1 || missing+=(netavark)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "make test-image needs Debian packages: ${missing[*]} (as root: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "make test-image: installing Debian packages ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
  >/dev/null 2>&1; then
  echo "make test-image needs Debian packages: ${missing[*]} (apt-get could not install them)" >&2
  exit 1
fi
