#!/usr/bin/env bash
# The Debian packages a make target needs besides Python, installed where they are missing:
#   tests/system_tools.sh TARGET PACKAGE=PROBE[|PROBE...] ...
# A package is present when one of its probes is (a command on PATH, or an executable path).
# Missing ones are installed where we run as root with apt-get and the package mirror
# reachable; elsewhere this stops at once with one line naming the packages.
#
# make test: promtool and prometheus (tests/ops/test_alerts.py, test_prometheus_live.py),
# docker-compose (tests/ops/test_compose.py validates docker-compose.yml without a Docker engine)
# chromium (test_docs_offline.py renders /docs), nft and ip (tests/partitions: hosts in network
# namespaces, partitions by nftables drop rules inside them), gcc (the install compiles the
# record rules: setup.py). make test-image and
# make test-compose name theirs in tests/image/run.sh and tests/compose/run.sh.
set -uo pipefail
target=$1
shift
present() {
  local probe
  IFS='|' read -ra probes <<<"$1"
  for probe in "${probes[@]}"; do
    if [[ $probe == /* ]]; then [[ -x $probe ]] && return 0; else command -v "$probe" >/dev/null 2>&1 && return 0; fi
  done
  return 1
}
missing=()
for pair in "$@"; do
  package=${pair%%=*}
  present "${pair#*=}" && continue
  [[ " ${missing[*]-} " == *" $package "* ]] || missing+=("$package")
done
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "$target needs Debian packages: ${missing[*]} (as root: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "$target: installing Debian packages ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
  >/dev/null 2>&1; then
  echo "$target needs Debian packages: ${missing[*]} (apt-get could not install them)" >&2
  exit 1
fi
