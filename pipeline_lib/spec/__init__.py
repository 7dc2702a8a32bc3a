"""Job specs: YAML → validated pydantic models (the first step of the data's way)."""

from pipeline_lib.spec.loader import load_spec, parse_spec
from pipeline_lib.spec.models import JobSpec

__all__ = ["JobSpec", "load_spec", "parse_spec"]
