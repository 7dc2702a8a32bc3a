"""Benchmarks: commands that measure against a real alternative in the same run and print ratios.

``pipeline-lib bench`` (commands.py) is their one command line. The throughput benchmark is split
by job: config (what a run measures), events (its input), our_job, structured_streaming_run and
raw_kafka (the three ways to read it), restore_sizes (restore time vs state size), measures (the
figures), summary (the verdicts) and bench_report (the files); throughput.py runs the steps in
order. structured_streaming.py and restore_probe.py are child processes that some steps time.
"""
