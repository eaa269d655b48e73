#!/usr/bin/env bash
# Sets up .venv for hires-hf on a fresh machine: torch first (a CPU build where one is on disk; GPU users keep
# the torch they install themselves), then the package with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
"$VENV/bin/python" -m pip install -q -e ".[dev]"
echo "hires-hf is set up in $VENV"
