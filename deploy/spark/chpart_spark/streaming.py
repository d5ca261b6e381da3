"""Structured Streaming: `foreachBatch` sinks that load each micro-batch exactly once.

    query = (stream.writeStream
             .foreachBatch(chpart_spark.foreach_batch("db.events", "/etc/chpart/chpart.toml"))
             .option("checkpointLocation", "/checkpoints/events")
             .start())

Each micro-batch is one chpart load whose id is derived from the streaming query's id (kept in
the checkpoint, the same across restarts) and the batch id: `<query id>.<batch id>`. Spark
replays a batch whose end it did not record (the driver died after the sink ran, or during
it) with the same data; the replay runs the same load, which `chpart_spark.write` (or the JVM
connector) then finishes or skips from the ledger:

- committed by the first run: nothing is done (no Spark job);
- its commit recorded its plan: the commit is finished from the ledger, no Spark job;
- open without a plan (the driver died during the job): the job runs again, the new attempts
  win, the earlier attempts' parts are losers for `chpart gc`.
"""

import re

from .writer import _ID, write

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark's StreamExecution on the batch's thread


def batch_load_id(query_id, batch_id, prefix=None):
    """The load id of one micro-batch: `[<prefix>.]<query id>.<batch id>`."""
    load = f"{prefix}.{query_id}.{int(batch_id)}" if prefix else f"{query_id}.{int(batch_id)}"
    if not _ID.match(load):
        raise ValueError(f"load id {load!r} of batch {batch_id} is not a chpart load id (1-128 of [A-Za-z0-9._-], "
                         "not starting with . or -, without ..)")
    return load


def streaming_query_id(batch_df):
    """The id of the streaming query running this micro-batch (stable across restarts from
    the same checkpoint, unlike its run id)."""
    query_id = batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if not query_id or not re.fullmatch(r"[0-9a-fA-F-]{36}", query_id):
        raise RuntimeError(f"no streaming query id in the Spark local property {QUERY_ID_PROPERTY} ({query_id!r}): "
                           "call the sink from foreachBatch, or give foreach_batch(query_id=...)")
    return query_id


def foreach_batch(table, config=None, *, query_id=None, prefix=None, connector=False, on_batch=None, **options):
    """A `foreachBatch` function loading each micro-batch into ``table`` as the load
    `[<prefix>.]<query id>.<batch id>` (see the module doc).

    - ``query_id``: the streaming query's id; default: read in each batch from Spark.
    - ``connector``: True writes through the JVM connector (`format("chpart")`, the jar on the
      classpath); ``options`` are then its options (`chpart`, `visibility`, `env.NAME`, ...).
      Otherwise ``options`` go to `chpart_spark.write` (`chpart`, `visibility`, `verify`,
      `extra_env`, `via`, ...), which itself writes through the connector when its jar is
      loadable (``via="auto"``); its mode is always append.
    - ``on_batch``: ``callable(batch_id, load_id, summary)`` after each batch (summary: the
      write's, None through the connector), e.g. for logging.
    """

    def sink(batch_df, batch_id):
        load = batch_load_id(query_id or streaming_query_id(batch_df), batch_id, prefix)
        if connector:
            writer = batch_df.write.format("chpart").mode("append").option("table", table).option("load", load)
            if config is not None:  # optional: the config may be spark.chpart.* conf and options alone
                writer = writer.option("config", config)
            for key, value in options.items():
                writer = writer.option(key, value)
            writer.save()
            summary = None
        else:
            summary = write(batch_df, table, load, config, mode="append", **options)
        if on_batch is not None:
            on_batch(batch_id, load, summary)

    return sink
