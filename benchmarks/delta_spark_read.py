"""Read a Delta table with Spark and delta-spark, as a Spark user does, and write its rows as JSON.

    .venv-delta-spark/bin/python -m benchmarks.delta_spark_read --table s3a://results/N \\
        --classpath JARS --result rows.json

``spark.read.format("delta").load(table)``, every row as a JSON object, one list. Run by the
interpreter of the second environment (``make delta-spark-env``, delta_spark_env.py), so it
imports only the standard library, PySpark and delta-spark: the tests and ``python -m benchmarks
delta`` use it to check that Spark reads this project's Delta tables as delta-rs does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.structured_streaming_delta import delta_session


def main(argv: list[str] | None = None) -> int:
    """Read ``--table`` and write its rows to ``--result``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", required=True, help="the s3a:// (or local) Delta table")
    parser.add_argument("--classpath", required=True, help="the driver's jars (delta_spark_env.driver_classpath)")
    parser.add_argument("--result", required=True, help="the JSON file for the rows")
    args = parser.parse_args(argv)
    spark = delta_session("delta-spark-read", 1, 1, args.classpath)
    try:
        rows = [r.asDict() for r in spark.read.format("delta").load(args.table).collect()]
    finally:
        spark.stop()
    Path(args.result).write_text(json.dumps(rows, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
