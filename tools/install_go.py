"""Install a Go toolchain at /usr/local/go from the Go module proxy, for machines without Go.

The MinIO server of the policy tests is built with ``go install`` (pipeline_lib/localstack/
minio_server.py); Debian's golang-go is too old for it. The proxy serves every Go release as the
module ``golang.org/toolchain`` (what ``GOTOOLCHAIN`` downloads), so no Go binary is needed to get
one: the zip is fetched and unpacked with its file modes. Used by .ci/run only when Go is missing.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

VERSION = "v0.0.1-go1.26.8.linux-amd64"
URL = f"https://proxy.golang.org/golang.org/toolchain/@v/{VERSION}.zip"
TARGET = Path(os.environ.get("PIPELINE_GO_ROOT", "/usr/local/go"))  # the variable: to try it elsewhere


def main() -> int:
    if (TARGET / "bin" / "go").exists():
        print(f"go: {TARGET / 'bin' / 'go'} is there already")
        return 0
    prefix = f"golang.org/toolchain@{VERSION}/"
    with tempfile.TemporaryDirectory(prefix="go-toolchain-") as tmp:
        archive = Path(tmp) / "go.zip"
        urllib.request.urlretrieve(URL, archive)
        staging = Path(tmp) / "go"
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                dest = staging / info.filename[len(prefix) :]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, dest.open("wb") as out:
                    out.write(src.read())
                os.chmod(dest, ((info.external_attr >> 16) & 0o777) or 0o644)
        TARGET.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, TARGET, symlinks=True)  # copy2 keeps the modes set above
    print(f"go: installed {VERSION} at {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
