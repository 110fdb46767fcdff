#!/bin/sh
# Run by the postgres image once, when it creates the database (docker-entrypoint-initdb.d):
# one LOGIN role per service, each a member of one least-privilege role. The roles are made
# NOLOGIN here and granted their privileges by the compose service `migrate`
# (`bulk-recorder migrate --grant-roles bulk`, as the schema's owner), after every upgrade.
# Each login's password is the one in the URL that its service reads: the compose secrets
# database-url-recorder, -relay and -api, mounted here as in the services (never an
# environment variable).
set -eu
password_of() { sed -E 's#^[a-z]+://[^:/@]+:([^@]*)@.*#\1#' "/run/secrets/database-url-$1"; }
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" \
  -v recorder_password="$(password_of recorder)" \
  -v relay_password="$(password_of relay)" \
  -v api_password="$(password_of api)" <<'SQL'
CREATE ROLE bulk_recorder NOLOGIN;
CREATE ROLE bulk_relay NOLOGIN;
CREATE ROLE bulk_api NOLOGIN;
CREATE ROLE recorder_login LOGIN PASSWORD :'recorder_password' IN ROLE bulk_recorder;
CREATE ROLE relay_login LOGIN PASSWORD :'relay_password' IN ROLE bulk_relay;
CREATE ROLE api_login LOGIN PASSWORD :'api_password' IN ROLE bulk_api;
SQL
