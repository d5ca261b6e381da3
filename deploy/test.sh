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

step "install (deploy/install.sh)"
bash deploy/install.sh

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

step "cargo test (unit, protocol and real-component tiers)"
cargo test --workspace --locked

step "portable chpart (deploy/spark/build-portable.sh: cargo zigbuild, glibc 2.17, OpenSSL linked in)"
# Built once here (cold: about 12 CPU-minutes, 17 min wall on a loaded 2-core machine); the
# connector jar and the wheel (tests/spark/test_embedded_chpart.py) reuse it through cargo's cache.
time bash deploy/spark/build-portable.sh

step "JVM connector (deploy/spark/build-connector.sh: javac against pyspark's jars, the portable chpart inside)"
connector_jar="$(bash deploy/spark/build-connector.sh)"

step "Spark end-to-end tests (tests/spark: pyspark 4.3.0 + Java 17 against the real engine)"
# The chpart binary the tests run (debug; `cargo test` above has built nearly all of it).
cargo build --locked --bin chpart
TEST_CHPART_BIN="$root/target/debug/chpart" TEST_CHPART_JAR="$connector_jar" .venv/bin/python -m pytest tests/spark -q --durations=15
step "every check and every tier passed"
