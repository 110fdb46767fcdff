#!/bin/sh
# As the official image: the server's settings in rabbitmq.conf and the first start's user from
# the files of /etc/rabbitmq/conf.d (docker-compose.yml mounts its secret there; RabbitMQ
# reads conf.d after rabbitmq.conf); the server runs as rabbitmq in the foreground as process
# 1's image (exec), so SIGTERM stops it.
set -eu
cat >/etc/rabbitmq/rabbitmq.conf <<CONF
loopback_users = none
listeners.tcp.default = 5672
management.tcp.port = 15672
CONF
chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /var/log/rabbitmq
export HOME=/var/lib/rabbitmq
exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups /usr/lib/rabbitmq/bin/rabbitmq-server
