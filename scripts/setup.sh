#!/usr/bin/env bash
# Create .venv and install minicomp with its test extras. Safe to run again.
# torch is installed first and pinned: on the project's CPU machines a CPU wheel of
# 2.13.0 lies on disk, so this is fast; a bare `torch` would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==${MINICOMP_TORCH:-2.13.0}"
.venv/bin/python -m pip install -q -e '.[test]'
