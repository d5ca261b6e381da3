#!/usr/bin/env bash
# Installs everything chpart's build, quickstart and tests need on a fresh Debian 12 machine of
# this project's kind (root, Rust toolchain present, package registries reachable). Idempotent:
# a second run only checks.
#   - Debian packages: openssh-server (the test sshd), openssh-client (ssh, ssh-agent, ssh-add,
#     ssh-keygen), libssl-dev + pkg-config (ssh2), curl
#   - OS users: `clickhouse` (a server run as a dedicated user, as in production) and
#     `chpart-test` (an unrelated user for permission tests)
#   - .venv/ (git-ignored) with chdb-core==26.9.0: the ClickHouse 26.9 engine, used as
#     clickhouse-local (deploy/dev/clickhouse-local) and as a server (deploy/dev/clickhouse-server)
#   - in the same .venv: pyspark==4.3.0 (needs Java 17) and pytest (with pytest-xdist: the tier
#     runs on two workers) for the Spark package and its end-to-end tests, and chpart_spark itself
#     (deploy/spark, editable)
#   - the JDK 17 (openjdk-17-jdk-headless: java for Spark, javac and jar for the JVM connector,
#     deploy/spark/build-connector.sh, which compiles against the jars pyspark ships)
#   - in the same .venv: moto[server]==5.2.5, a local S3 endpoint the tests use as an `s3` disk
#     (crates/testenv/src/moto.rs)
#   - in the same .venv: ziglang and cargo-zigbuild, which build the portable chpart (glibc 2.17)
#     that the connector jar and the chpart_spark wheel carry (deploy/spark/build-portable.sh)
#
#   bash deploy/install.sh            everything above
#   bash deploy/install.sh --system   the Debian packages and OS users only (what compiling chpart
#                                     needs): deploy/test.sh runs the rest beside its first checks
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
system_only=false
case "${1:-}" in
  "") ;;
  --system) system_only=true ;;
  *) echo "usage: bash deploy/install.sh [--system]" >&2; exit 2 ;;
esac
CHDB_VERSION="26.9.0"
PYSPARK_VERSION="4.3.0"
PYTEST_VERSION="9.2.0"
PYTEST_XDIST_VERSION="3.8.0"
MOTO_VERSION="5.2.5"
ZIGLANG_VERSION="0.17.1"
CARGO_ZIGBUILD_VERSION="0.24.1"

say() { printf '[install] %s\n' "$*"; }

need_pkgs=()
[ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
# The OpenSSH client tools: ssh-keygen (test keys), ssh (the SFTP-only key's refusal of a shell),
# ssh-agent and ssh-add (agent authentication), all in tests/ssh.rs and crates/testenv.
for tool in ssh ssh-keygen ssh-agent ssh-add; do
  command -v "$tool" >/dev/null 2>&1 || { need_pkgs+=(openssh-client); break; }
done
dpkg -s libssl-dev >/dev/null 2>&1 || need_pkgs+=(libssl-dev)
command -v pkg-config >/dev/null 2>&1 || need_pkgs+=(pkg-config)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
# Packet loss for the lossy-network test (crates/testenv/src/loss.rs): netfilter's random drop,
# since this machine's kernel has no netem qdisc.
command -v iptables >/dev/null 2>&1 || need_pkgs+=(iptables)
if ! java -version 2>&1 | grep -q 'version "17' || ! javac -version 2>&1 | grep -q '^javac 17'; then
  need_pkgs+=(openjdk-17-jdk-headless)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  say "apt-get install ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# Key-only SSH logins as these users must work: sshd (UsePAM no) refuses "locked" accounts, and
# useradd locks with "!", so the password field is set to "*" (no password, not locked).
ensure_user() {
  local name=$1; shift
  id "$name" >/dev/null 2>&1 || useradd --system --shell /usr/sbin/nologin "$@" "$name"
  if [ "$(getent shadow "$name" | cut -d: -f2)" != "*" ]; then usermod -p '*' "$name"; fi
}
ensure_user clickhouse --create-home --home-dir /var/lib/clickhouse-user
ensure_user chpart-test --no-create-home
if [ "$system_only" = true ]; then
  say "system packages and users: done"
  exit 0
fi

venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('chdb-core') != '$CHDB_VERSION')" 2>/dev/null; then
  say "pip install chdb-core==$CHDB_VERSION (about 200 MB)"
  "$venv/bin/pip" install -q --disable-pip-version-check "chdb-core==$CHDB_VERSION"
fi
# Installed version == wanted version, for each pinned Python package.
pinned() { "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
want=()
pinned pyspark "$PYSPARK_VERSION" || want+=("pyspark==$PYSPARK_VERSION")
pinned pytest "$PYTEST_VERSION" || want+=("pytest==$PYTEST_VERSION")
pinned pytest-xdist "$PYTEST_XDIST_VERSION" || want+=("pytest-xdist==$PYTEST_XDIST_VERSION")
# The [server] extra (Flask) is what moto's HTTP server needs; the version alone does not say
# whether it was installed.
if ! pinned moto "$MOTO_VERSION" || ! "$venv/bin/python" -c "import moto.server, flask, flask_cors" 2>/dev/null; then
  want+=("moto[server]==$MOTO_VERSION")
fi
pinned ziglang "$ZIGLANG_VERSION" || want+=("ziglang==$ZIGLANG_VERSION")
pinned cargo-zigbuild "$CARGO_ZIGBUILD_VERSION" || want+=("cargo-zigbuild==$CARGO_ZIGBUILD_VERSION")
if [ ${#want[@]} -gt 0 ]; then
  say "pip install ${want[*]} (pyspark: about 450 MB, moto[server]: about 80 MB, ziglang: about 410 MB)"
  "$venv/bin/pip" install -q --disable-pip-version-check "${want[@]}"
fi
# chpart_spark from this checkout, editable (Spark's Python workers import it from the venv).
if ! "$venv/bin/python" -c "import chpart_spark, os, sys; sys.exit(os.path.realpath(chpart_spark.__file__) != os.path.realpath('$root/deploy/spark/chpart_spark/__init__.py'))" 2>/dev/null; then
  say "pip install -e deploy/spark (chpart_spark)"
  "$venv/bin/pip" install -q --disable-pip-version-check -e "$root/deploy/spark"
fi
say "ClickHouse engine: $("$root/deploy/dev/clickhouse-local" --version)"
say "Spark: pyspark $("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__)') on $(java -version 2>&1 | head -n1); $(javac -version 2>&1)"
say "portable builds: zig $("$venv/bin/python" -m ziglang version), $("$venv/bin/cargo-zigbuild" --version)"
say "S3 endpoint: moto $("$venv/bin/python" -c 'import moto; print(moto.__version__)')"
say "sshd: $(/usr/sbin/sshd -V 2>&1 | head -n1 || true)"
say "done"
