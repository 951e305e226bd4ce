#!/usr/bin/env bash
# Installs the peers the comparison benchmarks start (bench/peers_bench.py,
# bench/meta_vs_etcd.py, bench/ledger_bench.py's etcd baseline): Debian's
# nats-server (NATS JetStream 2.9) and etcd-server (etcd 3.4), with apt-get,
# and the `bench` extra of the lock file (nats-py) into .venv beside the dev
# and spark extras. Not part of ./scripts/setup.sh or CI: the tests need none
# of this. When apt-get cannot install a peer (not root, no network), it warns
# and goes on; the benchmark then says which binary is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup-bench: installing ${missing[*]} ..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } \
      || echo "setup-bench: could not install ${missing[*]}: the benchmarks that need them" \
              "stop with a message (or leave that peer out)" >&2
  else
    echo "setup-bench: ${missing[*]} missing and not root with apt-get: install them by hand" \
         "(Debian: apt-get install ${missing[*]})" >&2
  fi
fi
extras=(--extra dev --extra bench)
if [ "${QUORUMLOG_SPARK:-1}" != "0" ]; then
  extras+=(--extra spark)
fi
./scripts/uv sync --frozen "${extras[@]}"
