#!/usr/bin/env bash
# Where a commit's fixed server cost goes, statement by statement: starts its own ClickHouse 26.9
# server with system.query_log on free loopback ports, opens and builds small loads (one Spark
# partition, 1000 rows in 2 ClickHouse partitions, so 2 parts), commits each, and prints for the
# last commit every statement it sent with the server's CPU for it (user + system, from
# query_log's ProfileEvents), then per statement class the mean over the commits. With
# --partitions P --builds B each load is B builds (Spark partitions) of 1000 rows over P
# ClickHouse partitions, so B x P parts in P partitions, or in B x P partitions of one part each
# with --spread (--partitions 100 --builds 10 --spread: the ATTACH-rate load of `chpart-bench
# commit`; a build holds at most 100 partitions); the last commit's statements are then printed
# per class only.
# --transport sftp has the commit verify parts over SFTP through a loopback sshd of its own
# (deploy/dev/sshd.sh), as a driver on another host does; the builds stay local. The last commit's
# steps (its --events: plan, which includes verifying the waiting parts, claim, attach,
# publish, finish) are printed with their wall time.
#
#   bash crates/bench/scripts/commit-profile.sh [--loads N] [--visibility partition|part]
#        [--partitions P] [--builds B [--spread]] [--transport local|sftp] [--chpart BIN]
#
# The figures are the server's own accounting per query, so they hold on a noisy machine better
# than wall time; query_log itself adds a little to each.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
loads=5 visibility=partition partitions=2 builds=1 spread=0 transport=local chpart="$root/target/release/chpart"
while [ $# -gt 0 ]; do
  case "$1" in
    --loads) loads="$2"; shift 2 ;;
    --visibility) visibility="$2"; shift 2 ;;
    --partitions) partitions="$2"; shift 2 ;;
    --builds) builds="$2"; shift 2 ;;
    --spread) spread=1; shift ;;
    --transport) transport="$2"; shift 2 ;;
    --chpart) chpart="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "commit-profile: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$chpart" ] || { echo "commit-profile: no chpart binary at $chpart (cargo build --release, or --chpart)" >&2; exit 2; }
dir="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http="$(free_port)" tcp="$(free_port)"
stop() {
  "$root/deploy/dev/clickhouse-server" stop --run-dir "$dir/run" >/dev/null 2>&1 || true
  [ "$transport" = sftp ] && { bash "$root/deploy/dev/sshd.sh" stop --dir "$dir/sshd" >/dev/null 2>&1 || true; }
  rm -rf "$dir"
}
trap stop EXIT
cat > "$dir/logs.xml" <<'X'
<query_log><database>system</database><table>query_log</table><flush_interval_milliseconds>1000</flush_interval_milliseconds></query_log>
X
"$root/deploy/dev/clickhouse-server" start --data "$dir/data" --run-dir "$dir/run" --http-port "$http" \
  --tcp-port "$tcp" --config-extra "$dir/logs.xml" >/dev/null
url="http://127.0.0.1:$http"
ch() { curl -sS --fail-with-body "$url/" --data-binary "$1"; }
cat > "$dir/chpart.toml" <<T
[clickhouse]
url = "$url"
[transport]
kind = "local"
[clickhouse_local]
command = "$root/deploy/dev/clickhouse-local"
work_dir = "$dir/work"
[staging]
root = "$dir/data/chpart-staging"
[ledger]
database = "chpart"
T
commit_config="$dir/chpart.toml"
case "$transport" in
  local) ;;
  sftp)
    ssh_port="$(free_port)"
    bash "$root/deploy/dev/sshd.sh" start --dir "$dir/sshd" --port "$ssh_port" >/dev/null
    sed 's/^kind = "local"$/kind = "sftp"/' "$dir/chpart.toml" > "$dir/chpart-sftp.toml"
    cat >> "$dir/chpart-sftp.toml" <<T
[ssh]
host = "127.0.0.1"
port = $ssh_port
user = "root"
identity_file = "$dir/sshd/client_key"
known_hosts = "$dir/sshd/known_hosts"
T
    commit_config="$dir/chpart-sftp.toml" ;;
  *) echo "commit-profile: --transport is local or sftp, not $transport" >&2; exit 2 ;;
esac
ch "CREATE DATABASE db"
ch "CREATE TABLE db.t (ts DateTime('UTC'), id UInt64, name String) ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id"
for b in $(seq 0 $((builds - 1))); do
  # With --spread, build b has partitions of its own (months b*P .. b*P+P-1).
  ch "SELECT toDateTime('2026-01-15 00:00:00', 'UTC') + toIntervalMonth(number % $partitions + $((spread * b * partitions))) AS ts,
      number AS id, 'x' AS name FROM numbers(1000) FORMAT Parquet" > "$dir/in$b.parquet"
done
class="multiIf(query LIKE 'INSERT INTO \`chpart\`.\`ledger\`%', 'ledger INSERT', query LIKE 'SELECT load_id, entry_id%', 'ledger read',
  query LIKE '%system.detached_parts%', 'observation (parts + detached)', query LIKE '%system.mutations%', 'table check: mutations',
  query LIKE '%system.columns%', 'table check: columns', query LIKE '%FROM system.tables%', 'table check: definition',
  query LIKE '%ATTACH PART%', 'ATTACH PART (per part)', query LIKE '%MOVE PARTITION%', 'MOVE PARTITION (per partition)',
  query LIKE 'CHECK TABLE%', 'CHECK TABLE', query LIKE 'SYSTEM STOP MERGES%', 'SYSTEM STOP MERGES', 'other')"
cpu="(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds']) / 1e6"
windows=()
fail() { echo "commit-profile: chpart $1 failed:" >&2; cat "$dir/err" >&2; exit 1; }
for i in $(seq 1 "$loads"); do
  load="profile-$i"
  "$chpart" begin --config "$dir/chpart.toml" --load "$load" --table db.t --visibility "$visibility" >/dev/null 2> "$dir/err" || fail begin
  : > "$dir/w$i.jsonl"
  for b in $(seq 0 $((builds - 1))); do
    "$chpart" build --config "$dir/chpart.toml" --load "$load" --partition "$b" --attempt "a$i-$b" --input "$dir/in$b.parquet" > "$dir/m$i-$b.json" 2> "$dir/err" || fail build
    cat "$dir/m$i-$b.json" >> "$dir/w$i.jsonl"
  done
  from="$(ch "SELECT now64(6)")"
  "$chpart" commit --config "$commit_config" --load "$load" --winners "$dir/w$i.jsonl" --events "$dir/events$i.jsonl" >/dev/null 2> "$dir/err" || fail commit
  to="$(ch "SELECT now64(6)")"
  windows+=("(event_time_microseconds BETWEEN '$from' AND '$to')")
done
sleep 1.5
ch "SYSTEM FLUSH LOGS"
where="type = 'QueryFinish' AND query NOT LIKE 'SELECT now64(6)%' AND ($(IFS='|'; echo "${windows[*]}" | sed 's/|/ OR /g'))"
last="${windows[${#windows[@]}-1]}"
if [ "$((partitions * builds))" -le 20 ]; then
echo "== the last commit's statements ($visibility visibility): server CPU ms, wall ms, statement"
ch "SELECT round($cpu * 1000, 1), query_duration_ms, substring(replaceRegexpAll(query, '\\\\s+', ' '), 1, 100)
    FROM system.query_log WHERE type = 'QueryFinish' AND query NOT LIKE 'SELECT now64(6)%' AND $last ORDER BY event_time_microseconds FORMAT TSV"
fi
echo
echo "== per class, mean over $loads commits: statements per commit, server CPU ms per commit"
ch "SELECT $class AS class, round(count() / $loads, 1), round(sum($cpu) * 1000 / $loads, 1)
    FROM system.query_log WHERE $where GROUP BY class ORDER BY 3 DESC FORMAT TSV"
ch "SELECT 'all', round(count() / $loads, 1), round(sum($cpu) * 1000 / $loads, 1),
    'fixed (without ATTACH and MOVE):', round(sumIf($cpu, query NOT LIKE '%ATTACH PART%' AND query NOT LIKE '%MOVE PARTITION%') * 1000 / $loads, 1)
    FROM system.query_log WHERE $where FORMAT TSV"
echo
echo "== per class, the last commit ($((partitions * builds)) parts): statements, server CPU ms, wall ms (sum of the statements')"
ch "SELECT $class AS class, count(), round(sum($cpu) * 1000, 1), sum(query_duration_ms)
    FROM system.query_log WHERE type = 'QueryFinish' AND query NOT LIKE 'SELECT now64(6)%' AND $last GROUP BY class ORDER BY 3 DESC FORMAT TSV"
echo
echo "== the last commit's steps ($transport transport): wall ms, step"
python3 -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("step", "").startswith("commit") and not e.get("part") and e["step"] != "commit.publish_partition":
        print("%8d  %s" % (e["duration_ms"], e["step"]))
' "$dir/events$loads.jsonl"
