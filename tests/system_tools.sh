#!/usr/bin/env bash
# The Debian tools that `make test` needs besides Python: promtool and prometheus
# (tests/ops/test_alerts.py, test_prometheus_live.py), docker-compose (tests/ops/test_compose.py
# validates docker-compose.yml without a Docker engine) and chromium (test_docs_offline.py
# renders /docs). Missing ones are installed where we run as root with apt-get and the package
# mirror reachable; elsewhere this stops at once with one line naming the packages.
set -uo pipefail
missing=()
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "make test needs Debian packages: ${missing[*]} (as root: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "make test: installing Debian packages ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
  >/dev/null 2>&1; then
  echo "make test needs Debian packages: ${missing[*]} (apt-get could not install them)" >&2
  exit 1
fi
