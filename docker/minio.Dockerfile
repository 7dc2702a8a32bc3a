# The MinIO server of docker-compose.yml, built from source. MinIO's community edition has been
# distributed as source only since October 2025: Docker Hub holds no minio/minio image of
# RELEASE.2025-10-15T17-29-55Z, the release with the fix of CVE-2025-62506. Build context: the
# repository root.
#
# MINIO_VERSION is the version the Go module proxy serves and the tests run
# (testing_servers/minio_server.py VERSION, checked equal by tests/unit/test_compose.py):
# that release plus eleven later commits of the archived repository (README changes, four fixes).
FROM golang:1.24.13-bookworm AS build
ARG MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
RUN CGO_ENABLED=0 GOBIN=/out go install "github.com/minio/minio@${MINIO_VERSION}"

# The same base as the Spark image: its python3 answers the healthcheck (no curl, no mc here).
FROM python:3.11.14-slim-bookworm
COPY --from=build /out/minio /usr/local/bin/minio
RUN useradd --create-home --uid 1002 --gid 0 minio \
    && mkdir -p /data \
    && chown minio:0 /data
USER minio
EXPOSE 9000 9001
ENTRYPOINT ["/usr/local/bin/minio"]
