"""Stream and batch pipelines that survive failure.

The package follows the data's way through the system:
``spec`` (YAML → validated models) → ``plan`` (offset ranges per epoch, key groups)
→ ``execution`` (Spark reads, transforms, keyed state) → ``sink`` (epoch files)
→ ``checkpoint`` (manifests, head pointer, restore) on top of ``storage`` (S3 / local dir).
``localstack`` runs the embedded broker + S3 server for laptops and tests.
"""

__version__ = "0.1.0"
