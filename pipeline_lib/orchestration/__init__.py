"""Orchestration: how Airflow launches, watches and recovers jobs.

Airflow is optional; nothing here imports it at module load except the pieces whose names say
so (``dag_factory``, ``airflow_connections``), so the library and the CLI work without it.
"""
