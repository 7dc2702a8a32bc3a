"""Storage locations: ``s3://bucket/prefix`` and ``file:///abs/path``.

Locations come from user specs and end up as filesystem paths and object names, so anything
that could escape its root (``..``, absolute children, empty segments) is refused here, once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Scheme = Literal["s3", "file"]

# S3 bucket naming rules (3-63 chars, lowercase letters, digits, dots and hyphens, starting and
# ending with a letter or digit, no "..", not an IPv4 address, no reserved prefix or suffix).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")


def check_relative(path: str, what: str = "key") -> str:
    """Return ``path`` if it is a clean relative '/'-separated path, else raise ValueError."""
    if not path:
        raise ValueError(f"{what} must not be empty")
    if path.startswith("/"):
        raise ValueError(f"{what} {path!r} must be relative (no leading '/')")
    if _CONTROL.search(path):
        raise ValueError(f"{what} {path!r} contains a backslash or a control character")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"{what} {path!r} has an empty, '.' or '..' segment")
    return path


def check_bucket(name: str) -> str:
    """Return ``name`` if it is a valid S3 bucket name, else raise ValueError saying why."""
    if not name:
        raise ValueError("the bucket name is empty (expected s3://bucket/prefix)")
    if (
        not _BUCKET.fullmatch(name)
        or ".." in name
        or _IPV4.fullmatch(name)
        or name.startswith(_RESERVED_BUCKET_PREFIXES)
        or name.endswith(_RESERVED_BUCKET_SUFFIXES)
    ):
        raise ValueError(
            f"invalid S3 bucket name {name!r}: use 3-63 lowercase letters, digits, '.' or '-', "
            "starting and ending with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class Location:
    """A parsed location. ``path`` is the key prefix (s3, may be '') or the absolute directory (file)."""

    scheme: Scheme
    bucket: str
    path: str

    def child(self, name: str) -> Location:
        """The location ``name`` (a relative path) below this one; refuses escapes."""
        name = check_relative(name.removesuffix("/"), "child name")
        if self.scheme == "s3":
            return Location("s3", self.bucket, f"{self.path}/{name}" if self.path else name)
        return Location("file", "", f"{self.path}/{name}")

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.path}" if self.path else f"s3://{self.bucket}"
        return f"file://{self.path}"


def parse_location(uri: str | Location) -> Location:
    """Parse and validate a location URI; ValueError names what is wrong and what is expected."""
    if isinstance(uri, Location):
        return uri
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError("a location must be a non-empty s3://bucket/prefix or file:///abs/path URI")
    if uri != uri.strip():
        raise ValueError(f"location {uri!r} has leading or trailing whitespace")
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        check_bucket(bucket)
        prefix = prefix.removesuffix("/")
        if prefix:
            check_relative(prefix, f"prefix of {uri!r}")
        return Location("s3", bucket, prefix)
    if uri.startswith("file://"):
        path = uri[len("file://") :]
        if not path.startswith("/"):
            raise ValueError(f"location {uri!r}: a file URI needs an absolute path, as in file:///abs/path")
        path = path.rstrip("/")
        if not path:
            raise ValueError(f"location {uri!r} is the filesystem root; name a directory")
        check_relative(path[1:], f"path of {uri!r}")
        return Location("file", "", path)
    if "://" in uri:
        raise ValueError(f"location {uri!r}: unsupported scheme (use s3://bucket/prefix or file:///abs/path)")
    raise ValueError(f"location {uri!r} is a bare path; write it as file:///abs/path (relative paths are not allowed)")
