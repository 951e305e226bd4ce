#!/usr/bin/env bash
# Installs everything quorumlog needs on a fresh machine, from the project's own
# files: a pinned uv (in .tools/), then the locked dependencies (uv.lock) into
# .venv with the dev and spark extras. Idempotent; fast when already done.
#
# QUORUMLOG_SPARK=0 leaves out the spark extra (pyspark + pyarrow, ~450 MB);
# the Spark tests then skip with a reason. Spark also needs Java 17+: this
# script checks for it and says so when it is missing (the Spark tests skip
# without it; nothing else needs Java).
#
# With the spark extra and a JDK (javac, jar), this also builds the Spark JVM
# reader (jvm/build.sh -> jvm/build/quorumlog-spark.jar, compiled against the
# jars pyspark ships; quorumlog.spark.read_stream, docs/spark.md) when its
# sources changed; without javac, read_stream uses the Python source and its
# tests skip with a reason.
#
# The network-namespace tests (tests/netns/) drop packets between namespaces with
# nft: as root with apt-get, this installs Debian's nftables when `nft` is
# missing; otherwise those tests skip with a reason.
#
# The Prometheus test (tests/observability/test_prometheus.py, marked slow) runs
# a real `prometheus` against a local cluster and queries every expression of
# the Grafana dashboard: as root with apt-get, this installs Debian's
# prometheus when it is missing (the test runs its own instance on a free port
# with a temporary storage directory, beside any packaged service), and its
# promtool checks the alert rules (tests/observability/test_alert_rules.py);
# otherwise those tests skip with a reason.
#
# The web console's browser test (tests/console, marked slow) drives Debian's
# chromium through chromedriver with selenium (the dev extra): as root with
# apt-get, this installs chromium and chromium-driver when missing; otherwise
# that test skips with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nft >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing nftables (nft) for the network-namespace tests ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; } \
      || echo "setup: could not install nftables: the network-namespace tests skip" >&2
  else
    echo "setup: no 'nft' on PATH: the network-namespace tests (tests/netns) skip" \
         "(Debian: apt-get install nftables, as root)" >&2
  fi
fi
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing prometheus for the dashboard test (tests/observability) ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; } \
      || echo "setup: could not install prometheus: the dashboard test skips" >&2
  else
    echo "setup: no 'prometheus' on PATH: the dashboard test (tests/observability/test_prometheus.py)" \
         "skips (Debian: apt-get install prometheus, as root)" >&2
  fi
fi
if ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing chromium and chromium-driver for the console's browser test ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
      || echo "setup: could not install chromium chromium-driver: the console's browser test skips" >&2
  else
    echo "setup: no 'chromedriver' on PATH: the console's browser test (tests/console) skips" \
         "(Debian: apt-get install chromium chromium-driver, as root)" >&2
  fi
fi
extras=(--extra dev)
if [ "${QUORUMLOG_SPARK:-1}" != "0" ]; then
  extras+=(--extra spark)
  if ! command -v java >/dev/null 2>&1; then
    echo "setup: no 'java' on PATH: Spark (quorumlog.spark, the example pipeline) needs" \
         "Java 17+ (Debian: apt-get install openjdk-17-jre-headless)" >&2
  fi
fi
./scripts/uv sync --frozen "${extras[@]}"
if [ "${QUORUMLOG_SPARK:-1}" != "0" ]; then
  if command -v javac >/dev/null 2>&1 && command -v jar >/dev/null 2>&1; then
    built=jvm/build/quorumlog-spark.jar
    if [ ! -f "$built" ] || [ -n "$(find jvm/src jvm/build.sh -newer "$built" -print -quit)" ]; then
      PYTHON=.venv/bin/python ./jvm/build.sh >/dev/null
    fi
  else
    echo "setup: no 'javac'/'jar' on PATH: the Spark JVM reader (jvm/) is not built;" \
         "read_stream reads through the Python source (Debian: openjdk-17-jdk-headless)" >&2
  fi
fi
