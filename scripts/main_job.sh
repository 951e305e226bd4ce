#!/usr/bin/env bash
# The README's main job, on a fresh machine: install everything from the lock
# file (uv, Python packages including pyspark), make sure Java 17+ is there
# (Spark needs it; installed with apt-get when running as root), then run the
# example pipeline end to end: local cluster -> stream -> Spark -> stream +
# Parquet, printing what it did. Extra arguments go to examples/pipeline.py
# (e.g. --events 20000 --keep).
set -euo pipefail
cd "$(dirname "$0")/.."

java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local version
  version="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
  [ -n "$version" ] && [ "$version" -ge 17 ]
}

if ! java_ok; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "main_job: installing Java 17 (openjdk-17-jre-headless) for Spark ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "main_job: Spark needs Java 17+; install it (e.g. apt-get install" \
         "openjdk-17-jre-headless) and run this again" >&2
    exit 1
  fi
fi
echo "main_job: $(java -version 2>&1 | head -n1)"

QUORUMLOG_SPARK=1 ./scripts/setup.sh
exec ./scripts/uv run --frozen python examples/pipeline.py "$@"
