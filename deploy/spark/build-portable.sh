#!/usr/bin/env bash
# Builds the portable chpart for Linux x86_64 that the connector jar and the chpart_spark wheel
# carry: a release build (feature `portable`: OpenSSL from source and zlib linked statically,
# libssh2 is always vendored) linked by zig against glibc 2.17's symbols (`cargo zigbuild
# --target x86_64-unknown-linux-gnu.2.17`; zig and cargo-zigbuild come from PyPI into .venv,
# bash deploy/install.sh), so it runs on glibc 2.17 and later (RHEL/CentOS 7 and every newer
# distribution) with nothing installed beside it.
#
# Then checks what it promises, and fails otherwise: no GLIBC symbol version above 2.17
# (objdump -T), no libssl, libcrypto, libssh2 or libz among its needed libraries (readelf -d),
# and `chpart --version` runs here. Writes <out> (debug info stripped) and <out>.sha256 (the hex
# digest alone).
#   OUT=<file>   where the binary goes (default: target/portable/chpart)
#   PORTABLE_PROFILE=<profile>   the cargo profile (default: release; CI's test run uses
#                the workspace's portable-test: release semantics, no optimization)
# Prints the binary's path on stdout. Cargo's own cache makes a second run a no-op (about 2 s):
# deploy/test.sh builds it once, build-connector.sh and build-wheel.sh reuse it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-$root/target/portable/chpart}"
# One home for the floor: the zig target suffix and the check below read it.
GLIBC_FLOOR="2.17"
triple="x86_64-unknown-linux-gnu"

venv_bin="$root/.venv/bin"
[ -x "$venv_bin/cargo-zigbuild" ] || {
  echo "build-portable: $venv_bin/cargo-zigbuild is missing: run bash deploy/install.sh" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "build-portable: builds for x86_64 hosts only (this is $(uname -m))" >&2; exit 1; }
# cargo finds `cargo-zigbuild` on PATH; cargo-zigbuild runs zig as `python3 -m ziglang` when no
# `zig` is on PATH: the venv's python3, which has ziglang.
export PATH="$venv_bin:$PATH"

profile="${PORTABLE_PROFILE:-release}"
case "$profile" in
  release | portable-test) ;;
  *) echo "build-portable: PORTABLE_PROFILE is release or portable-test, not $profile" >&2; exit 2 ;;
esac
# Without the release profile's line tables (CARGO_PROFILE_RELEASE_DEBUG=false): the shipped copy
# is stripped of them anyway, and not emitting them saves compile and link time.
(cd "$root" && CARGO_PROFILE_RELEASE_DEBUG=false cargo zigbuild --locked --profile "$profile" --features portable \
  --bin chpart --target "$triple.$GLIBC_FLOOR" >&2)
# cargo's target directory ($CARGO_TARGET_DIR, relative to the workspace as cargo reads it there).
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
built="$target_dir/$triple/$profile/chpart"
[ -x "$built" ] || { echo "build-portable: cargo zigbuild did not produce $built" >&2; exit 1; }

# The highest GLIBC_x.y any dynamic symbol needs, compared as versions.
highest="$(objdump -T "$built" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)"
if [ "$(printf '%s\n%s\n' "$highest" "$GLIBC_FLOOR" | sort -V | tail -n1)" != "$GLIBC_FLOOR" ]; then
  echo "build-portable: $built needs GLIBC_$highest, above the floor $GLIBC_FLOOR" >&2; exit 1
fi
needed="$(readelf -d "$built" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
case " $needed" in
  *" libssl"* | *" libcrypto"* | *" libssh2"* | *" libz."*)
    echo "build-portable: $built still needs a shared library it should carry: $needed" >&2; exit 1 ;;
esac
version="$("$built" --version)"

mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
# Without debug info (the standard library's own; with the profile's line tables the binary was
# 130 MB): the jar and the wheel carry it. Function names stay (backtraces name functions).
strip --strip-debug -o "$tmp" "$built"
mv "$tmp" "$out"
sha256sum "$out" | cut -d' ' -f1 > "$out.sha256.tmp.$$"
mv "$out.sha256.tmp.$$" "$out.sha256"
echo "build-portable: $version (profile $profile), $(stat -c %s "$out") bytes, highest symbol GLIBC_$highest (floor $GLIBC_FLOOR), needs: $needed" >&2
echo "$out"
