#!/usr/bin/env bash
# chpart's quickstart on the embedded default: installs what is needed, then runs the
# environment smoke flow as a demo, against a ClickHouse 26.9 engine and an sshd that the flow
# starts on loopback: build parts with clickhouse-local, upload them over SFTP (host key
# verified), publish them into detached/ under attempt-scoped names, ATTACH PART, and check rows
# and hash_of_all_files. (The Spark pipeline replaces this demo once `chpart begin/build/commit`
# exist; see README "Status".)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash deploy/install.sh
echo "[quickstart] building chpart and its tests (first build takes a few minutes)"
cargo build --quiet --tests --locked
echo "[quickstart] running the smoke flow"
cargo test --quiet --locked --test integration smoke:: -- --nocapture --test-threads 1
echo "[quickstart] done: every step ran against the real ClickHouse 26.9 engine and OpenSSH sshd"
