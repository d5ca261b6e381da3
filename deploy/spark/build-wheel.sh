#!/usr/bin/env bash
# Builds the chpart_spark wheel that carries the portable chpart (deploy/spark/build-portable.sh,
# run here; a no-op when cargo has built it) as chpart_spark/bin/chpart, with its sha256 in
# chpart_spark/bin/chpart.sha256, tagged py3-none-manylinux_2_17_x86_64 (setup.py; the glibc
# floor is build-portable.sh's). `pip install` of it brings the binary, so a venv packed with
# venv-pack and shipped with --archives carries everything, and chpart_spark.write runs it when no
# chpart is named. The wheel is built from a copy of deploy/spark, so the checkout (and its
# editable install) never holds the binary.
#   OUT_DIR=<dir>         where the wheel goes (default: target/wheel)
#   CHPART_EMBED=<file>   carry this binary instead of building the portable one
# Prints the wheel's path on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out_dir="${OUT_DIR:-$root/target/wheel}"
pip="$root/.venv/bin/pip"
[ -x "$pip" ] || { echo "build-wheel: $pip is missing: run bash deploy/install.sh" >&2; exit 1; }
binary="${CHPART_EMBED:-$(bash "$here/build-portable.sh")}"
[ -x "$binary" ] || { echo "build-wheel: $binary (the chpart to carry) is not an executable file" >&2; exit 1; }
floor="$(sed -n 's/^GLIBC_FLOOR="\([0-9.]*\)"$/\1/p' "$here/build-portable.sh")"
[ -n "$floor" ] || { echo "build-wheel: no GLIBC_FLOOR in build-portable.sh" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/chpart_spark/bin" "$work/out"
cp "$here/pyproject.toml" "$here/setup.py" "$here/README.md" "$work/src/"
cp "$here"/chpart_spark/*.py "$work/src/chpart_spark/"
cp "$binary" "$work/src/chpart_spark/bin/chpart"
chmod 755 "$work/src/chpart_spark/bin/chpart"
sha256sum "$work/src/chpart_spark/bin/chpart" | cut -d' ' -f1 > "$work/src/chpart_spark/bin/chpart.sha256"
CHPART_WHEEL_PLATFORM="manylinux_${floor/./_}_x86_64" \
  "$pip" wheel -q --disable-pip-version-check --no-deps -w "$work/out" "$work/src" >&2
wheels=("$work"/out/chpart_spark-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "build-wheel: expected one wheel, got: ${wheels[*]}" >&2; exit 1; }
mkdir -p "$out_dir"
name="$(basename "${wheels[0]}")"
cp "${wheels[0]}" "$out_dir/.$name.tmp"
mv "$out_dir/.$name.tmp" "$out_dir/$name"
echo "$out_dir/$name"
