#!/usr/bin/env bash
# Mutation testing of chpart's exactly-once protocol through the six real-Spark scenarios.
#
#   bash tests/spark/mutants/run.sh [MUTANT...]      (from anywhere; default: every mutant)
#
# Runs the six scenario tests once without a mutant (the baseline, which must pass) and once per
# mutant (CHPART_TEST_MUTANT=<name>, see __init__.py), one pytest run at a time, then prints the
# table scenario x mutant -> caught (the test failed) / NOT caught (it passed) with the first
# assertion message of each failure. Results (JUnit XML, pytest output, what each mutant
# changed) go to $MUTANT_OUT (default /tmp/chpart-mutants-<time>). Exit status: 1 if the
# baseline failed, else 0 (a mutant that is not caught is reported, not an error).
# TEST_CHPART_BIN is passed on (default: the conftest builds target/debug/chpart).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
OUT="${MUTANT_OUT:-/tmp/chpart-mutants-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
if [ "$#" -gt 0 ]; then MUTANTS=("$@"); else MUTANTS=(highest-attempt latest-manifest all-published naive-attach); fi
TESTS=(
  tests/spark/test_spark_load.py::test_task_retry_after_publish_loads_exactly_once
  tests/spark/test_spark_load.py::test_replace_reload_of_existing_partitions
  tests/spark/test_spark_load.py::test_driver_killed_during_commit_then_rerun
  tests/spark/test_spark_failures.py::test_stage_retry_with_zombies_that_publish_late
  tests/spark/test_spark_failures.py::test_executor_killed_while_writing
  tests/spark/test_spark_failures.py::test_speculative_copy_beats_straggler
)

run_one() {  # name [mutant]
  local name="$1" mutant="${2:-}" start rc
  start=$(date +%s)
  rm -f "$OUT/$name.xml" "$OUT/$name.events.jsonl"
  if [ -n "$mutant" ]; then
    env -u TESTMUTANT_NAME CHPART_TEST_MUTANT="$mutant" TESTMUTANT_LOG="$OUT/$name.events.jsonl" \
      "$PY" -m pytest "${TESTS[@]}" -q --junitxml="$OUT/$name.xml" >"$OUT/$name.log" 2>&1
  else
    env -u CHPART_TEST_MUTANT -u TESTMUTANT_NAME \
      "$PY" -m pytest "${TESTS[@]}" -q --junitxml="$OUT/$name.xml" >"$OUT/$name.log" 2>&1
  fi
  rc=$?
  echo "$name: pytest exit $rc in $(( $(date +%s) - start ))s ($(tail -n 1 "$OUT/$name.log"))"
  return $rc
}

echo "results in $OUT"
run_one baseline
baseline_rc=$?
if [ ! -s "$OUT/baseline.xml" ] || [ "$baseline_rc" -ne 0 ]; then
  echo "the baseline (no mutant) failed: see $OUT/baseline.log; the mutants prove nothing against a failing baseline" >&2
  "$PY" tests/spark/mutants/summarize.py "$OUT" baseline
  exit 1
fi
for mutant in "${MUTANTS[@]}"; do
  run_one "$mutant" "$mutant"
done
echo
"$PY" tests/spark/mutants/summarize.py "$OUT" baseline "${MUTANTS[@]}" | tee "$OUT/table.md"
exit "${PIPESTATUS[0]}"
