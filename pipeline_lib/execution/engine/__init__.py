"""Spark glue: the session, its errors, transforms and the epoch's partial aggregates (Spark SQL or Arrow path)."""
