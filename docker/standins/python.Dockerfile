# Stand-in for python:3.11.14-slim-bookworm (tests/compose only; docker/standins/README.md).
#
# Reproduced: Debian bookworm; python3, python and pip on PATH in /usr/local/bin; pip as root
# installs into /usr/local/lib/python3.11/site-packages (docker/spark.Dockerfile's SPARK_HOME is
# there); no EXTERNALLY-MANAGED marker; LANG=C.UTF-8; CMD python3.
# Differs: Debian's CPython 3.11.2 (the official image builds 3.11.14 from source under
# /usr/local); /usr/local/lib/python3.11/site-packages is a link to Debian's dist-packages folder;
# pip is Debian's 23.0.1.
ARG ROOTFS
FROM ${ROOTFS}
ENV LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip python3-venv ca-certificates netbase tzdata \
    && rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED \
    && mkdir -p /usr/local/lib/python3.11/dist-packages \
    && ln -s dist-packages /usr/local/lib/python3.11/site-packages \
    && ln -s /usr/bin/python3 /usr/local/bin/python3 \
    && ln -s /usr/bin/python3 /usr/local/bin/python \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip3 \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
