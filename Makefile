# Developer shortcuts. Every target installs from the lock file first.
.PHONY: setup test test-slow sim sim-ledger sim-ledger-far lint bench clean main demo demo-meta

setup:
	./scripts/setup.sh

test: setup
	./scripts/uv run --frozen pytest -n 2 --dist loadscope --no-loadscope-reorder

test-slow: setup
	./scripts/uv run --frozen pytest -n 2 -m "slow"

# 100,000 simulator seeds (75,000 three-node + 25,000 five-node runs, every fault
# mix, 2 processes; about half an hour). A failure prints its seed and replay command.
sim: setup
	./scripts/uv run --frozen quorumlog sim raft --seeds 75000 --nodes 3 --jobs 2
	./scripts/uv run --frozen quorumlog sim raft --seeds 25000 --nodes 5 --jobs 2

# 20,000 seeds of the ledger protocol simulator (writer, reader, recovery, bookies).
sim-ledger: setup
	./scripts/uv run --frozen quorumlog sim ledger --seeds 20000 --jobs 2

# 100,000 ledger seeds at a random offset far from the default range (printed,
# so a failure can be replayed); about an hour on 2 idle cores.
sim-ledger-far: setup
	@off=$$(./scripts/uv run --frozen python -c "import random; print(random.SystemRandom().randrange(10**8, 10**11, 1000))"); \
	echo "ledger simulator: 100,000 seeds from $$off"; \
	./scripts/uv run --frozen quorumlog sim ledger --seeds 100000 --start $$off --jobs 2

lint: setup
	./scripts/uv run --frozen ruff check .
	./scripts/uv run --frozen mypy
	./scripts/uv run --frozen lint-imports --no-logo

bench: setup
	./scripts/setup-bench.sh
	@for b in bench/*_bench.py; do echo "== $$b"; ./scripts/uv run --frozen --extra bench python $$b || exit 1; done

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache

# The main job: local cluster -> stream -> Spark -> stream + Parquet.
main:
	./scripts/main_job.sh

demo: main

# Meta failover demo (SIGKILL of the Raft leader) and the quick WAL benchmark.
demo-meta:
	./scripts/demo.sh
