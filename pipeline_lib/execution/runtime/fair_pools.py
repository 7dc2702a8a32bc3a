"""The FAIR scheduler pool a pipeline's Spark jobs run in.

One Spark application runs a job's pipelines side by side (FAIR scheduling); by default each
pipeline has a pool of its own, so a busy pipeline does not starve the others. A run may instead
name one pool for all of them (``spark.scheduler.pool``, an allowed run setting): a job then
shares whatever the pool's definition gives it. Spark reads the pool from a thread's local
property only, so every thread that starts Spark jobs for a pipeline sets it.
"""

from __future__ import annotations

POOL_SETTING = "spark.scheduler.pool"


def pipeline_pool(spark, pipeline: str) -> str:
    """The pool of ``pipeline``'s jobs: the run's ``spark.scheduler.pool``, else the pipeline's name."""
    return spark.sparkContext.getConf().get(POOL_SETTING, None) or pipeline


def use_pipeline_pool(spark, pipeline: str) -> str:
    """Set this thread's pool for ``pipeline``'s jobs; return it."""
    pool = pipeline_pool(spark, pipeline)
    spark.sparkContext.setLocalProperty(POOL_SETTING, pool)
    return pool
