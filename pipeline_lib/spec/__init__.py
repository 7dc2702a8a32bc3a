"""Job specs: YAML → validated pydantic models (the first step of the data's way)."""

from typing import TYPE_CHECKING, Any

from pipeline_lib.spec.models import JobSpec

if TYPE_CHECKING:
    from pipeline_lib.spec.loader import load_spec, parse_spec

__all__ = ["JobSpec", "load_spec", "parse_spec"]


def __getattr__(name: str) -> Any:
    """The YAML loader on first use: a Python worker that unpickles a spec model needs no YAML."""
    if name in ("load_spec", "parse_spec"):
        from pipeline_lib.spec import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
