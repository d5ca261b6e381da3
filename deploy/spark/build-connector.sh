#!/usr/bin/env bash
# Builds the JVM connector (Spark DataSource V2 `format("chpart")`, deploy/spark/connector) into
# deploy/spark/connector/target/chpart-spark.jar (git-ignored), with the JDK's javac and jar
# against the jars the pinned pyspark ships (Spark, Arrow, Jackson, slf4j): no Maven, no network.
# The jar carries the portable chpart (deploy/spark/build-portable.sh, run here; a no-op when
# cargo has built it) as chpart/linux-x86_64/chpart, with its sha256 and `--version` beside it
# (chpart.sha256, chpart.version): the connector extracts and runs it when no chpart is named
# (deploy/spark/README.md, "The chpart binary in the jar").
#   SPARK_JARS=<dir>      another Spark's jars directory (default: pyspark's, from .venv)
#   OUT=<file>            another output path
#   CHPART_EMBED=<file>   embed this binary instead of building the portable one (its sha256 and
#                         version are recorded the same way); CHPART_EMBED=none: a jar without one
# Prints the jar's path on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
src="$here/connector/src/main"
out="${OUT:-$here/connector/target/chpart-spark.jar}"
if [ -z "${SPARK_JARS:-}" ]; then
  python="$root/.venv/bin/python"
  [ -x "$python" ] || { echo "build-connector: $python is missing: run bash deploy/install.sh" >&2; exit 1; }
  SPARK_JARS="$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
fi
[ -f "$SPARK_JARS/spark-sql_2.13-4.3.0.jar" ] || {
  echo "build-connector: $SPARK_JARS has no spark-sql_2.13-4.3.0.jar (pyspark 4.3.0 expected)" >&2; exit 1; }
command -v javac >/dev/null || { echo "build-connector: javac is missing: install openjdk-17-jdk-headless (bash deploy/install.sh)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/classes"
find "$src/java" -name '*.java' > "$work/sources"
# Warnings fail the build, as clippy's do. Left out: serial (the DSv2 interfaces are
# Serializable), path and classfile (Spark's and Arrow's jars name jars and annotations that
# pyspark does not ship), processing.
javac --release 17 -encoding UTF-8 -Xlint:all,-serial,-processing,-path,-classfile -Werror \
  -cp "$SPARK_JARS/*" -d "$work/classes" @"$work/sources"
cp -R "$src/resources/." "$work/classes/"
embed="${CHPART_EMBED:-}"
if [ -z "$embed" ]; then
  embed="$(bash "$here/build-portable.sh")"
fi
if [ "$embed" != none ]; then
  [ -x "$embed" ] || { echo "build-connector: $embed (the chpart to embed) is not an executable file" >&2; exit 1; }
  res="$work/classes/chpart/linux-x86_64"
  mkdir -p "$res"
  cp "$embed" "$res/chpart"
  sha256sum "$res/chpart" | cut -d' ' -f1 > "$res/chpart.sha256"
  "$res/chpart" --version > "$res/chpart.version"
fi
mkdir -p "$(dirname "$out")"
jar --create --file "$work/chpart-spark.jar" -C "$work/classes" .
mv "$work/chpart-spark.jar" "$out"
echo "$out"
