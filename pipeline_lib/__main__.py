"""`python -m pipeline_lib`: the same CLI as the `pipeline-lib` script, for when no script is installed."""

from pipeline_lib.cli import app

app(prog_name="pipeline-lib")
