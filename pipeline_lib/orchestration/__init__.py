"""Orchestration: how Airflow launches, watches and recovers jobs.

Airflow is optional; only the modules that define Airflow objects import it at module load
(``dag_factory``, ``report_dag``, ``operators``, ``hooks``, ``assets``; ``airflow_connections``
inside its functions), so the library and the CLI work without it. ``provider`` is read by
Airflow's provider discovery and imports no Airflow at all.
It is a top layer: it uses recovery's decisions and launches the CLI as a process, and no
module below it (recovery included) imports it.
"""
