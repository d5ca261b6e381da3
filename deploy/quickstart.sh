#!/usr/bin/env bash
# chpart's quickstart, on the embedded default: installs what is needed, builds chpart (release),
# starts a local ClickHouse 26.9 server under .run/quickstart/ (local transport: parts are moved
# into the server's detached/ on this machine, no SSH), generates an hour of web events in Spark
# and loads them with chpart_spark.write while one task attempt fails after it has published its
# parts, then shows what was loaded and the proof that every row is there exactly once, cleans
# up with `chpart gc` and stops the server. Then the path without Spark: the next hour's events as
# Parquet files, loaded with one `chpart load` (run twice: the second run is a no-op).
#
#   bash deploy/quickstart.sh                       # 600,000 events
#   QUICKSTART_ROWS=1000000 bash deploy/quickstart.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
ROWS="${QUICKSTART_ROWS:-600000}"
HOUR="${QUICKSTART_HOUR:-2026-11-30T09}"
RUN="$root/.run/quickstart"
TABLE="web.events"
PY="$root/.venv/bin/python"
CHPART="$root/target/release/chpart"
STEPS=7
started=$SECONDS
n=0

if [ -t 1 ]; then B=$'\033[1m'; G=$'\033[32m'; R=$'\033[31m'; D=$'\033[2m'; N=$'\033[0m'; else B=; G=; R=; D=; N=; fi
step() { n=$((n + 1)); printf '\n%s[%d/%d] %s%s %s(%ds)%s\n' "$B" "$n" "$STEPS" "$*" "$N" "$D" $((SECONDS - started)) "$N"; }
indent() { sed -u 's/^/  /'; }
fail() { printf '%s[quickstart] FAILED: %s%s\n' "$R" "$*" "$N" >&2; exit 1; }

step "Install (deploy/install.sh: Debian packages, .venv with chdb-core 26.9, pyspark 4.3.0, chpart_spark)"
bash deploy/install.sh 2>&1 | indent

step "Build chpart (cargo build --release; the first build takes a few minutes)"
cargo build --release --locked --bin chpart 2>&1 | grep -v '^\s*Compiling' | indent || fail "cargo build"
printf '  %s\n' "$("$CHPART" --version)"

step "Start the embedded ClickHouse 26.9 server (.run/quickstart, local transport)"
if [ -f "$RUN/run/server.pid" ]; then deploy/dev/clickhouse-server stop --run-dir "$RUN/run" 2>&1 | indent || true; fi
rm -rf "$RUN"
mkdir -p "$RUN/work" "$RUN/winners" "$RUN/spark-events" "$RUN/spark-conf"
read -r HTTP_PORT TCP_PORT < <("$PY" -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
stop_server() { deploy/dev/clickhouse-server stop --run-dir "$RUN/run" >/dev/null 2>&1 || true; }
trap stop_server EXIT
deploy/dev/clickhouse-server start --data "$RUN/data" --run-dir "$RUN/run" --http-port "$HTTP_PORT" --tcp-port "$TCP_PORT" | indent
URL="http://127.0.0.1:$HTTP_PORT"
cat > "$RUN/chpart.toml" <<EOF
# The embedded default: a ClickHouse server on this machine, parts published by rename.
[clickhouse]
url = "$URL"
request_timeout_secs = 300
[transport]
kind = "local"
[clickhouse_local]
# the chdb-backed clickhouse-local of this machine (a real clickhouse-local works the same)
command = "$root/deploy/dev/clickhouse-local"
work_dir = "$RUN/work"
[staging]
root = "$RUN/data/chpart-staging"
[ledger]
database = "chpart"
EOF
ch() { curl -sS --fail-with-body "$URL/" --data-binary "$1"; }
ch "CREATE DATABASE IF NOT EXISTS web"
ch "$("$PY" deploy/spark/examples/load_events.py --print-ddl --table "$TABLE")"
printf '  config %s\n  table  %s:\n' "${RUN#"$root/"}/chpart.toml" "$TABLE"
ch "SELECT name, type FROM system.columns WHERE database = 'web' AND table = 'events' FORMAT TSVRaw" \
  | awk -F'\t' '{ printf "    %-12s %s\n", $1, $2 }'

step "Spark job: $("$PY" -c "print(f'{$ROWS:,}')") events of $HOUR:00 UTC -> $TABLE through chpart_spark.write (one attempt fails on purpose)"
# Spark's own logs stay quiet except errors; the injected task failure is reported below from
# Spark's event log instead of as a stack trace.
cat > "$RUN/spark-conf/log4j2.properties" <<'EOF'
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = off
logger.pyrunner.name = org.apache.spark.api.python
logger.pyrunner.level = off
EOF
export NO_COLOR=1 SPARK_CONF_DIR="$RUN/spark-conf" PYSPARK_PYTHON="$PY" PYSPARK_DRIVER_PYTHON="$PY"
# pyspark 4.3 warns in every Python worker that pandas >= 3 (from chdb-core) is not fully supported.
export PYTHONWARNINGS="ignore:PySpark does not yet fully support pandas:FutureWarning"
job_started=$SECONDS
"$root/.venv/bin/spark-submit" \
  --master 'local[2,4]' --driver-memory 1g \
  --conf spark.ui.enabled=false --conf spark.ui.showConsoleProgress=true \
  --conf spark.sql.shuffle.partitions=4 \
  --conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false \
  --conf "spark.eventLog.dir=file://$RUN/spark-events" \
  --py-files tests/spark/chpart_testing.py \
  deploy/spark/examples/load_events.py \
  --config "$RUN/chpart.toml" --table "$TABLE" --hour "$HOUR" --rows "$ROWS" --partitions 4 \
  --chpart "$CHPART" --winners-dir "$RUN/winners" \
  --demo-fail-partition 1 --demo-marker "$RUN/failed-attempt.json" \
  --verify --event-log-dir "$RUN/spark-events" --report "$RUN/report.json" \
  2> >(grep -v -e 'incubator modules' -e "log4j profile" >&2) || fail "the Spark job failed (see above)"
printf '  spark-submit finished in %ds\n' $((SECONDS - job_started))

step "What was loaded, and the proof of exactly-once"
"$CHPART" status --config "$RUN/chpart.toml" --load "events-$HOUR" > "$RUN/status.txt" 2>/dev/null
"$PY" - "$RUN" "$URL" "$TABLE" "$G" "$R" "$N" <<'EOF' || fail "exactly-once check"
import json, sys, urllib.parse, urllib.request
run, url, table, green, red, off = sys.argv[1:]
def q(sql):
    with urllib.request.urlopen(url + "/?" + urllib.parse.urlencode({"query": sql})) as r:
        return r.read().decode().strip()
rep = json.load(open(f"{run}/report.json"))
s, v = rep["summary"], rep["verify"]
failed = rep["failed_attempts"]
loser = json.load(open(f"{run}/failed-attempt.json"))
db, name = table.split(".")
parts = q(f"SELECT count() FROM system.parts WHERE database = '{db}' AND table = '{name}' AND active")
waiting = q("SELECT count() FROM system.detached_parts WHERE database = 'web'")
secs = s["seconds"]
print(f"  loaded      {s['rows']:,} rows into {s['table']} as load {s['load']} ({s['mode']}, {s['visibility']} visibility)")
print(f"  parts       {s['parts']} part(s) attached (now {parts} active), {s['partitions']} ClickHouse partition(s), "
      f"{s['spark_partitions']} Spark partitions/tasks")
print(f"  time        {secs['total']:.1f}s: begin {secs['begin']:.2f}s, Spark job with chpart build {secs['job']:.1f}s, "
      f"commit {secs['commit']:.2f}s")
print(f"  Spark       event log of {rep['application_id']}: {len(failed)} failed task attempt(s)")
for a in failed:
    print(f"              task {a['task_id']}: partition {a['partition']}, attempt {a['attempt']}: {a['reason']} "
          f"(InjectedFailure after publishing {len(loser['parts'])} part(s))")
print("  winners     " + ", ".join(f"partition {p}: {att}" for p, att in s["winners"]))
print(f"  loser       {loser['attempt']} (partition {loser['partition']}): its retry won")
print("  chpart status:")
for line in open(f"{run}/status.txt"):
    print("    " + line.rstrip())
print(f"  the loser's parts wait in detached/ of the load's shadow table: {waiting} part(s), never attached")
ok = v["equal"] and v["source_rows"] == v["table_rows"] == s["rows"] and len(failed) == 1
mark = f"{green}identical{off}" if ok else f"{red}DIFFERENT{off}"
print(f"  source (Spark)       {v['source_rows']:>10,} rows  checksum {v['source_checksum']}")
print(f"  table (ClickHouse)   {v['table_rows']:>10,} rows  checksum {v['table_checksum']}   {mark}")
print(f"  (order-independent checksum over all {10} columns, chpart_spark.checksum)")
sys.exit(0 if ok else 1)
EOF

step "Without Spark: the next hour as Parquet files -> $TABLE with one chpart load (run twice)"
# Any batch job's shape: files in a directory. Here the server writes them (the Spark hour,
# an hour later), three files as a job's tasks would leave them, with Spark's _SUCCESS beside.
mkdir -p "$RUN/next-hour"
for k in 0 1 2; do
  ch "SELECT * REPLACE (event_time + INTERVAL 1 HOUR AS event_time) FROM $TABLE WHERE cityHash64(session_id) % 3 = $k FORMAT Parquet" \
    > "$RUN/next-hour/part-$k.parquet"
done
touch "$RUN/next-hour/_SUCCESS"
before=$(ch "SELECT count() FROM $TABLE")
for run in 1 2; do
  "$CHPART" load --config "$RUN/chpart.toml" --table "$TABLE" --load "events-$HOUR-next" \
    --input "$RUN/next-hour" --json 2>"$RUN/load-$run.log" >"$RUN/load-$run.json" \
    || { cat "$RUN/load-$run.log" >&2; fail "chpart load (run $run)"; }
  "$PY" - "$RUN/load-$run.json" "$run" <<'EOF' || fail "chpart load summary"
import json, sys
s = json.loads(open(sys.argv[1]).read().splitlines()[-1])
i = s["inputs"]
what = "nothing to do, already committed" if s["already_committed"] else f"{s['built_now']} build(s), commit, gc"
print(f"  run {sys.argv[2]}: {s['rows']:,} rows in {s['parts']} part(s) from {i['files']} file(s) "
      f"({i['bytes'] / 1e6:.1f} MB): {what}; {s['seconds']:.1f}s")
EOF
done
after=$(ch "SELECT count() FROM $TABLE")
printf '  %s rows before, %s after: the hour was added once, the second run changed nothing\n' "$before" "$after"
[ "$after" = $((before * 2)) ] || fail "chpart load did not add the hour exactly once"

step "Clean up: chpart gc removes what no load will attach; stop the server"
"$CHPART" gc --config "$RUN/chpart.toml" 2>&1 | sed -e 's/^[0-9TZ:.-]* *INFO //' | indent
left=$(ch "SELECT count() FROM system.detached_parts WHERE database = 'web'")
staged=$(find "$RUN/data/chpart-staging" -type f 2>/dev/null | wc -l)
rows=$(ch "SELECT count() FROM $TABLE")
printf '  after gc: %s part(s) in detached/, %s file(s) in staging, %s rows in %s\n' "$left" "$staged" "$rows" "$TABLE"
[ "$left" = 0 ] && [ "$staged" = 0 ] || fail "gc left something behind"
stop_server
trap - EXIT
printf '\n%s[quickstart] done in %ds: %s rows loaded exactly once (Spark, through a failed task attempt, and chpart load).%s\n' \
  "$G" $((SECONDS - started)) "$rows" "$N"
echo "  Next: deploy/spark/README.md (the PySpark API), README.md (commands, exit codes), bash deploy/test.sh"
