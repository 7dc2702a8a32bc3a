# Stand-in for minio/mc:RELEASE.2025-08-13T08-35-41Z (tests/compose only; docker/standins/README.md).
#
# Reproduced: mc at /usr/bin/mc, ENTRYPOINT ["mc"], run as root with a POSIX /bin/sh, grep and
# printf (docker-compose.yml's minio-init replaces the entrypoint with /bin/sh -c).
# Differs: mc is built with `go install github.com/minio/mc@v0.0.0-20250313080218-cf909e1063a9`,
# the one version of the module the Go module proxy serves (2025-03-13, five months before the
# pinned release; the subcommands minio-init uses, mb --ignore-existing, admin policy create and
# attach/detach, admin user add and info, exist in both); Debian bookworm instead of Red Hat UBI.
ARG ROOTFS
FROM ${ROOTFS}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
COPY --chmod=0755 mc /usr/bin/mc
ENTRYPOINT ["mc"]
