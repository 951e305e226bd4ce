#!/usr/bin/env bash
# Builds jvm/build/quorumlog-spark.jar against the jars PySpark ships (no Maven).
# PYTHON: the interpreter whose pyspark to compile against.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$here/../.venv/bin/python}"
jars="$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
[ -d "$jars" ] || { echo "build.sh: no pyspark jars at $jars" >&2; exit 1; }
classes="$(mktemp -d)"
trap 'rm -rf "$classes"' EXIT
# Lint warnings are errors when QUORUMLOG_JAVAC_WERROR=1 (development); a
# plain build (scripts/setup.sh on a new machine) prints them and goes on, so
# another JDK 17 build's new lint cannot break an install.
werror=()
[ "${QUORUMLOG_JAVAC_WERROR:-0}" = "1" ] && werror=(-Werror)
javac --release 17 -Xlint:all,-serial,-processing,-path "${werror[@]}" -cp "$jars/*" -d "$classes" \
    "$here"/src/io/quorumlog/spark/*.java
mkdir -p "$classes/META-INF/services" "$here/build"
echo io.quorumlog.spark.StreamSource \
    > "$classes/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
jar --create --file "$here/build/quorumlog-spark.jar" -C "$classes" .
echo "$here/build/quorumlog-spark.jar"
