"""Recovery: deciding, per pipeline and subtask, what a restore rebuilds and what it skips.

It sits below orchestration and imports none of it: the recovery DAG carries out its decisions,
which are plain data (a DAG conf and a run id).
"""
