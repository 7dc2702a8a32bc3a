"""docker-compose.yml read as docker compose reads it: ``${VAR}`` substitution from an env file,
each service's environment, command and volumes, whatever syntax they use.

Shared by the static checks of the file (tests/unit/test_compose*.py) and the test that runs its
services natively (tests/stack/test_compose_parity.py), so that both read the same values.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

# $$ (a literal $), ${NAME...} or $NAME, as docker compose interpolates them.
_VAR_RE = re.compile(r"\$(?:(\$)|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_BRACED_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?", re.DOTALL)


def referenced_vars(text: str) -> set[str]:
    """Every variable that docker compose would substitute in ``text`` ($$ escapes excluded)."""
    names = set()
    for m in _VAR_RE.finditer(text):
        if m.group(1):
            continue
        if m.group(3):
            names.add(m.group(3))
            continue
        braced = _BRACED_RE.fullmatch(m.group(2))
        assert braced, f"docker-compose.yml: cannot parse the substitution ${{{m.group(2)}}}"
        names.add(braced.group(1))
    return names


def interpolate(text: str, env: dict[str, str], where: str = "") -> str:
    """Compose's substitution: ``$$``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:?e}``, ``${V:+r}``..."""

    def replace(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        if m.group(3):
            name, op, arg = m.group(3), None, ""
        else:
            braced = _BRACED_RE.fullmatch(m.group(2))
            assert braced, f"{where}: cannot parse ${{{m.group(2)}}}"
            name, op, arg = braced.group(1), braced.group(2), braced.group(3) or ""
        value = env.get(name)
        if op in (":-", "-"):
            return arg if value is None or (op == ":-" and value == "") else value
        if op in (":+", "+"):
            return arg if value is not None and (op == "+" or value != "") else ""
        if op in (":?", "?") and (value is None or (op == ":?" and value == "")):
            pytest.fail(f"{where}: ${{{name}}} is required ({arg}) but not set in .env.example")
        # Like docker compose: an undefined variable becomes "" (and
        # test_every_variable_is_defined_in_env_example names it).
        return value or ""

    return _VAR_RE.sub(replace, text)


def deep_interpolate(node: Any, env: dict[str, str], where: str = "docker-compose.yml") -> Any:
    if isinstance(node, str):
        return interpolate(node, env, where)
    if isinstance(node, list):
        return [deep_interpolate(v, env, where) for v in node]
    if isinstance(node, dict):
        return {k: deep_interpolate(v, env, f"{where}: {k}") for k, v in node.items()}
    return node


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict of strings, whichever syntax it uses."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (item.split("=", 1) if "=" in item else (item, "") for item in raw)
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else _scalar(v) for k, v in raw.items()}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def command_of(service: dict[str, Any], key: str = "command") -> list[str]:
    raw = service.get(key)
    if raw is None:
        return []
    return shlex.split(raw) if isinstance(raw, str) else [str(part) for part in raw]


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume, short or long syntax."""
    result = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            result.append((str(entry.get("source", "")), str(entry["target"])))
        else:
            parts = str(entry).split(":")
            result.append((parts[0], parts[1]) if len(parts) > 1 else ("", parts[0]))
    return result


def parse_env_file(path: Path) -> dict[str, str]:
    values = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        assert "=" in line, f"{path.name}:{number}: expected NAME=value, got {raw!r}"
        name, value = line.split("=", 1)
        name, value = name.strip().removeprefix("export ").strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{path.name}:{number}: bad name {name!r}"
        assert name not in values, f"{path.name}:{number}: {name} is defined twice"
        values[name] = value
    return values
