#!/usr/bin/env bash
# Runs every check and every test tier on this machine, installing what they need first.
# This is what CI runs (.ci/run). Real components (ClickHouse 26.9 engine, sshd, Spark) are started by
# the tests themselves, each with its own ports and directories.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
step() { printf '\n==> %s\n' "$*"; }
# A clean clone gains nothing from incremental compilation, and its caches cost gigabytes of disk.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi

step "install (deploy/install.sh)"
bash deploy/install.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "Markdown links (tests/check_links.py: every relative link and anchor resolves inside the repository)"
python3 tests/check_links.py

step "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "cargo test (unit, protocol and real-component tiers)"
cargo test --workspace --locked

step "JVM connector (deploy/spark/build-connector.sh: javac against pyspark's jars)"
connector_jar="$(bash deploy/spark/build-connector.sh)"

step "Spark end-to-end tests (tests/spark: pyspark 4.3.0 + Java 17 against the real engine)"
# The chpart binary the tests run (debug; `cargo test` above has built nearly all of it).
cargo build --locked --bin chpart
TEST_CHPART_BIN="$root/target/debug/chpart" TEST_CHPART_JAR="$connector_jar" .venv/bin/python -m pytest tests/spark -q
