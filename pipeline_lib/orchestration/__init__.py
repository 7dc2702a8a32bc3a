"""Orchestration: how Airflow launches, watches and recovers jobs.

Airflow is optional; nothing here imports it at module load except the pieces whose names say
so (``dag_factory``, ``airflow_connections``), so the library and the CLI work without it.
It is a top layer: it uses recovery's decisions and launches the CLI as a process, and no
module below it (recovery included) imports it.
"""
