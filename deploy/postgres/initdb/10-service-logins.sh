#!/bin/sh
# Run by the postgres image once, when it creates the database (docker-entrypoint-initdb.d):
# one LOGIN role per service, each a member of one least-privilege role. The roles are made
# NOLOGIN here and granted their privileges by the compose service `migrate`
# (`bulk-recorder migrate --grant-roles bulk`, as the schema's owner), after every upgrade.
set -eu
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" \
  -v recorder_password="$RECORDER_DB_PASSWORD" \
  -v relay_password="$RELAY_DB_PASSWORD" \
  -v api_password="$API_DB_PASSWORD" <<'SQL'
CREATE ROLE bulk_recorder NOLOGIN;
CREATE ROLE bulk_relay NOLOGIN;
CREATE ROLE bulk_api NOLOGIN;
CREATE ROLE recorder_login LOGIN PASSWORD :'recorder_password' IN ROLE bulk_recorder;
CREATE ROLE relay_login LOGIN PASSWORD :'relay_password' IN ROLE bulk_relay;
CREATE ROLE api_login LOGIN PASSWORD :'api_password' IN ROLE bulk_api;
SQL
