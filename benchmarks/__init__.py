"""Benchmarks and the soak: commands that measure against a real alternative in the same run and print ratios.

Not part of the pipeline-lib wheel: they run from a source checkout (``make bench``, ``python -m
benchmarks``, or ``pipeline-lib bench`` when the checkout is installed in editable mode) and use the
servers of ``testing_servers`` besides the library's embedded stack. commands.py is their one
command line (with feature_commands.py). The throughput benchmark is split by job: config (what a
run measures), events (its input), our_job, structured_streaming_run and raw_kafka (the three ways
to read it), restore_sizes (restore time vs state size), measures (the figures), summary (the
verdicts), bench_report and bench_plots (the files); throughput.py runs the steps in order.
structured_streaming.py and restore_probe.py are child processes that some steps time. soak.py
(``make soak``) runs random crash/restore cycles with the faults of soak_faults.py.
"""
