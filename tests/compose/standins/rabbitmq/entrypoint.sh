#!/bin/sh
# The official image's first-start user from RABBITMQ_DEFAULT_USER / RABBITMQ_DEFAULT_PASS; the
# server runs as rabbitmq in the foreground as process 1's image (exec), so SIGTERM stops it.
set -eu
cat >/etc/rabbitmq/rabbitmq.conf <<CONF
default_user = ${RABBITMQ_DEFAULT_USER:-guest}
default_pass = ${RABBITMQ_DEFAULT_PASS:-guest}
loopback_users = none
listeners.tcp.default = 5672
management.tcp.port = 15672
CONF
chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /var/log/rabbitmq
export HOME=/var/lib/rabbitmq
exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups /usr/lib/rabbitmq/bin/rabbitmq-server
