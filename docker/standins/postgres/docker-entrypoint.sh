#!/bin/bash
# docker-entrypoint.sh of the postgres stand-in: as root, own the data folder and start again as
# postgres; as postgres, initialise an empty data folder from POSTGRES_USER, POSTGRES_PASSWORD and
# POSTGRES_DB (the password reaches initdb through a file descriptor, never an argument), then exec
# the command (postgres and its options, e.g. `postgres -c listen_addresses=...`).
set -euo pipefail
if [ "${1:0:1}" = '-' ]; then
  set -- postgres "$@"
fi
if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown postgres:postgres "$PGDATA"
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi
if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?postgres: POSTGRES_PASSWORD must be set}"
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") --auth-local=trust \
    --auth-host=scram-sha-256 -D "$PGDATA" > /dev/null
  printf "\nlisten_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
  printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres -q -c "CREATE DATABASE \"$db\""
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop > /dev/null
  echo "postgres: database $db initialised for user $user"
fi
exec "$@"
