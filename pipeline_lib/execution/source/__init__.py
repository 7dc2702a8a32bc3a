"""The Kafka source: planned offset ranges read and decoded into Arrow in Spark's Python workers."""
