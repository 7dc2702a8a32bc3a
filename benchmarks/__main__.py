"""``python -m benchmarks``: the benchmarks' command line, what ``make bench`` runs (commands.py).

In a source checkout ``pipeline-lib bench`` mounts the same commands (pipeline_lib/bench_command.py).
"""

from benchmarks.commands import bench_app

if __name__ == "__main__":
    bench_app(prog_name="python -m benchmarks")
