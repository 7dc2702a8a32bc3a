from pipeline_lib.cli import app

app(prog_name="pipeline-lib")
