#!/bin/sh
# The passwords of docker-compose.yml, as the secret files it mounts (never in `environment:`):
#   deploy/compose/secrets.sh            # writes ./secrets/, once; an existing file is kept
#   deploy/compose/secrets.sh DIR        # elsewhere (then BULK_RECORDER_SECRETS=DIR in .env)
# Each password is 24 random hex digits (nothing to percent-encode in a URL). The directory is
# yours only (0700); the files in it are 0644, because a bind-mounted secret keeps its mode and
# the services read it as uid 10001 (the image's user), PostgreSQL as postgres. To choose your own
# password, edit the files before the first `docker compose up`: the URLs of one login must hold
# the same password as the file the server reads (postgres-password for the owner's URL,
# rabbitmq-user.conf for rabbitmq-url); the database logins' own passwords are read from their
# URLs by deploy/postgres/initdb when the database is first created.
set -eu
dir=${1:-secrets}
umask 077
mkdir -p "$dir"
chmod 700 "$dir"
password() { od -An -N12 -tx1 /dev/urandom | tr -d ' \n'; }
put() { # put NAME CONTENT: write it unless it exists
  [ -e "$dir/$1" ] && return 0
  printf '%s\n' "$2" >"$dir/$1"
  chmod 644 "$dir/$1"
}
existing() { # the password of an existing file's URL or conf line, else a new one
  if [ -e "$dir/$1" ]; then sed -n "$2" "$dir/$1"; else password; fi
}
owner=$(existing postgres-password 'p')
put postgres-password "$owner"
put database-url-owner "postgresql://postgres:$owner@postgres:5432/bulk_recorder"
for role in recorder relay api; do
  put "database-url-$role" "postgresql://${role}_login:$(password)@postgres:5432/bulk_recorder"
done
broker=$(existing rabbitmq-user.conf 's/^default_pass = //p')
put rabbitmq-user.conf "default_user = bulk
default_pass = $broker"
put rabbitmq-url "amqp://bulk:$broker@rabbitmq:5672/"
put grafana-admin-password "$(password)"
echo "secrets in $dir/: $(ls "$dir" | tr '\n' ' ')"
