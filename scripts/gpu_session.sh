#!/usr/bin/env bash
# The GPU checks, in the order they matter (PHASES=compare alone fits in 10 minutes on one H200), each writing as it goes under $OUT:
#   compare:   `hires-hf compare` at d=512, L=16, k=4: the shipped HiRes against the scaled-embedding control,
#              12M control tokens a run, each over its own bracketing grid from 5e-4 / 1e-3 / 2e-3 (~8 minutes).
#   stability: the stability grid at d=512, L=16 (docs/stability.md), HiRes vs its twin over peak learning
#              rates, and the old default (vanilla-scale embedding) at 1e-3 and 2e-3: does the stall reproduce?
#   ladder:    the compute ladder's stages on the GPU (`hires-hf ladder --device cuda`), a cross-check of the CPU
#              numbers; resumable: the finished runs come back under $OUT/ladder/runs and, carried back, are reused.
# Usage: OUT=runs/gpu scripts/gpu_session.sh
#   PHASES=stability|ladder runs one of them; STAB_STEPS, STAB_LRS, STAB_ARCHS, LADDER_STAGES, LADDER_ARGS and
#   MAX_CHARS shrink them to fit less GPU time; SMOKE=1 runs seconds-long versions; JSON_ONLY=1 leaves only the
#   JSON and the logs under $OUT (rebuild a table and figure with `python benchmarks/stability.py --render FILE.json`).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu}"
PY="${PYTHON:-python3}"
PHASES="${PHASES:-compare stability ladder}"
mkdir -p "$OUT/ladder"
if compgen -G ".whl/*.whl" >/dev/null; then  # a GPU image with an older transformers: the carried wheel first
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"

if [[ " $PHASES " == *" compare "* ]]; then
  cmp=(-m hires_hf.cli compare --model 512x16 --vocab-size 8192 --data python --max-chars "${MAX_CHARS:-80000000}"
       --context 1024 --batch-size 64 --budget-tokens "${CMP_TOKENS:-12e6}" --lrs 5e-4 1e-3 2e-3 --out "$OUT/compare")
  [ -n "${SMOKE:-}" ] && cmp=(-m hires_hf.cli compare --model tiny --smoke --out "$OUT/compare")
  timeout "${CMP_SECONDS:-500}" "$PY" "${cmp[@]}" 2>&1 | tr '\r' '\n' | grep -v "it/s\|run/s" \
    | tee "$OUT/compare_log.txt" | tail -12
  rm -rf "$OUT/compare/hires" "$OUT/compare/control"  # the models stay on the machine; the numbers come back
fi

if [[ " $PHASES " == *" stability "* ]]; then
  stab=(benchmarks/stability.py --preset gpu --out-dir "$OUT" --vanilla-steps "${STAB_STEPS:-92}")
  [ -n "${SMOKE:-}" ] && stab=(benchmarks/stability.py --smoke --out-dir "$OUT")
  [ -n "${STAB_LRS:-}" ] && stab+=(--lrs $STAB_LRS)
  [ -n "${STAB_ARCHS:-}" ] && stab+=(--archs $STAB_ARCHS)
  timeout "${STAB_SECONDS:-290}" "$PY" "${stab[@]}" --old-lrs 1e-3 2e-3 2>&1 | tr '\r' '\n' | grep -v "it/s" \
    | tee "$OUT/stability_log.txt" | tail -25
  [ -n "${JSON_ONLY:-}" ] && rm -f "$OUT"/*.png "$OUT"/*.md
fi

if [[ " $PHASES " == *" ladder "* ]]; then
  ladder=(-m hires_hf.cli ladder --device cuda --stages ${LADDER_STAGES:-grid top} --out "$OUT/ladder" --quiet)
  [ -n "${SMOKE:-}" ] && ladder=(-m hires_hf.cli ladder --device cuda --smoke --out "$OUT/ladder" --quiet)
  [ -n "${LADDER_ARGS:-}" ] && ladder+=($LADDER_ARGS)
  timeout "${LADDER_SECONDS:-480}" "$PY" "${ladder[@]}" 2>&1 | tee "$OUT/ladder/log.txt" | tail -15
  rm -rf "$OUT/ladder/runs/checkpoints" "$OUT/ladder/runs/claims"
fi
echo "done"
