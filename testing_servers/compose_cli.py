"""Docker Compose v2, built from its Go module, installed as the test engine's CLI plugin.

Debian's ``docker-compose`` is 1.29, the Python v1 (no ``!reset``, which the test's override
needs); users run ``docker compose``, the Go v2 plugin. The Go module proxy serves
``github.com/docker/compose/v2`` at the pinned VERSION; its go.mod has ``exclude`` directives,
which ``go install module@version`` refuses, so the module is downloaded (``go mod download``,
checked against the checksum database) and built in a copy of it, as compose's own Makefile does
(``./cmd``, the version in ``internal.Version``). The binary is cached (no binary in git) and
copied to ``$DOCKER_CONFIG/cli-plugins/docker-compose`` of the engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipeline_lib.cache_dir import cache_dir
from testing_servers.docker_engine import DockerEngine, EngineError
from testing_servers.minio_server import _go

MODULE = "github.com/docker/compose/v2"
VERSION = "v2.40.3"  # the last v2 release the module proxy serves (v5 renamed the module)


def binary_path(version: str = VERSION) -> Path:
    """Where the built plugin is cached: ``~/.cache/pipeline-lib/compose/docker-compose-VERSION/``."""
    return cache_dir("compose") / f"docker-compose-{version}" / "docker-compose"


def fetch_compose(timeout: float = 1800.0) -> Path:
    """The cached plugin binary, built first if absent (staged, then renamed into place)."""
    target = binary_path()
    if target.is_file():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    staging = Path(tempfile.mkdtemp(prefix="compose-", dir=target.parent.parent))
    try:
        go = _go()
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise EngineError(f"go mod download {MODULE}@{VERSION} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        source = staging / "src"
        shutil.copytree(json.loads(done.stdout)["Dir"], source)
        for path in [source, *source.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
        built = subprocess.run(
            [
                "nice",
                "-n",
                "10",
                go,
                "build",
                "-trimpath",
                "-ldflags",
                f"-s -w -X {MODULE}/internal.Version={VERSION}",
                "-o",
                str(staging / "docker-compose"),
                "./cmd",
            ],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if built.returncode != 0:
            raise EngineError(f"building {MODULE}@{VERSION} failed:\n{(built.stdout + built.stderr)[-3000:]}")
        shutil.rmtree(source)
        try:
            staging.rename(target.parent)
        except OSError:  # built meanwhile by another run
            if not target.is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def install_plugin(engine: DockerEngine) -> Path:
    """``docker compose`` for ``engine``'s CLI config: the binary copied into its cli-plugins."""
    plugin = engine.config_dir / "cli-plugins" / "docker-compose"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(fetch_compose(), plugin)
    plugin.chmod(0o755)
    version = engine.docker("compose", "version", "--short", timeout=60).stdout.strip()
    if version.lstrip("v") != VERSION.lstrip("v"):
        raise EngineError(f"docker compose version says {version!r}, expected {VERSION}")
    return plugin
