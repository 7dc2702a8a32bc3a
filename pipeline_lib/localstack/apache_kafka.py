"""A real Apache Kafka broker for the tests: one KRaft node (broker and controller) on 127.0.0.1.

Tansu speaks the Kafka protocol but is not Kafka: what only a real broker shows (transaction
markers kept in the log, every codec as producers write it, ListOffsets) is tested against this
one. Its jars come from Maven Central through ``tools/kafka-broker/pom.xml`` into a cache
directory reused between runs (no jars in git); the storage is formatted with Kafka's own
StorageTool, the broker runs as ``java -cp JARS/* kafka.Kafka server.properties`` on two free
ports and is stopped by PID.

With ``secured=True`` it also listens for TLS (``SSL``) and for SASL over TLS (``SASL_SSL``:
PLAIN and SCRAM-SHA-256/512), with a CA and a broker certificate made in its data directory
(tls_files) and one user whose random password is set for every mechanism. The password reaches
the broker through 0600 files (server.properties' JAAS line for PLAIN) except for SCRAM, whose
credentials Kafka's StorageTool only takes as a ``--add-scram`` argument at format time: it is in
that short-lived process's argv, visible to local users of the machine, for test passwords only.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_lib.cache_dir import cache_dir
from pipeline_lib.localstack.broker import broker_ready
from pipeline_lib.localstack.maven_jars import fetch_pom_jars, pom_property
from pipeline_lib.localstack.ports import LOCALHOST, free_port
from pipeline_lib.localstack.processes import StackError, start_daemon, stop_pid, wait_until_ready
from pipeline_lib.localstack.tls_files import TlsFiles, make_tls_files

POM = Path(__file__).resolve().parents[2] / "tools" / "kafka-broker" / "pom.xml"
# A small heap and the serial collector: a test broker on a 2-core machine shared with Spark.
JVM_OPTIONS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka.server.KafkaRaftServer
logger.kafka.level = info
"""


def kafka_version(pom: Path = POM) -> str:
    """The broker version the pom pins (its ``kafka.version`` property)."""
    return pom_property(pom, "kafka.version")


def jars_dir(version: str | None = None) -> Path:
    """Where the broker's jars are cached: ``$XDG_CACHE_HOME/pipeline-lib/kafka-VERSION``
    (``~/.cache`` by default), shared by every worktree and run of this machine."""
    return cache_dir(f"kafka-{version or kafka_version()}")


def fetch_jars(*, timeout: float = 900.0) -> Path:
    """The cached jars, fetched first with ``mvn dependency:copy-dependencies`` if absent (maven_jars.py)."""
    return fetch_pom_jars(POM, jars_dir(), "kafka_2.13-*.jar", timeout=timeout)


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 8192


@dataclass(frozen=True)
class BrokerSecurity:
    """The secured listeners of a broker: their ports, the TLS files (``tls.ca_cert`` is what a
    client trusts) and the one SASL user, valid for PLAIN and both SCRAM mechanisms."""

    ssl_port: int
    sasl_ssl_port: int
    tls: TlsFiles
    username: str
    password: str = field(repr=False)

    @property
    def ssl_bootstrap(self) -> str:
        """The TLS listener (no SASL)."""
        return f"{LOCALHOST}:{self.ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """The SASL over TLS listener."""
        return f"{LOCALHOST}:{self.sasl_ssl_port}"


@dataclass(frozen=True)
class ApacheKafka:
    """A running broker: where clients connect, and what is needed to stop it."""

    data_dir: Path
    port: int
    controller_port: int
    pid: int
    java: str
    version: str
    ready_seconds: float  # from starting the JVM (after formatting) to a client's first metadata answer
    security: BrokerSecurity | None = None  # the TLS and SASL listeners, when started with secured=True

    @property
    def bootstrap(self) -> str:
        """The address Kafka clients bootstrap from."""
        return f"{LOCALHOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        """The broker's output (quoted when it fails to start)."""
        return self.data_dir / "kafka.log"


def server_properties(data_dir: Path, port: int, controller_port: int, security: BrokerSecurity | None = None) -> str:
    """One node as broker and controller, listening on 127.0.0.1 only; replication factors of 1
    for the internal topics (offsets, transactions, share groups), which default to 3; a log
    cleaner that looks for work every second. The broker and controller talk PLAINTEXT to each
    other; clients may also use ``security``'s listeners."""
    listeners = [f"PLAINTEXT://{LOCALHOST}:{port}"]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    if security is not None:
        listeners += [f"SSL://{security.ssl_bootstrap}", f"SASL_SSL://{security.sasl_ssl_bootstrap}"]
        protocols += ["SSL:SSL", "SASL_SSL:SASL_SSL"]
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers={LOCALHOST}:{controller_port}",
            f"listeners={','.join(listeners)},CONTROLLER://{LOCALHOST}:{controller_port}",
            f"advertised.listeners={','.join(listeners)}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"listener.security.protocol.map={','.join(protocols)}",
            *(_security_properties(security) if security is not None else []),
            f"log.dirs={data_dir / 'log'}",
            "num.partitions=1",
            "num.network.threads=2",
            "num.io.threads=2",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "log.cleaner.backoff.ms=1000",  # a compacted topic's test waits for the cleaner (default 15 s)
            "",
        ]
    )


def _security_properties(security: BrokerSecurity) -> list[str]:
    """TLS from PEM files, SASL PLAIN (its users in the JAAS line) and SCRAM (users in the
    metadata log, added at format time)."""
    plain = (
        f"org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{security.username}="{security.password}";'
    )
    return [
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={security.tls.broker_chain.parent / 'broker-keystore.pem'}",
        "ssl.client.auth=none",
        f"sasl.enabled.mechanisms={','.join(SASL_MECHANISMS)}",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={plain}",
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    ]


def _make_security(data_dir: Path, exclude: set[int]) -> BrokerSecurity:
    """Certificates in ``data_dir/tls``, a PEM keystore (key, then chain), two free ports and a
    user with a random password."""
    tls = make_tls_files(data_dir / "tls")
    keystore = tls.broker_chain.parent / "broker-keystore.pem"
    keystore.write_text(tls.broker_key.read_text() + tls.broker_chain.read_text())
    os.chmod(keystore, 0o600)
    ssl_port = free_port(exclude=exclude)
    sasl_port = free_port(exclude={*exclude, ssl_port})
    return BrokerSecurity(ssl_port, sasl_port, tls, "pipeline", secrets.token_urlsafe(18))


def _scram_arguments(security: BrokerSecurity) -> list[str]:
    return [
        arg
        for mechanism in SASL_MECHANISMS
        if mechanism.startswith("SCRAM")
        for arg in (
            "--add-scram",
            f"{mechanism}=[name={security.username},password={security.password},iterations={SCRAM_ITERATIONS}]",
        )
    ]


def _hidden(text: str, security: BrokerSecurity | None) -> str:
    return text.replace(security.password, "***") if security is not None else text


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError("Apache Kafka needs Java 17+ (java is not on PATH)")
    return java


def _cluster_id() -> str:
    """A random cluster id in Kafka's form (a UUID, base64 URL-safe without padding). Never one
    starting with "-" (1 in 64): the storage tool's argument parser reads it as an option, and
    Kafka's own Uuid.randomUuid draws again for the same reason."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cluster_id


def merge_properties(defaults: str, overrides: Mapping[str, str]) -> str:
    """``defaults`` (server.properties text) with ``overrides`` set. A static quorum
    (``controller.quorum.voters``) replaces the dynamic one's bootstrap servers."""
    props = dict(line.split("=", 1) for line in defaults.splitlines() if line)
    if "controller.quorum.voters" in overrides:
        props.pop("controller.quorum.bootstrap.servers", None)
    props.update(overrides)
    return "".join(f"{key}={value}\n" for key, value in props.items())


def start_apache_kafka(
    data_dir: Path,
    *,
    timeout: float = 120.0,
    secured: bool = False,
    port: int | None = None,
    controller_port: int | None = None,
    overrides: Mapping[str, str] | None = None,
    cluster_id: str | None = None,
) -> ApacheKafka:
    """Fetch (or reuse) the jars, format a fresh KRaft log in ``data_dir`` and start the broker;
    return once a Kafka client gets metadata on ``port``. On failure the JVM is stopped and
    StackError quotes the log. ``secured``: also the SSL and SASL_SSL listeners (BrokerSecurity).

    ``overrides`` are broker properties over the defaults here (e.g. the compose file's, listeners
    and all, on ``port`` and ``controller_port``); with a static quorum the log is formatted for it
    rather than ``--standalone``."""
    jars = fetch_jars()
    java, version = _java(), kafka_version()
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    controller_port = controller_port or free_port(exclude={port})
    security = _make_security(data_dir, {port, controller_port}) if secured else None
    config = data_dir / "server.properties"
    config.touch(mode=0o600)  # it holds the PLAIN user's password when secured
    config.write_text(merge_properties(server_properties(data_dir, port, controller_port, security), overrides or {}))
    standalone = [] if "controller.quorum.voters" in (overrides or {}) else ["--standalone"]
    (data_dir / "log4j2.properties").write_text(LOG4J2)
    jvm = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={data_dir / 'log4j2.properties'}", "-cp", f"{jars}/*"]
    formatted = subprocess.run(
        [
            *jvm,
            "kafka.tools.StorageTool",
            "format",
            *standalone,
            "-t",
            cluster_id or _cluster_id(),
            "-c",
            str(config),
            *(_scram_arguments(security) if security is not None else []),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if formatted.returncode != 0:
        raise StackError(
            f"formatting Kafka's storage failed (exit {formatted.returncode}):\n"
            f"{_hidden((formatted.stdout + formatted.stderr)[-3000:], security)}"
        )
    log_path = data_dir / "kafka.log"
    started = time.monotonic()
    pid = start_daemon(
        [*jvm, "kafka.Kafka", str(config)],
        log_path,
        cwd=data_dir,
        env={**os.environ, "NO_PROXY": f"{LOCALHOST},localhost", "no_proxy": f"{LOCALHOST},localhost"},
    )
    try:
        wait_until_ready(
            pid,
            java,
            lambda: broker_ready(f"{LOCALHOST}:{port}"),
            what=f"Apache Kafka {version}",
            log_path=log_path,
            timeout=timeout,
        )
    except BaseException:
        stop_pid(pid, java)
        raise
    return ApacheKafka(data_dir, port, controller_port, pid, java, version, time.monotonic() - started, security)


def stop_apache_kafka(kafka: ApacheKafka, *, timeout: float = 30.0) -> bool:
    """SIGTERM (a controlled shutdown), SIGKILL after ``timeout`` s; False if it was not running."""
    return stop_pid(kafka.pid, kafka.java, timeout=timeout)


def rss_bytes(pid: int) -> int | None:
    """The process's resident memory from /proc (None where there is no /proc or no process)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def main() -> None:
    """``python -m pipeline_lib.localstack.apache_kafka``: fetch the jars if need be, start a broker
    in a temporary directory, print how long it took and its RSS, stop it."""
    started = time.monotonic()
    jars = fetch_jars()
    print(f"jars: {jars} ({time.monotonic() - started:.1f} s)")
    with tempfile.TemporaryDirectory(prefix="apache-kafka-") as tmp:
        started = time.monotonic()
        kafka = start_apache_kafka(Path(tmp))
        try:
            rss = rss_bytes(kafka.pid)
            print(
                f"Apache Kafka {kafka.version} at {kafka.bootstrap} (pid {kafka.pid}): format + start "
                f"{time.monotonic() - started:.1f} s, JVM start to ready {kafka.ready_seconds:.1f} s, "
                f"RSS {rss // 2**20 if rss else '?'} MiB"
            )
        finally:
            started = time.monotonic()
            stop_apache_kafka(kafka)
            print(f"stopped in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
