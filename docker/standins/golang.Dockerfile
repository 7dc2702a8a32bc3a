# Stand-in for golang:1.24.13-bookworm (tests/compose only; docker/standins/README.md).
#
# Reproduced: Go 1.24.13 in /usr/local/go (the Go module proxy's golang.org/toolchain module, the
# release's own files); GOPATH=/go, PATH with /go/bin and /usr/local/go/bin, GOTOOLCHAIN=local,
# working directory /go; ca-certificates for the module proxy.
# Differs: no gcc, git, curl or the rest of buildpack-deps:bookworm-scm (docker/minio.Dockerfile
# builds with CGO_ENABLED=0 from the module proxy, which needs neither).
ARG ROOTFS
FROM ${ROOTFS}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates netbase \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /go/bin /go/src && chmod -R 1777 /go
COPY go /usr/local/go
ENV GOLANG_VERSION=1.24.13 \
    GOTOOLCHAIN=local \
    GOPATH=/go \
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
