"""Load a YAML job spec and turn validation failures into one readable message."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from pipeline_lib.errors import SpecError
from pipeline_lib.spec.models import JobSpec

_CONNECTION_HINT = {"bootstrap", "bootstrap_servers", "endpoint", "access_key", "secret_key", "password"}


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid job spec"]
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and str(err["loc"][-1]) in _CONNECTION_HINT:
            msg += " (connection settings come from PIPELINE_* environment variables, not the spec)"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def parse_spec(data: object, source: str = "<spec>") -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a job spec is a YAML mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(source, exc)) from None


def load_spec(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    return parse_spec(data, str(path))
