#!/bin/sh
# The official image's first start: initdb with POSTGRES_PASSWORD(_FILE) for the superuser (password
# from other hosts, trust on the local socket), POSTGRES_DB, then every script of
# /docker-entrypoint-initdb.d (*.sh run, *.sql fed to psql) on a server that listens on the
# socket only; then the server, as postgres, in the foreground.
set -eu
# POSTGRES_PASSWORD, or as the official image, the file POSTGRES_PASSWORD_FILE names.
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
  POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
fi
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE is required}"
export POSTGRES_USER="${POSTGRES_USER:-postgres}" POSTGRES_DB="${POSTGRES_DB:-postgres}"
mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    as_postgres psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -q \
      -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  for script in /docker-entrypoint-initdb.d/*; do
    case "$script" in
      *.sh) echo "running $script"; as_postgres sh "$script" ;;
      *.sql) echo "running $script"
        as_postgres psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -f "$script" ;;
    esac
  done
  as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
  postgres -D "$PGDATA" -c listen_addresses='*'
