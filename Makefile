# Developer shortcuts. Every target installs from the lock file first.
.PHONY: setup test test-slow sim lint bench clean

setup:
	./scripts/setup.sh

test: setup
	./scripts/uv run --frozen pytest -n 2

test-slow: setup
	./scripts/uv run --frozen pytest -n 2 -m "slow"

lint: setup
	./scripts/uv run --frozen ruff check .
	./scripts/uv run --frozen mypy

bench: setup
	@for b in bench/*_bench.py; do echo "== $$b"; ./scripts/uv run --frozen python $$b || exit 1; done

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
