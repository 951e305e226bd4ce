#!/usr/bin/env bash
# The metadata failover demo (`make demo-meta`): install from the lock file,
# start a local 3-node cluster on 127.0.0.1, write and read metadata through
# it, kill the meta leader with SIGKILL, show that every acknowledged write is
# still there and the cluster keeps serving, restart the node, stop the
# cluster; then run the WAL benchmark (quick) against the raw disk.
# The main job (cluster -> stream -> Spark) is scripts/main_job.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
q() { ./scripts/uv run --frozen quorumlog "$@"; }
dir="$(mktemp -d /tmp/quorumlog-demo.XXXXXX)"
trap 'q down --dir "$dir" >/dev/null 2>&1 || true' EXIT
q up --nodes 3 --dir "$dir"
for i in $(seq 1 20); do q meta put "/demo/key-$i" "value-$i" --dir "$dir" >/dev/null; done
echo "wrote 20 keys"
leader=$(q status --json --dir "$dir" | python3 -c 'import json,sys; print(next(n for n in json.load(sys.stdin)["nodes"] if n["meta_role"]=="leader")["id"])')
pid=$(q status --json --dir "$dir" | python3 -c 'import json,sys; print(next(n for n in json.load(sys.stdin)["nodes"] if n["meta_role"]=="leader")["pid"])')
echo "killing the leader, node $leader (pid $pid), with SIGKILL"
kill -9 "$pid"
q meta put /demo/after-kill yes --dir "$dir"
count=$(q meta list /demo/ --dir "$dir" | grep -c "value-\|yes" || true)
echo "keys readable after the kill: $count (expected 21)"
[ "$count" -eq 21 ]
q restart --node "$leader" --dir "$dir"
q status --dir "$dir"
q down --dir "$dir"
[ "${QUORUMLOG_DEMO_SKIP_BENCH:-0}" = 1 ] || ./scripts/uv run --frozen python bench/wal_bench.py --quick
