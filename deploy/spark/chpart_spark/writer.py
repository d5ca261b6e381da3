"""`write()`: one exactly-once load of a Spark DataFrame into a ClickHouse table.

Two ways to run the job, one protocol (`chpart begin`, a build per task attempt, `chpart commit`
of exactly one manifest per Spark partition):

- through the JVM connector, `df.write.format("chpart")`, when its jar is loadable in the
  session's JVM: Spark's commit coordinator lets one attempt per partition publish, and the
  rows are clustered by the table's partition key (one part per table partition);
- in Python: `chpart begin` -> one Spark job (`df.mapInArrow(...)`, each task runs `chpart
  build` and returns its manifest) -> `collect()` (exactly one manifest per partition: the
  attempt Spark accepted first) -> the winners as JSON lines in a file -> `chpart commit`.

`choose_path()` decides which (argument ``via``); the summary is the same either way.
"""

import json
import logging
import os
import re
import secrets
import subprocess
import tempfile
import time
import warnings

from . import _cli
from ._cli import ChpartError, CommitError

MODES = ("append", "replace", "overwrite")
VISIBILITIES = ("partition", "part")
VERIFIES = ("auto", "server", "full", "sizes")
VIAS = ("auto", "connector", "python")
# The connector's option `layout` (deploy/spark/connector): Spark clusters the rows by the
# table's partition key ("table") or keeps the job's partitioning ("none").
LAYOUTS = ("table", "none")
# The JVM connector's DataSource (deploy/spark/connector): loadable iff its jar is on the
# session's classpath.
CONNECTOR_CLASS = "chpart.spark.ChpartDataSource"
_ID = re.compile(r"^(?!\.|-)(?!.*\.\.)[A-Za-z0-9._-]{1,128}$")

# What each task returns: one row, whatever its partition held.
RESULT_SCHEMA = "partition INT, attempt STRING, manifest STRING"

log = logging.getLogger("chpart_spark")


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def arrow_schema(spark_schema):
    """The Arrow schema the tasks stream to `chpart build`: Spark's own conversion, with
    every TimestampType as Timestamp(us, "UTC") (an instant; the session time zone only
    changes how Spark shows it) and TimestampNTZType as a zone-less Timestamp(us)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


def _conform(batch, schema):
    """A batch from mapInArrow in the declared schema: only metadata changes in practice
    (the session time zone on timestamps, string vs large_string), done by Arrow casts."""
    import pyarrow as pa

    if batch.schema.equals(schema, check_metadata=False):
        return batch
    columns = []
    for column, field in zip(batch.columns, schema):
        columns.append(column if column.type.equals(field.type) else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# The largest taskAttemptId (a Java long), for checking the longest attempt id on the driver.
_MAX_TASK_ATTEMPT_ID = 2**63 - 1


def attempt_prefix(spark_context, nonce):
    """`<applicationId>.<application attempt>.<nonce>`: what every attempt id of one `write()`
    starts with, before `.<taskAttemptId>`.

    `taskAttemptId` is unique within one application attempt only: a YARN application attempt
    keeps the application id and starts task attempt ids at 0 again, so the application attempt
    id (Spark's `applicationAttemptId()`, a Scala Option) is part of the id. Where Spark has
    none (local, standalone, Kubernetes), the driver's start time in milliseconds stands in
    (`s<startTime>`): a restarted driver gets another. `nonce` is random, drawn once per
    `write()` on the driver, so two writes of one driver, or drivers that agree on everything
    else, never share an attempt id either.
    """
    option = spark_context._jsc.sc().applicationAttemptId()
    if option.isDefined():
        app_attempt = re.sub(r"[^A-Za-z0-9_-]", "-", str(option.get()))
    else:
        app_attempt = f"s{spark_context.startTime}"
    prefix = f"{spark_context.applicationId}.{app_attempt}.{nonce}"
    longest = f"{prefix}.{_MAX_TASK_ATTEMPT_ID}"
    if not _ID.match(longest):
        raise ValueError(f"attempt ids {prefix}.<taskAttemptId> are not valid chpart attempt ids "
                         f"(at most 128 of [A-Za-z0-9._-], not starting with . or -, without ..): "
                         f"application id {spark_context.applicationId!r}")
    return prefix


def connector_loaded(spark):
    """Whether the session's JVM can load the connector's DataSource, i.e. whether
    `df.write.format("chpart")` resolves: its jar was on the classpath when the JVM started
    (`spark.jars`, `spark-submit --jars`). Never raises: a session without a JVM (Spark Connect)
    has no connector."""
    try:
        jvm = spark.sparkContext._jvm
        # The loader Spark resolves data sources with (Utils.getContextOrSparkClassLoader): the
        # thread's context loader, which holds the jars of spark.jars.
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(CONNECTOR_CLASS, False, loader)
        return True
    except Exception:
        return False


def choose_path(via, spark, *, after_build=None, layout=None, target_part_bytes=None):
    """("connector" | "python", why): how `write()` runs its job.

    - ``via="python"``: the mapInArrow tasks; a ValueError if the call asks for something only
      the connector has (``layout``).
    - ``via="connector"``: `format("chpart")`; a ValueError if the call asks for something only
      the Python tasks have (the test hook ``_after_build``) or the jar is not loadable.
    - ``via="auto"``: the connector when its jar is loadable and nothing Python-only is asked
      for; else the Python tasks, unless something connector-only is asked for: then a
      ValueError, never a silent fallback that would drop it.
    """
    _check_choice("via", via, VIAS)
    python_only = ["_after_build (a test hook run inside the Python tasks)"] if after_build is not None else []
    connector_only = [f"{name}={value!r} (the connector's option)"
                      for name, value in (("layout", layout), ("target_part_bytes", target_part_bytes))
                      if value is not None]
    if python_only and connector_only:
        raise ValueError(f"{', '.join(python_only)} needs the Python tasks and {', '.join(connector_only)} "
                         "the connector: no path honours both")
    if via == "python":
        if connector_only:
            raise ValueError(f'via="python" cannot honour {", ".join(connector_only)}: the Python tasks keep the '
                             "DataFrame's partitioning (use via=\"connector\" or \"auto\", or repartition the "
                             "DataFrame yourself)")
        return "python", 'asked for (via="python")'
    if via == "connector" or connector_only:
        asked = 'via="connector"' if via == "connector" else ", ".join(connector_only)
        if python_only:
            raise ValueError(f'{asked} cannot honour {", ".join(python_only)}: it has no connector '
                             'counterpart (use via="python" or "auto")')
        if not connector_loaded(spark):
            raise ValueError(f'{asked}: {CONNECTOR_CLASS} is not loadable in this session\'s JVM: put '
                             'chpart-spark.jar on the classpath when the session starts (spark.jars or '
                             'spark-submit --jars; deploy/spark/build-connector.sh builds it)')
        return "connector", f"asked for ({asked})"
    if python_only:
        return "python", f"{', '.join(python_only)} has no connector counterpart"
    if not connector_loaded(spark):
        return "python", f"the JVM connector ({CONNECTOR_CLASS}) is not on this session's classpath"
    return "connector", f"the JVM connector ({CONNECTOR_CLASS}) is on this session's classpath"


def _make_task(*, chpart, config, load_id, attempt_prefix, schema, extra_env, after_build, package_sha256=None):
    """The function each Spark task runs (pickled by value with its closure). With
    ``package_sha256`` (the driver runs chpart_spark's own binary) each task runs its own
    install's, checked to be the same bytes; else ``chpart``."""

    def task(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId()
        # taskAttemptId is the only per-attempt number unique within the application attempt
        # (partitionId/attemptNumber repeat across stage attempts); the prefix makes it unique
        # across application attempts and writes (see attempt_prefix).
        attempt = f"{attempt_prefix}.{ctx.taskAttemptId()}"
        context = f"load {load_id}, partition {partition}, attempt {attempt} (attempt number {ctx.attemptNumber()})"
        binary = _cli.checked_package_binary(package_sha256, context) if package_sha256 else chpart
        argv = [
            binary, "build", "--load", load_id,
            "--partition", str(partition), "--attempt", attempt,
            "--stage", str(ctx.stageId()), "--attempt-number", str(ctx.attemptNumber()),
            "--input", "-", "--die-with-parent",
        ]
        try:
            # From this (the worker's main) thread: --die-with-parent ties chpart to it.
            # The config the driver resolved, in the environment (never argv): relative paths in
            # it resolve in this executor's working directory (--files, --archives).
            env = _cli.child_env(extra_env)
            env.pop("CHPART_CONFIG", None)
            env[_cli.CONFIG_TOML_ENV] = config
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            )
        except OSError as e:
            raise ChpartError("build", 127, f"cannot run {binary!r} on this executor: {e}", argv, context) from None
        stderr = _cli.StderrTail(proc.stderr)
        stdout = _cli.StdoutCollector(proc.stdout)
        # An OSError (EPIPE) while writing means chpart stopped reading: its exit status and
        # stderr say why, so writing just stops. Any other failure is ours (below).
        try:
            try:
                writer = pa.ipc.new_stream(proc.stdin, schema)
            except OSError:
                writer = None
            if writer is not None:
                for batch in batches:
                    batch = _conform(batch, schema)
                    try:
                        writer.write_batch(batch)
                    except OSError:
                        writer = None
                        break
            if writer is not None:
                try:
                    writer.close()  # the end-of-stream marker: the input is complete
                    proc.stdin.close()
                except OSError:
                    pass
        except BaseException:
            # Our side failed (conversion, interrupted task): chpart must not publish a
            # partial input, so it is killed before its stdin sees a clean end of stream.
            proc.kill()
            proc.wait()
            raise
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
        code = proc.wait()
        out = stdout.text()
        err = stderr.text()
        if code != 0:
            raise ChpartError("build", code, err, argv, context)
        line = _cli.last_line(out)
        try:
            manifest = json.loads(line)
        except ValueError:
            raise ChpartError("build", code, f"no manifest on stdout (got {out[-500:]!r}); stderr:\n{err}", argv, context) from None
        if manifest.get("load") != load_id or manifest.get("attempt", {}).get("id") != attempt:
            raise ChpartError("build", code, f"the manifest is not this attempt's: {line[:500]}", argv, context)
        if after_build is not None:
            after_build(ctx, manifest)  # TEST HOOK (see write(_after_build=...))
        yield pa.RecordBatch.from_pylist(
            [{"partition": partition, "attempt": attempt, "manifest": line}],
            schema=pa.schema([("partition", pa.int32()), ("attempt", pa.string()), ("manifest", pa.string())]),
        )

    return task


def _write_winners(path, manifests):
    """Atomically (tmp + fsync + rename): a winners file either holds every winner or does
    not exist, so finding one means the job finished."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".chpart-winners-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            for line in manifests:
                f.write(line.strip() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_winners(path, load_id):
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    loads = set()
    for line in lines:
        try:
            loads.add(json.loads(line).get("load"))
        except ValueError:
            raise ValueError(f"{path} is not a winners file (JSON lines of manifests)") from None
    if loads - {load_id}:
        raise ValueError(f"{path} holds manifests of load(s) {sorted(loads - {load_id})}, not {load_id!r}: "
                         "refusing to reuse it (pass another winners_path)")
    return lines


def write(df, table, load_id, config=None, mode="append", visibility="partition", chpart=None,
          verify="auto", extra_env=None, *, options=None, winners_path=None, via="auto", layout=None,
          target_part_bytes=None, _after_build=None):
    """Loads ``df`` into the ClickHouse table ``table`` ("db.table") exactly once, as load
    ``load_id``, and returns the commit summary (a dict, see below).

    - ``config``: a chpart config file on the driver (optional). The config is, lowest
      precedence first: this file, Spark conf ``spark.chpart.<section>.<key>`` (e.g.
      ``spark.chpart.clickhouse.url``), and ``options``. The driver resolves and validates it
      once (`chpart config`) and hands the result to every task in its environment
      (``CHPART_CONFIG_TOML``): executors need no config file.
    - ``options``: chpart config keys by dotted name, e.g. ``{"clickhouse.url": ...,
      "staging.root": ..., "clickhouse_local.command": "ch/clickhouse local"}``; they win over
      the conf. Keys that look like secrets are refused, here and in the conf (Spark shows conf
      in its UI and event log): a password comes from a file shipped with ``--files``
      (``clickhouse.password_file``, relative: resolved in each executor's working directory),
      an environment variable named by ``clickhouse.password_env``, or
      ``CHPART_CLICKHOUSE_PASSWORD``.
    - ``mode``: "append" adds the rows; "replace" replaces every table partition the load
      touches (historical reloads); "overwrite" replaces the whole table at once (the rows
      become its only rows, swapped in by EXCHANGE TABLES: an Atomic database; a daily
      snapshot). Both require visibility "partition".
    - ``visibility``: "partition" (each partition appears at once, through a shadow table)
      or "part".
    - ``chpart``: the binary (a name on PATH or a path valid on the driver and executors).
      Default: $CHPART_BIN, else the binary a chpart_spark wheel carries (each executor runs
      its own install's, checked against the driver's sha256), else `chpart` on PATH.
      Through the connector, the package's binary is not passed on: the jar runs its own.
    - ``verify``: `chpart commit --verify`: "auto" (the default: the server checks every
      part's content before a partition is published, or sha256 on the host with part
      visibility), "server", "full" or "sizes" (no content check).
    - ``extra_env``: environment variables added to every chpart invocation (begin, build,
      commit, abort), e.g. ``CHPART_CLICKHOUSE_PASSWORD`` or other ``CHPART_*`` overrides.
    - ``winners_path``: where the winning manifests are written (default: a temp file). It
      is deleted after a successful commit and kept when the commit fails. If it already
      exists with this load's manifests (a previous run's commit failed or its driver died
      after the job), the Spark job is skipped and the commit is resumed from it. No file is
      needed to recover, though: a load whose commit recorded its plan is resumed from the
      ledger alone (`chpart commit --load` without winners), on any driver.
    - ``via``: how the job runs (see `choose_path`). "auto" (the default): through the JVM
      connector, `df.write.format("chpart")` with the arguments above as its options (mode
      replace as Spark's "overwrite"), when its jar is loadable in the session's JVM and no
      test hook is given; else through Python tasks (`mapInArrow`). "connector" or "python"
      insist on one. The connector lets only the attempt Spark's commit coordinator authorized
      publish, and clusters the rows by the table's partition key (one part per table
      partition); the Python tasks keep the DataFrame's partitioning and every attempt
      publishes (`collect()` names the winners).
    - ``layout``: the connector's option `layout`: "table" (its default: the rows clustered by
      the table's partition key) or "none" (the DataFrame's own
      partitioning). Only the connector has it: given with via="python" it is refused, and with
      via="auto" it needs the connector's jar (refused without it rather than dropped).
    - ``target_part_bytes``: the connector's option of that name (an int, bytes): with the
      default layout, a table partition whose share of Spark's shuffle is larger is split over
      several tasks, a part each (faster, more for the server to merge); connector-only like
      ``layout``.
    - ``_after_build``: TEST HOOK, not for production: ``callable(task_context, manifest)``
      run inside each Python task after its ``chpart build`` published its parts and before the
      task returns; raising from it fails that attempt after it published (tests and the
      quickstart use it to force a losing attempt). Only the Python tasks have it: with it,
      "auto" takes the Python path.

    The summary is `chpart commit --json`'s (load, table, mode, visibility, partitions,
    parts, rows, winners as [partition, attempt] pairs) plus ``spark_partitions``,
    ``application_id``, ``seconds`` ({begin, job, commit, total}; through the connector, whose
    save() runs all three, {begin: None, job: None, commit: None, write, total}), ``via``
    ("connector" or "python": what ran the Spark job; None when none ran), ``resumed`` (commit
    resumed from an existing winners file or from the ledger's plan, without a Spark job) and
    ``already_committed`` (the load had been committed by an earlier run: nothing was done).

    Failures: a failed ``chpart begin`` raises ChpartError. If the Spark job (or anything
    before the commit) fails, the load is aborted (`chpart abort`) and the exception is
    re-raised; a task's failure message carries chpart's exit code and stderr tail. If the
    commit fails, CommitError is raised with ``winners_path`` kept; the load stays open. The
    connector path raises the same: its driver-side chpart failures become ChpartError /
    CommitError, a failed job stays Spark's exception (the connector has aborted the load).
    """
    _check_choice("mode", mode, MODES)
    _check_choice("visibility", visibility, VISIBILITIES)
    _check_choice("verify", verify, VERIFIES)
    if layout is not None:
        _check_choice("layout", layout, LAYOUTS)
    if target_part_bytes is not None and (isinstance(target_part_bytes, bool) or not isinstance(target_part_bytes, int)
                                          or target_part_bytes <= 0):
        raise ValueError(f"target_part_bytes must be a positive int (bytes); got {target_part_bytes!r}")
    if mode != "append" and visibility != "partition":
        raise ValueError(f'mode="{mode}" requires visibility="partition"')
    if not _ID.match(load_id or ""):
        raise ValueError(f"load_id {load_id!r} must be 1-128 of [A-Za-z0-9._-], not starting with . or -, without ..")
    config_file = None if config is None else os.path.abspath(str(config))
    chpart = _cli.resolve_binary(chpart)
    package_sha256 = None
    if chpart == _cli.PACKAGE_BINARY:
        _cli.checked_package_binary(context=f"load {load_id}")
        package_sha256 = _cli.package_binary_sha256()
    spark = df.sparkSession
    keys, origins = config_keys(spark, options)
    config = _cli.resolve_config(chpart, config_file, keys, origins, extra_env)
    # Decided first: via="connector" with a Python-only argument, or without the jar, fails
    # before anything runs.
    path, why = choose_path(via, spark, after_build=_after_build, layout=layout,
                            target_part_bytes=target_part_bytes)
    t0 = time.monotonic()
    seconds = {"begin": 0.0, "job": 0.0, "commit": 0.0}
    common = dict(chpart=chpart, config=config, load_id=load_id, extra_env=extra_env)

    # An earlier run's state decides first, the same for both paths (neither needs a Spark job).
    if winners_path and os.path.exists(winners_path):
        lines = _read_winners(winners_path, load_id)
        log.info("load %s: resuming the commit from %s (%d winners; no Spark job)", load_id, winners_path, len(lines))
        summary = _commit(winners_path=winners_path, partitions=len(lines), verify=verify,
                          visibility=visibility, seconds=seconds, **common)
        os.unlink(winners_path)
        seconds["total"] = time.monotonic() - t0
        summary.update(spark_partitions=len(lines), application_id=None, seconds=seconds, via=None, resumed=True,
                       already_committed=False)
        return summary

    schema = arrow_schema(df.schema)  # unsupported column types fail here, before begin
    app_id = spark.sparkContext.applicationId

    t = time.monotonic()
    status = _load_status(**common)
    if status is not None and status.get("state") == "committed":
        # A re-run of a load that an earlier run committed does nothing and reports it.
        done = _summary_of(status)
        log.info("load %s is already committed (%s rows): nothing to do", load_id, done.get("rows"))
        done.update(spark_partitions=None, application_id=app_id, via=None, resumed=False, already_committed=True,
                    seconds={"begin": time.monotonic() - t, "job": 0.0, "commit": 0.0, "total": time.monotonic() - t0})
        return done
    if status is not None and status.get("state") == "open" and _planned(status):
        # An earlier run's commit recorded its plan (with the winners' manifests) and did not
        # finish: finish it from the ledger; running the job again would bring other winners.
        log.info("load %s: an earlier commit recorded its plan; resuming it from the ledger (no Spark job)", load_id)
        summary = _commit(winners_path=None, partitions=None, verify=verify, visibility=visibility,
                          seconds=seconds, **common)
        seconds["total"] = time.monotonic() - t0
        summary.update(spark_partitions=None, application_id=app_id, seconds=seconds, via=None, resumed=True,
                       already_committed=False)
        return summary

    if path == "connector":
        log.info('load %s: through the JVM connector, df.write.format("chpart"): %s', load_id, why)
        return _write_through_connector(df, table=table, mode=mode, visibility=visibility, verify=verify,
                                        layout=layout, target_part_bytes=target_part_bytes,
                                        winners_path=winners_path, app_id=app_id, t0=t0, status=status,
                                        config_file=config_file, options=options or {}, **common)
    log.info("load %s: through Python tasks (mapInArrow): %s", load_id, why)
    prefix = attempt_prefix(spark.sparkContext, secrets.token_hex(6))
    _cli.run_json(chpart, "begin", ["--table", table, "--load", load_id, "--mode", mode, "--visibility", visibility],
                  config, extra_env, context=f"load {load_id}")
    seconds["begin"] = time.monotonic() - t
    log.info("load %s opened on %s (mode %s, visibility %s); attempt ids %s.<taskAttemptId>", load_id, table,
             mode, visibility, prefix)

    own_winners_file = winners_path is None
    try:
        t = time.monotonic()
        task = _make_task(chpart=chpart, config=config.toml, load_id=load_id, attempt_prefix=prefix, schema=schema,
                          extra_env=extra_env, after_build=_after_build, package_sha256=package_sha256)
        with warnings.catch_warnings():
            # pyspark 4.3 warns that pandas >= 3 is not fully supported; mapInArrow uses none of it.
            warnings.simplefilter("ignore", FutureWarning)
            results = df.mapInArrow(task, RESULT_SCHEMA).rdd
        # The RDD's partitions are the job's tasks; with AQE, asking for them runs the
        # upstream stages first, so the count is the one collect() uses.
        partitions = results.getNumPartitions()
        log.info("load %s: Spark job of %d task(s), each streaming its partition into chpart build", load_id, partitions)
        rows = results.collect()  # exactly one row per partition: the first successful attempt's
        seconds["job"] = time.monotonic() - t
        by_partition = {}
        for row in rows:
            if row.partition in by_partition:
                raise RuntimeError(f"two results for partition {row.partition}: Spark returned {len(rows)} rows "
                                   f"for {partitions} partitions")
            by_partition[row.partition] = row.manifest
        if sorted(by_partition) != list(range(partitions)):
            raise RuntimeError(f"expected one manifest for each of the partitions 0..{partitions - 1}, "
                               f"got partitions {sorted(by_partition)}")
        if own_winners_file:
            fd, winners_path = tempfile.mkstemp(prefix=f"chpart-winners-{load_id}-", suffix=".jsonl")
            os.close(fd)
        _write_winners(winners_path, [by_partition[p] for p in range(partitions)])
        log.info("load %s: %d winning manifest(s) collected in %.1fs -> %s", load_id, partitions, seconds["job"],
                 winners_path)
    except BaseException as failure:
        log.error("load %s: the job failed (%s); aborting the load", load_id, type(failure).__name__)
        _abort_after(failure, **common)
        if own_winners_file and winners_path:
            try:
                os.unlink(winners_path)
            except OSError:
                pass
        raise

    summary = _commit(winners_path=winners_path, partitions=partitions, verify=verify, visibility=visibility,
                      seconds=seconds, **common)
    os.unlink(winners_path)
    seconds["total"] = time.monotonic() - t0
    log.info("load %s committed: %s rows in %s part(s), %s partition(s), commit %.2fs",
             load_id, summary.get("rows"), summary.get("parts"), summary.get("partitions"), seconds["commit"])
    summary.update(spark_partitions=partitions, application_id=app_id, seconds=seconds, via="python", resumed=False,
                   already_committed=False)
    return summary


def _write_through_connector(df, *, table, mode, visibility, verify, layout, target_part_bytes, winners_path, app_id,
                             t0, status, chpart, config, config_file, options, load_id, extra_env):
    """`df.write.format("chpart")` with write()'s arguments as the connector's options; the
    summary from the connector's `chpart commit` (Spark's write API returns nothing), or where
    the connector kept none, from `chpart status` afterwards.

    ``status`` (the load's entry that write() has just read, None if never begun) is handed to the
    connector in the same JVM (chpart.spark.ChpartHandoff), which then plans from it rather than
    reading the ledger again, and hands its commit's summary back: one load costs the ledger two
    status reads fewer. A jar without ChpartHandoff reads both itself, as before.

    The connector runs the same protocol on the JVM (ChpartBatchWrite: `chpart status`, `begin`,
    a build per task attempt that its commit coordinator authorized, `commit` of exactly Spark's
    commit messages, `abort` if the job fails), with its default layout (option `layout=table`)
    unless ``layout`` says otherwise."""
    # replace and overwrite = Spark's overwrite, which the connector maps to chpart's replace
    # mode of the partitions written (its option overwrite=partitions, the default) or, with
    # overwrite=table, to chpart's overwrite mode of the whole table.
    writer = (df.write.format("chpart").mode("append" if mode == "append" else "overwrite")
              .option("table", table).option("load", load_id)
              .option("visibility", visibility).option("verify", verify))
    if mode != "append":
        writer = writer.option("overwrite", "table" if mode == "overwrite" else "partitions")
    if chpart != _cli.PACKAGE_BINARY:  # the package's binary is not on the executors' paths: the jar has its own
        writer = writer.option("chpart", chpart)
    if config_file is not None:
        writer = writer.option("config", config_file)
    for key, value in options.items():  # the connector reads spark.chpart.* conf itself
        writer = writer.option(key, str(value))
    if winners_path:
        writer = writer.option("winners_path", os.path.abspath(winners_path))
    if layout is not None:
        writer = writer.option("layout", layout)
    if target_part_bytes is not None:
        writer = writer.option("target_part_bytes", str(target_part_bytes))
    for name, value in (extra_env or {}).items():
        writer = writer.option(f"env.{name}", str(value))
    handoff = _connector_handoff(df.sparkSession)
    t = time.monotonic()
    committed = None
    try:
        if handoff is not None:
            handoff.noteStatus(load_id, None if status is None else json.dumps(status))
        writer.save()
        if handoff is not None:
            committed = handoff.takeCommitted(load_id)
    except Exception as failure:
        error = _chpart_error_of(failure, load_id)
        if error is None:
            raise
        raise error from failure
    finally:
        if handoff is not None:
            # Only frees the JVM's entry for this load: a py4j failure here (the gateway gone
            # with the job) must not replace the write's own outcome or error.
            try:
                handoff.forget(load_id)
            except Exception as e:
                log.warning("chpart: could not clear the connector's hand-over entry of load %s: %s", load_id, e)
    write_secs = time.monotonic() - t
    if committed is not None:
        summary = {k: v for k, v in json.loads(committed).items() if k in _SUMMARY_KEYS}
    else:
        status = _load_status(chpart=chpart, config=config, load_id=load_id, extra_env=extra_env)
        if status is None or status.get("state") != "committed":
            raise RuntimeError(f'load {load_id}: df.write.format("chpart") returned but chpart status says the load '
                               f"is {None if status is None else status.get('state')!r}, not committed")
        summary = _summary_of(status)
    log.info("load %s committed through the connector: %s rows in %s part(s), %s partition(s), write %.1fs",
             load_id, summary.get("rows"), summary.get("parts"), summary.get("partitions"), write_secs)
    summary.update(spark_partitions=len(summary.get("winners") or []), application_id=app_id,
                   seconds={"begin": None, "job": None, "commit": None, "write": write_secs,
                            "total": time.monotonic() - t0},
                   via="connector", resumed=False, already_committed=False)
    return summary


def _chpart_error_of(failure, load_id):
    """The connector's driver-side chpart failure (begin, status, commit: a
    chpart.spark.ChpartException in the Java cause chain) as ChpartError / CommitError, with the
    same fields; None for anything else (a failed job stays Spark's exception, as on the Python
    path, its message carrying chpart's)."""
    throwable = getattr(failure, "_origin", None) or getattr(failure, "java_exception", None)
    for _ in range(32):  # a cause chain is short; this bounds a cyclic one
        if throwable is None:
            return None
        try:
            name = throwable.getClass().getName()
        except Exception:
            return None
        if name.startswith("chpart.spark.ChpartException"):
            break
        throwable = throwable.getCause()
    else:
        return None
    command = throwable.command()
    if command == "build":
        return None
    fields = (command, throwable.exitCode(), throwable.stderrTail(), list(throwable.argv()), f"load {load_id}")
    if name.endswith("$CommitException"):
        return CommitError(*fields, winners_path=throwable.winnersPath(), resume_hint=throwable.resumeHint())
    return ChpartError(*fields)


def _commit(*, chpart, config, load_id, extra_env, winners_path, partitions, verify, visibility, seconds,
            retries=3, backoff=(2, 5)):
    """`chpart commit`, retried on exit 3 (it is resumable); CommitError otherwise. Without
    ``winners_path`` it resumes a load whose plan is recorded, from the ledger alone."""
    args = ["--load", load_id, "--verify", verify, "--visibility", visibility]
    if winners_path is not None:
        args += ["--winners", winners_path, "--partitions", str(partitions)]
    hint = f"{chpart} commit " + " ".join(args) + f"   with {_cli.CONFIG_TOML_ENV} set to:\n{config.toml}"
    t = time.monotonic()
    for attempt in range(retries):
        try:
            summary = _cli.run_json(chpart, "commit", args, config, extra_env, context=f"load {load_id}")
            seconds["commit"] = time.monotonic() - t
            return summary
        except ChpartError as e:
            if e.retryable and attempt + 1 < retries:
                log.warning("load %s: commit failed with a retryable error, retrying: %s", load_id, e)
                time.sleep(backoff[min(attempt, len(backoff) - 1)])
                continue
            raise CommitError(e.command, e.exit_code, e.stderr_tail, e.argv, e.context, winners_path=winners_path,
                              resume_hint=hint) from None


def config_keys(spark, options):
    """The chpart config keys of a write: the session's ``spark.chpart.*`` conf, then
    ``options`` over it (see `merge_config_keys`)."""
    conf = dict(spark.sparkContext.getConf().getAll())
    try:
        conf.update(spark.conf.getAll)  # the session's runtime conf (pyspark >= 4.0: a property)
    except AttributeError:
        pass
    return merge_config_keys(conf, options)


def merge_config_keys(conf, options):
    """``spark.chpart.<key>`` entries of the Spark conf ``conf``, then the dotted ``options``
    over them: ({key: value}, {key: where it was given}). A key that looks like a secret is
    refused (ValueError) with where secrets go."""
    keys, origins = {}, {}
    for name, value in sorted(conf.items()):
        if name.startswith(_cli.CONF_PREFIX):
            key = name[len(_cli.CONF_PREFIX):]
            keys[key], origins[key] = value, f"spark conf {name}"
    for key, value in sorted((options or {}).items()):
        keys[key], origins[key] = str(value), f"option {key}"
    secret = [origins[k] for k in sorted(keys) if _cli.looks_secret(k)]
    if secret:
        raise ValueError(f"{', '.join(secret)} looks like a secret and is refused: {_cli.SECRET_ALTERNATIVES}")
    return keys, origins


def _load_status(*, chpart, config, load_id, extra_env):
    """The load's entry of `chpart status --json`, or None if it was never begun."""
    loads = _cli.run_json(chpart, "status", ["--load", load_id], config, extra_env, context=f"load {load_id}")
    return next((entry for entry in loads if entry.get("load") == load_id), None)


def _planned(status):
    """Whether an open load's commit recorded its plan (its winners), so that only
    `chpart commit --load` may finish it. For a load into one table that is `parts_planned`.
    For a load into a Distributed table, `parts_planned` sums the shards' plans and stays null
    until every shard has prepared, while the winners (the cluster plan, recorded before any
    shard prepares) are listed already: a commit stopped by a shard that did not answer leaves
    exactly that, and a new job's winners would be refused against the recorded ones."""
    return (status.get("parts_planned") is not None or bool(status.get("winners"))
            or status.get("decision") == "commit")


# A committed load's summary: the fields of `chpart commit --json`.
_SUMMARY_KEYS = ("load", "table", "mode", "visibility", "partitions", "parts", "rows", "winners")


def _connector_handoff(spark):
    """The connector's chpart.spark.ChpartHandoff in the session's JVM, or None (a jar from
    before it, or no JVM)."""
    try:
        handoff = spark.sparkContext._jvm.chpart.spark.ChpartHandoff
        handoff.forget("")  # resolves the class: py4j names a missing one as a package
        return handoff
    except Exception:
        return None


def _summary_of(status):
    """A committed load's summary, from its `chpart status` entry."""
    keys = ("load", "table", "mode", "visibility", "partitions", "rows", "winners")
    summary = {k: status.get(k) for k in keys}
    summary["parts"] = status.get("parts_planned")
    return summary


def _abort_after(failure, *, chpart, config, load_id, extra_env):
    try:
        _cli.run(chpart, "abort", ["--load", load_id, "--json"], config, extra_env, context=f"load {load_id}")
    except Exception as e:  # keep the job's failure as the one raised
        note = f"chpart_spark: aborting load {load_id} after the failure also failed: {e}"
        if hasattr(failure, "add_note"):
            failure.add_note(note)
        else:
            warnings.warn(note)


def abort(load_id, config, chpart=None, extra_env=None):
    """`chpart abort --json`: the removed items."""
    return _cli.run_json(_cli.resolve_binary(chpart), "abort", ["--load", load_id], config, extra_env)


def status(config, load_id=None, chpart=None, extra_env=None):
    """`chpart status --json`: a list of loads (state, plan, attempts with ``won``, gc_pending)."""
    args = ["--load", load_id] if load_id else []
    return _cli.run_json(_cli.resolve_binary(chpart), "status", args, config, extra_env)


def gc(config, chpart=None, extra_env=None, older_than=None, abort_stale=False):
    """`chpart gc --json`: what was removed, per finished load."""
    args = []
    if older_than:
        args += ["--older-than", older_than]
    if abort_stale:
        args.append("--abort-stale")
    return _cli.run_json(_cli.resolve_binary(chpart), "gc", args, config, extra_env)
