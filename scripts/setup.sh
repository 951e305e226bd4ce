#!/usr/bin/env bash
# Installs everything quorumlog needs on a fresh machine, from the project's own
# files: a pinned uv (in .tools/), then the locked dependencies (uv.lock) into
# .venv with the dev extras. Idempotent; fast when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=(--extra dev)
if [ "${QUORUMLOG_SPARK:-0}" = "1" ]; then extras+=(--extra spark); fi
./scripts/uv sync --frozen "${extras[@]}"
