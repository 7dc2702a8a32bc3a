"""The images docker-compose.yml needs, in a test engine that cannot pull from an image registry.

Every official image the compose file and ``docker/*.Dockerfile`` name is replaced by a stand-in
of the same name and tag, built from ``docker/standins/<name>.Dockerfile`` on a Debian bookworm
root file system (``debootstrap --variant=minbase``, ``docker import``); then the project's own
images are built from the compose file's ``build`` sections, unchanged, on top of them. How each
stand-in differs from its official image is written in its Dockerfile (docs/compose.md sums up).

Building is slow, so the root file system's tarball and every built image (``docker save``) are
cached under ``~/.cache/pipeline-lib/compose`` keyed by a hash of their inputs: the Dockerfile,
the files it copies, the base image's key. A second run with the same inputs loads the images
(``docker load``); a changed ``pipeline_lib`` rebuilds the project's images only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline_lib.cache_dir import cache_dir
from pipeline_lib.localstack.maven_jars import fetch_pom_jars
from testing_servers.docker_engine import DockerEngine, EngineError
from testing_servers.minio_server import _go

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "docker" / "standins"
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
SOURCES = (
    f"deb {MIRROR} {SUITE} main\n"
    f"deb {MIRROR} {SUITE}-updates main\n"
    f"deb http://deb.debian.org/debian-security {SUITE}-security main\n"
)
# The machine's own certificate authorities (its outbound TLS is re-signed by them): the stand-ins
# that install ca-certificates trust them too, so that pip and go reach their indexes from a build.
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
GO_VERSION = "1.24.13"  # docker/minio.Dockerfile's golang image
MC_MODULE, MC_VERSION = "github.com/minio/mc", "v0.0.0-20250313080218-cf909e1063a9"  # the proxy's only version


def cache() -> Path:
    """The compose tier's cache folder (rootfs tarball, fetched inputs, saved images)."""
    return cache_dir("compose")


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _tree_digest(path: Path) -> str:
    """Content hash of a file or folder (names and bytes; caches and bytecode left out)."""
    if path.is_file():
        return _digest(path.name, path.read_bytes())
    parts: list[bytes | str] = []
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        if "__pycache__" in file.parts or file.suffix == ".pyc":
            continue
        parts += [str(file.relative_to(path)), file.read_bytes()]
    return _digest(*parts)


def _run(command: list[str], what: str, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if done.returncode != 0:
        raise EngineError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    return done


# ---------------------------------------------------------------- inputs fetched once per machine
def rootfs_tarball(timeout: float = 1800.0) -> tuple[Path, str]:
    """The bookworm minbase root file system as a tarball (built with debootstrap if not cached),
    its apt sources with the updates and security suites, the machine's local CA certificates in
    its /usr/local/share/ca-certificates; and its key."""
    cas = sorted(LOCAL_CAS.glob("*.crt"))
    key = _digest(SUITE, "minbase", MIRROR, SOURCES, *(f"{ca.name}:{_tree_digest(ca)}" for ca in cas))
    target = cache() / f"rootfs-{SUITE}-minbase-{key}.tar"
    if target.is_file():
        return target, key
    if not shutil.which("debootstrap"):
        _run(
            ["apt-get", "install", "-y", "-q", "debootstrap"],
            "apt-get install debootstrap",
            timeout,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=target.parent) as tmp:
        root = Path(tmp) / "root"
        _run(["nice", "-n", "10", "debootstrap", "--variant=minbase", SUITE, str(root), MIRROR], "debootstrap", timeout)
        (root / "etc" / "apt" / "sources.list").write_text(SOURCES)
        (root / "usr" / "local" / "share" / "ca-certificates").mkdir(parents=True, exist_ok=True)
        for ca in cas:
            shutil.copy2(ca, root / "usr" / "local" / "share" / "ca-certificates" / ca.name)
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (root / leftover).glob("*"):
                if item.is_file():
                    item.unlink()
        staging = Path(tmp) / "rootfs.tar"
        _run(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(staging), "."],
            "tar of the root file system",
            timeout,
        )
        staging.rename(target)
    return target, key


def go_toolchain(version: str = GO_VERSION) -> Path:
    """Go ``version`` unpacked from the module proxy's ``golang.org/toolchain`` zip (modes kept)."""
    target = cache() / f"go-{version}" / "go"
    if (target / "bin" / "go").is_file():
        return target
    module = f"v0.0.1-go{version}.linux-amd64"
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="go-", dir=target.parent.parent) as tmp:
        archive = Path(tmp) / "go.zip"
        urllib.request.urlretrieve(f"https://proxy.golang.org/golang.org/toolchain/@v/{module}.zip", archive)
        prefix, staging = f"golang.org/toolchain@{module}/", Path(tmp) / "go"
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                dest = staging / info.filename[len(prefix) :]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(dest, ((info.external_attr >> 16) & 0o777) or 0o644)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
    return target


def mc_binary(timeout: float = 1800.0) -> Path:
    """``mc`` built with ``go install MC_MODULE@MC_VERSION`` (cached)."""
    target = cache() / f"mc-{MC_VERSION.rsplit('-', 1)[-1]}" / "mc"
    if target.is_file():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="mc-", dir=target.parent.parent))
    try:
        _run(
            ["nice", "-n", "10", _go(), "install", f"{MC_MODULE}@{MC_VERSION}"],
            f"go install {MC_MODULE}",
            timeout,
            env={**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"},
        )
        staging.rename(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def kafka_jars() -> Path:
    """The Kafka stand-in's jars (broker, tools, log4j2 binding) from Maven Central (cached)."""
    pom = STANDINS / "kafka" / "pom.xml"
    return fetch_pom_jars(pom, cache() / f"kafka-jars-{_tree_digest(pom)}", "kafka_2.13-*.jar")


# ---------------------------------------------------------------- the stand-ins
@dataclass(frozen=True)
class StandIn:
    """An official image's stand-in: its Dockerfile, the files of docker/standins/ it copies,
    the stand-in it is built on (if any) and the fetched inputs its context needs."""

    image: str
    dockerfile: str
    files: tuple[str, ...] = ()
    base: str | None = None
    fetched: dict[str, Callable[[], Path]] = field(default_factory=dict)


PYTHON = "python:3.11.14-slim-bookworm"
STANDIN_IMAGES = (
    StandIn(PYTHON, "python.Dockerfile"),
    StandIn(
        "apache/airflow:3.3.2-python3.11",
        "airflow.Dockerfile",
        ("airflow-entrypoint",),
        base=PYTHON,
        fetched={"constraints.txt": lambda: REPO / "docker" / "constraints.txt"},
    ),
    StandIn("apache/kafka:4.1.1", "kafka.Dockerfile", ("kafka",), fetched={"libs": kafka_jars}),
    StandIn("postgres:16.16", "postgres.Dockerfile", ("postgres",)),
    StandIn("golang:1.24.13-bookworm", "golang.Dockerfile", fetched={"go": go_toolchain}),
    StandIn("minio/mc:RELEASE.2025-08-13T08-35-41Z", "mc.Dockerfile", fetched={"mc": mc_binary}),
)


def _from_lines(dockerfile: Path) -> list[str]:
    """The images a Dockerfile's FROM lines name, its ARG defaults substituted; stages left out."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].upper() == "ARG" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            args.setdefault(name, value)
        elif len(words) >= 2 and words[0].upper() == "FROM":
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), words[1])
            if image not in stages:
                images.append(image)
            if len(words) >= 4 and words[2].upper() == "AS":
                stages.add(words[3])
    return images


@dataclass(frozen=True)
class ProjectImage:
    """An image the compose file builds: its tag, context and Dockerfile."""

    image: str
    context: Path
    dockerfile: Path


def project_images(compose: dict[str, Any], root: Path = REPO) -> list[ProjectImage]:
    """The compose file's ``build`` sections, one per image."""
    found: dict[str, ProjectImage] = {}
    for service in compose["services"].values():
        if "build" in service:
            build = service["build"]
            context = root / build.get("context", ".")
            found[service["image"]] = ProjectImage(service["image"], context, context / build["dockerfile"])
    return list(found.values())


def official_images(compose: dict[str, Any], root: Path = REPO) -> set[str]:
    """Every image not built here: the compose file's ``image`` without ``build`` and every FROM
    of the project's Dockerfiles."""
    names = {s["image"] for s in compose["services"].values() if "build" not in s and "image" in s}
    for built in project_images(compose, root):
        names.update(_from_lines(built.dockerfile))
    return names


def _instructions(dockerfile: Path) -> list[str]:
    """A Dockerfile's instructions, continuation lines joined, comments left out."""
    instructions, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        instructions.append(current.strip())
        current = ""
    return [*instructions, current.strip()] if current.strip() else instructions


def _copy_sources(dockerfile: Path) -> list[str]:
    """The context paths a Dockerfile's COPY/ADD instructions read (``--from`` copies left out)."""
    sources = []
    for instruction in _instructions(dockerfile):
        if not instruction.upper().startswith(("COPY ", "ADD ")):
            continue
        words = shlex.split(instruction)
        if words:
            operands = [w for w in words[1:] if not w.startswith("--")]
            if any(w.startswith("--from") for w in words[1:]):
                continue
            sources += operands[:-1]
    return sources


class ImageBuilder:
    """Builds (or loads from the cache) the stand-ins and the project's images into one engine."""

    def __init__(self, engine: DockerEngine, log: Callable[[str], None] = print) -> None:
        self.engine = engine
        self.log = log
        self.keys: dict[str, str] = {}
        self.times: dict[str, float] = {}
        self.rootfs = ""

    def _cached(self, image: str, key: str) -> Path:
        return cache() / "images" / f"{re.sub(r'[^A-Za-z0-9.-]+', '_', image)}-{key}.tar"

    def _load_or_build(self, image: str, key: str, build: Callable[[], None]) -> None:
        started = time.monotonic()
        tarball = self._cached(image, key)
        if tarball.is_file():
            self.engine.docker("load", "-i", str(tarball), timeout=1800)
            how = "loaded"
        else:
            build()
            tarball.parent.mkdir(parents=True, exist_ok=True)
            for stale in tarball.parent.glob(tarball.name.rsplit("-", 1)[0] + "-*.tar"):
                stale.unlink()  # the same image built from other inputs
            staging = tarball.with_suffix(".tmp")
            self.engine.docker("save", "-o", str(staging), image, timeout=1800)
            staging.rename(tarball)
            how = "built"
        self.keys[image] = key
        self.times[image] = time.monotonic() - started
        self.log(f"{image}: {how} in {self.times[image]:.0f} s")

    def _build(self, tag: str, dockerfile: Path, context: Path, args: dict[str, str]) -> None:
        command = ["build", "--network", "host", "--progress", "plain", "-f", str(dockerfile), "-t", tag]
        for name, value in args.items():
            command += ["--build-arg", f"{name}={value}"]
        done = self.engine.docker(*command, str(context), timeout=3600, check=False)
        if done.returncode != 0:
            raise EngineError(f"docker build of {tag} failed:\n{(done.stdout + done.stderr)[-6000:]}")

    def import_rootfs(self) -> str:
        """The bookworm root file system as an image of this engine (``docker import``); its name."""
        tarball, key = rootfs_tarball()
        self.rootfs = f"pipeline-lib-standin/{SUITE}-minbase:{key}"
        if not self.engine.docker("images", "-q", self.rootfs, timeout=60).stdout.strip():
            self.engine.docker("import", "--change", 'CMD ["/bin/bash"]', str(tarball), self.rootfs, timeout=900)
        return self.rootfs

    def standin(self, spec: StandIn) -> None:
        """Load or build one stand-in under its official name, in a context of its files alone."""
        inputs = {name: fetch() for name, fetch in spec.fetched.items()}
        dockerfile = STANDINS / spec.dockerfile
        key = _digest(
            spec.image,
            self.rootfs,
            self.keys.get(spec.base or "", ""),
            dockerfile.read_bytes(),
            *(f"{f}:{_tree_digest(STANDINS / f)}" for f in spec.files),
            *(f"{n}:{_tree_digest(p)}" for n, p in sorted(inputs.items())),
        )

        def build() -> None:
            with tempfile.TemporaryDirectory(prefix="standin-") as tmp:
                context = Path(tmp)
                for name in spec.files:
                    source = STANDINS / name
                    (shutil.copytree if source.is_dir() else shutil.copy2)(source, context / name)
                for name, path in inputs.items():
                    if path.is_dir():
                        shutil.copytree(path, context / name, symlinks=True, copy_function=os.link)
                    else:
                        shutil.copy2(path, context / name)
                args = {"ROOTFS": self.rootfs, **({"BASE": spec.base} if spec.base else {})}
                self._build(spec.image, dockerfile, context, args)

        self._load_or_build(spec.image, key, build)

    def project(self, built: ProjectImage) -> None:
        """Load or build one of the compose file's images, with ``docker build`` as compose would run it."""
        bases = [self.keys[name] for name in _from_lines(built.dockerfile)]
        sources = [f"{s}:{_tree_digest(built.context / s)}" for s in _copy_sources(built.dockerfile)]
        key = _digest(built.image, built.dockerfile.read_bytes(), *bases, *sources)
        self._load_or_build(built.image, key, lambda: self._build(built.image, built.dockerfile, built.context, {}))

    def build_all(self, compose_file: Path, parallel: int = 2) -> dict[str, float]:
        """Every stand-in the compose file needs, then its own images; each image's seconds."""
        compose = yaml.safe_load(compose_file.read_text())
        needed = official_images(compose, compose_file.parent)
        known = {s.image for s in STANDIN_IMAGES}
        missing = needed - known
        if missing:
            raise EngineError(f"no stand-in for {sorted(missing)}: add one to docker/standins/")
        self.import_rootfs()
        first = [s for s in STANDIN_IMAGES if s.base is None]
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(self.standin, first))
            list(pool.map(self.standin, [s for s in STANDIN_IMAGES if s.base is not None]))
            list(pool.map(self.project, project_images(compose, compose_file.parent)))
        return dict(self.times)
