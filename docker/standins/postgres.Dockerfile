# Stand-in for postgres:16.16 (tests/compose only; docker/standins/README.md).
#
# Reproduced: ENTRYPOINT docker-entrypoint.sh, CMD postgres, STOPSIGNAL SIGINT; the user postgres
# (uid and gid 999); PGDATA=/var/lib/postgresql/data; on an empty data folder initdb with
# POSTGRES_USER as superuser and POSTGRES_PASSWORD as its password, POSTGRES_DB created,
# listen_addresses '*', local connections trusted and TCP ones checked with scram-sha-256; the
# server then runs as postgres; pg_isready, psql and postgres on PATH; sockets in /var/run/postgresql.
# Differs: PostgreSQL 15 (Debian bookworm's: PostgreSQL's own apt repository, which has 16, is not
# reachable from the test machines); no /docker-entrypoint-initdb.d scripts, POSTGRES_*_FILE
# secrets, POSTGRES_INITDB_ARGS or POSTGRES_HOST_AUTH_METHOD (the compose file uses none of them);
# setpriv (util-linux) instead of gosu.
ARG ROOTFS
FROM ${ROOTFS}
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
RUN groupadd --system --gid 999 postgres \
    && useradd --system --uid 999 --gid 999 --home-dir /var/lib/postgresql --shell /bin/bash postgres \
    && mkdir -p /etc/postgresql-common/createcluster.d \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/no-main.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/run/postgresql "$PGDATA" \
    && chown -R postgres:postgres /var/run/postgresql /var/lib/postgresql \
    && chmod 2777 /var/run/postgresql
COPY --chmod=0755 postgres/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["docker-entrypoint.sh"]
STOPSIGNAL SIGINT
EXPOSE 5432
CMD ["postgres"]
