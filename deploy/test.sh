#!/usr/bin/env bash
# Runs every check and every test tier on this machine, installing what they need first.
# This is what CI runs (.ci/run). Real components (ClickHouse 26.9 engine, sshd, Spark) are started by
# the tests themselves, each with its own ports and directories.
#
#   bash deploy/test.sh          every check and every tier (CI)
#   bash deploy/test.sh --fast   formatting, then the unit and in-process tiers only: every crate's
#                                own tests (pure logic, clickhouse-local, the real engine and sshd
#                                driven in-process) and the CLI's unit tests; not the chpart binary's
#                                end-to-end tests (tests/), not Spark, no clippy or docs
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
step() { printf '\n==> %s (%s, %ss in)\n' "$*" "$(date -u +%H:%M:%S)" "$SECONDS"; }
fast=false
case "${1:-}" in
  "") ;;
  --fast) fast=true ;;
  *) echo "usage: bash deploy/test.sh [--fast]" >&2; exit 2 ;;
esac
# A clean clone gains nothing from incremental compilation, and its caches cost gigabytes of disk.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
# A full disk shows up late and obscurely (the linker dies with SIGBUS writing a test binary), so
# say at the start what the run has.
read -r free_kib mount < <(df -Pk . | awk 'NR == 2 {print $4, $6}')
echo "test.sh: $((free_kib / 1024 / 1024)) GiB free on $mount"
if [ "$free_kib" -lt $((6 * 1024 * 1024)) ]; then
  echo "test.sh: warning: less than 6 GiB free; the builds below may fill the disk" >&2
fi

# Background work (the venv's install, the portable build) is stopped if a step fails.
trap 'jobs -p | xargs -r kill 2>/dev/null || true' EXIT
# Runs "$@" in the background with its output in a file; `finish <name>` waits for it, prints
# the output and fails if it failed.
declare -A bg_pid bg_log
start() {
  local name=$1; shift
  bg_log[$name]="$(mktemp)"
  "$@" > "${bg_log[$name]}" 2>&1 &
  bg_pid[$name]=$!
}
finish() {
  local name=$1 status=0
  wait "${bg_pid[$name]}" || status=$?
  cat "${bg_log[$name]}"
  rm -f "${bg_log[$name]}"
  if [ "$status" -ne 0 ]; then echo "test.sh: $name failed (exit $status)" >&2; exit "$status"; fi
}

if [ "$fast" = true ]; then
  step "install (deploy/install.sh)"
  bash deploy/install.sh
else
  # The Debian packages first (compiling needs libssl-dev); the venv (pip's downloads and
  # unpacking) beside fmt, clippy and doc, which need only the toolchain.
  step "install: system packages and users (deploy/install.sh --system)"
  bash deploy/install.sh --system
  step "install: the venv (deploy/install.sh), beside the checks that follow; its output comes after them"
  start install bash deploy/install.sh
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "Markdown links (tests/check_links.py: every relative link and anchor resolves inside the repository)"
python3 tests/check_links.py

if [ "$fast" = true ]; then
  step "unit and in-process tiers (cargo test --workspace --exclude chpart; the CLI's unit tests)"
  started=$SECONDS
  cargo test --workspace --locked --exclude chpart
  cargo test --locked -p chpart --bins
  step "fast tiers passed in $((SECONDS - started))s (the full run: bash deploy/test.sh)"
  exit 0
fi

step "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "install: the venv (deploy/install.sh, started before fmt)"
finish install

step "portable chpart (deploy/spark/build-portable.sh: cargo zigbuild, glibc 2.17, OpenSSL linked in), beside cargo test; its output comes after it"
# Built once here; the connector jar and the wheel (tests/spark/test_embedded_chpart.py) reuse it
# through cargo's cache (build-connector.sh is given the same profile; the wheel embeds the jar's
# binary). A build for another target: its own build directories, so it does not wait on cargo
# test's lock, and it takes the CPU the tests leave while they wait on their servers. The profile is
# portable-test (Cargo.toml): the release profile's semantics without its optimization, whose CPU (9
# of the cold release build's 21.5 CPU minutes) this CPU-bound step would otherwise pay. Given to
# the two scripts only, not exported: chpart refuses CHPART_* variables that are not its settings,
# which is why the name has no CHPART_ prefix either.
start portable bash -c 'time PORTABLE_PROFILE=portable-test bash deploy/spark/build-portable.sh'

step "cargo test (unit, protocol and real-component tiers)"
cargo test --workspace --locked

step "portable chpart (started before cargo test)"
finish portable

step "JVM connector (deploy/spark/build-connector.sh: javac against pyspark's jars, the portable chpart inside)"
connector_jar="$(PORTABLE_PROFILE=portable-test bash deploy/spark/build-connector.sh)"

step "Spark end-to-end tests (tests/spark: pyspark 4.3.0 + Java 17 against the real engine)"
# The chpart binary the tests run: the one `cargo test` built for tests/, in the dev profile, so
# CHPART_TEST_CRASH_AT works. Its dependencies carry features other members' tests enable
# (chpart-server's test double, unused by the binary; regex's Unicode tables): rebuilding it
# without them (`cargo build --bin chpart`) recompiled 5 crates, 21 s, for the same code.
[ -x target/debug/chpart ] || { echo "test.sh: cargo test left no target/debug/chpart" >&2; exit 1; }
# Two workers (pytest-xdist): alone, the tier keeps 1.2 of the 2 cores busy (its tests wait on JVMs
# starting, on triggers and on kills); side by side they keep both: 829 s against 1075 s. Each test
# has its own servers, directories and ports (tests/spark/ports.py: a slice per worker).
TEST_CHPART_BIN="$root/target/debug/chpart" TEST_CHPART_JAR="$connector_jar" .venv/bin/python -m pytest tests/spark -q --durations=15 -n 2
step "every check and every tier passed"
