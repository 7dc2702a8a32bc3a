"""The library's Python surface: load or build a spec, run it, read what it wrote.

``pipeline_lib`` re-exports these names at the package root (``from pipeline_lib import run_job``);
each module here has one job: ``specs`` (a validated JobSpec from YAML or a dict), ``run``
(``run_job``, what ``pipeline-lib run`` runs), ``summary`` (the typed result of a run) and
``tables`` (a files sink's committed output).
"""
