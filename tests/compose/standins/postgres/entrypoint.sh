#!/bin/sh
# First start: initdb with POSTGRES_PASSWORD for the superuser postgres (password needed from
# other hosts, trust on the local socket, as the official image), then POSTGRES_DB.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres initdb -D "$PGDATA" -U postgres --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
    as_postgres postgres --single -D "$PGDATA" postgres >/dev/null <<SQL
CREATE DATABASE "$POSTGRES_DB";
SQL
  fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
  postgres -D "$PGDATA" -c listen_addresses='*'
