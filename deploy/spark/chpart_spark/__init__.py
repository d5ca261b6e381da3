"""chpart_spark: exactly-once loads from PySpark into ClickHouse through the `chpart` CLI.

    import chpart_spark
    summary = chpart_spark.write(df, table="db.events", load_id="events-2026-11-30T09",
                                 config="/etc/chpart/chpart.toml")

See deploy/spark/README.md.
"""

from ._cli import ChpartError, CommitError, EXIT_MEANINGS
from .writer import abort, arrow_schema, gc, status, write
from .checksum import Checksum, batches_checksum, clickhouse_checksum, spark_checksum
from .streaming import batch_load_id, foreach_batch

__version__ = "0.1.0"
__all__ = [
    "write", "abort", "status", "gc", "arrow_schema",
    "ChpartError", "CommitError", "EXIT_MEANINGS",
    "Checksum", "spark_checksum", "clickhouse_checksum", "batches_checksum",
    "foreach_batch", "batch_load_id",
]
