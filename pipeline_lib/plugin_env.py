"""The CLI's process skips pydantic's plugin look-up, unless the environment says otherwise.

At its first model, pydantic looks for plugins in the entry points of every installed
distribution (``importlib.metadata``, about 200 of them beside Spark and Airflow): tens of
milliseconds of CPU before a run's session starts, and again in each Python worker that loads
pydantic, which inherits this environment. ``PYDANTIC_DISABLE_PLUGINS=__all__`` is pydantic's
documented switch for that. The CLI sets it only when it is unset, and before any model is
built (cli.py imports this module first): setting the variable to anything else, the empty
string too, keeps pydantic's own behaviour (load every plugin but the ones named).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VARIABLE = "PYDANTIC_DISABLE_PLUGINS"


def skip_plugin_lookup(environ: MutableMapping[str, str]) -> None:
    """Disable pydantic's plugins in ``environ`` unless it already says which to disable."""
    environ.setdefault(VARIABLE, "__all__")


skip_plugin_lookup(os.environ)
