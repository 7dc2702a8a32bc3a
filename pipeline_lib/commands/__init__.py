"""The CLI's command groups, one module each; ``pipeline_lib.cli`` puts them together as ``app``.

``output`` holds what every command prints with (the consoles, errors, tables); ``specs``
(validate, spec schema), ``planning`` (plan), ``recovery`` (verify, repair, lineage),
``snapshots``, ``stack`` and ``jvm`` (jvm-archive) hold the commands. ``run`` is in
``pipeline_lib.cli`` itself, over ``pipeline_lib.api.run_job``.
"""
