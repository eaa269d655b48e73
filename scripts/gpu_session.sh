#!/usr/bin/env bash
# The GPU checks of one session on one H200, in the order they matter, each writing as it goes under $OUT:
#   1. the stability grid at the issue's GPU shape (d=512, L=16): HiRes vs its twin over peak learning rates, and
#      the old default (vanilla-scale embedding) at two of those rates: does the stall reproduce on the GPU?
#   2. the GPU scaling ladder (`hires-hf ladder --preset gpu`) with what is left of the budget.
# Usage: OUT=runs/gpu scripts/gpu_session.sh   (STAB_STEPS / LADDER_MINUTES / MAX_CHARS shrink it to fit a lease)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu}"
mkdir -p "$OUT/ladder"
if compgen -G ".whl/*.whl" >/dev/null; then  # a GPU image with an older transformers: the carried wheel first
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
PY="${PYTHON:-python3}"
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"

STAB=(benchmarks/stability.py --preset gpu --out-dir "$OUT" --vanilla-steps "${STAB_STEPS:-92}")
[ -n "${SMOKE:-}" ] && STAB=(benchmarks/stability.py --smoke --out-dir "$OUT")
# At most 8 files come back from a lease: the JSON and logs stay under $OUT; the table and figure (rebuilt here with
# `python benchmarks/stability.py --render FILE.json`) are moved aside.
timeout "${STAB_SECONDS:-290}" "$PY" "${STAB[@]}" --old-lrs 1e-3 2e-3 2>&1 | tr '\r' '\n' | grep -v "it/s" \
  | tee "$OUT/stability_log.txt" | tail -25
mkdir -p /tmp/aside && mv "$OUT"/*.png "$OUT"/*.md /tmp/aside/ 2>/dev/null

LADDER=(-m hires_hf.cli ladder --preset gpu --budget-minutes "${LADDER_MINUTES:-4.3}" --max-chars "${MAX_CHARS:-60000000}")
[ -n "${SMOKE:-}" ] && LADDER=(-m hires_hf.cli ladder --preset gpu --smoke)
timeout "${LADDER_SECONDS:-285}" "$PY" "${LADDER[@]}" --out "$OUT/ladder/runs.jsonl" 2>&1 | tr '\r' '\n' \
  | grep -v "FLOP/s\|it/s" | tee "$OUT/ladder/log.txt" | tail -15
echo "done"
