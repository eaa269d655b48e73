#!/usr/bin/env bash
# The GPU checks, in the order they matter (PHASES=compare alone fits in 10 minutes on one H200):
#   compare:   `hires-hf compare` at d=512, L=16, k=4: the shipped HiRes against the scaled-embedding control,
#              12M control tokens a run, each over its own bracketing grid from 5e-4 / 1e-3 / 2e-3 (~8 minutes).
#   stability: the stability grid at d=512, L=16 (docs/stability.md), HiRes vs its twin over peak learning
#              rates, and the old default (vanilla-scale embedding) at 1e-3 and 2e-3: does the stall reproduce?
#   ladder:    the compute ladder on the GPU (`hires-hf ladder --device cuda`, LADDER_WORKERS processes sharing
#              the GPU: six kept one H200 99-100% busy, 30 runs of rungs 1-2 in 12 minutes), a ladder of its own
#              beside the CPU's (the GPU machine's corpus), then its own noise floor (the control's seed spread
#              against tokens: its kernels are not deterministic). Resumable: it starts from the runs committed under
#              benchmarks/results/ladder_gpu/runs, its workers start only runs expected to end LADDER_TAIL (60)
#              seconds before the phase does (a run cut off would be lost; a width not timed on the GPU yet is
#              judged at the nearest timed width's speed), and the report is written on the GPU machine (the runs'
#              data is that machine's own Python sources). In 15 minutes of one H200: a first run of this script (LADDER_SECONDS
#              480, ~105 s of it preparing the corpus; 540 with LADDER_TAIL 45 once the top rung is next, whose runs
#              take ~3 minutes with six at once on an H200 or an H100); unpack its archive into benchmarks/results/ladder_gpu; then a
#              second (LADDER_SECONDS 240), which goes on from those runs. WORK=<the folder env.txt names> also
#              saves the corpus if the machine is still up; it may not be (one left idle for 30 seconds was gone,
#              and the second run, without the first's runs, trained 9 of them again). After the top rung: the
#              floor, then bf16 against fp32 (the precision stage).
# Each phase's results are one archive ($OUT/<phase>.tar.gz) beside its log ($OUT/<phase>_log.txt), so that a
# handful of files are copied back however many runs a phase trains. Unpack the ladder's into
# benchmarks/results/ladder_gpu (its runs/*.json and runs/traces/) and commit it; its report can be rebuilt off the
# GPU machine with
# `hires-hf ladder --device cuda --seeds 3 --top-seeds 6 --report --from-record --out benchmarks/results/ladder_gpu`.
# Usage: OUT=runs/gpu scripts/gpu_session.sh
#   PHASES=stability|ladder runs one of them; STAB_STEPS, STAB_LRS, STAB_ARCHS, LADDER_STAGES, LADDER_WORKERS,
#   LADDER_SEEDS, LADDER_TOP_SEEDS, LADDER_ARGS and MAX_CHARS shrink them to fit less GPU time (LADDER_ARGS="--arms
#   control plain-twin hires D=4d k=6" adds an arm); SMOKE=1 runs
#   seconds-long versions (DEVICE=cpu: the ladder's on this machine's CPU, to try the script without a GPU). WORK=<the folder env.txt
#   names>, on a machine still up from an earlier run of this script, goes on from its runs and prepared data.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu}"
WORK="${WORK:-$(mktemp -d)}"  # each phase's folder, packed into $OUT when the phase ends
PY="${PYTHON:-python3}"
PHASES="${PHASES:-compare stability ladder}"
DEVICE="${DEVICE:-cuda}"
mkdir -p "$OUT" "$WORK"
if compgen -G ".whl/*.whl" >/dev/null; then  # a GPU image with an older transformers: the carried wheel first
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
echo "work folder: $WORK (WORK=$WORK on this machine goes on from it)" | tee -a "$OUT/env.txt"

pack() {  # pack PHASE: its folder under $WORK as $OUT/PHASE.tar.gz (one file back, however many it holds)
  tar -czf "$OUT/$1.tar.gz" -C "$WORK" "$1" && echo "packed $OUT/$1.tar.gz"
}

status() {  # status CODE PHASE: how the phase's command ended, at the end of its log (124: its time ran out)
  echo "$2 exited with $1" | tee -a "$OUT/$2_log.txt"
}

if [[ " $PHASES " == *" compare "* ]]; then
  cmp=(-m hires_hf.cli compare --model 512x16 --vocab-size 8192 --data python --max-chars "${MAX_CHARS:-80000000}"
       --context 1024 --batch-size 64 --budget-tokens "${CMP_TOKENS:-12e6}" --lrs 5e-4 1e-3 2e-3 --out "$WORK/compare")
  [ -n "${SMOKE:-}" ] && cmp=(-m hires_hf.cli compare --model tiny --smoke --out "$WORK/compare")
  timeout -k 30 "${CMP_SECONDS:-500}" "$PY" "${cmp[@]}" 2>&1 | tr '\r' '\n' | grep -v "it/s\|run/s" \
    | tee "$OUT/compare_log.txt" | tail -12
  status "${PIPESTATUS[0]}" compare
  rm -rf "$WORK/compare/hires" "$WORK/compare/control"  # the models stay on the machine; the numbers are packed
  [ -d "$WORK/compare" ] && pack compare
fi

if [[ " $PHASES " == *" stability "* ]]; then
  stab=(benchmarks/stability.py --preset gpu --out-dir "$WORK/stability" --vanilla-steps "${STAB_STEPS:-92}")
  [ -n "${SMOKE:-}" ] && stab=(benchmarks/stability.py --smoke --out-dir "$WORK/stability")
  [ -n "${STAB_LRS:-}" ] && stab+=(--lrs $STAB_LRS)
  [ -n "${STAB_ARCHS:-}" ] && stab+=(--archs $STAB_ARCHS)
  timeout -k 30 "${STAB_SECONDS:-290}" "$PY" "${stab[@]}" --old-lrs 1e-3 2e-3 2>&1 | tr '\r' '\n' | grep -v "it/s" \
    | tee "$OUT/stability_log.txt" | tail -25
  status "${PIPESTATUS[0]}" stability
  [ -d "$WORK/stability" ] && pack stability
fi

if [[ " $PHASES " == *" ladder "* ]]; then
  mkdir -p "$WORK/ladder/runs"
  # the runs earlier sessions trained (and committed), so that this one goes on from them
  [ -z "${SMOKE:-}" ] && cp benchmarks/results/ladder_gpu/runs/*.json "$WORK/ladder/runs/" 2>/dev/null
  # its corpus record: a GPU image whose packages moved is refused rather than starting the ladder over
  [ -z "${SMOKE:-}" ] && cp benchmarks/results/ladder_gpu/corpus*.* "$WORK/ladder/" 2>/dev/null
  # three seeds at each best rate: two runs of one seed on the GPU ended 0.033 nats apart (its kernels are not
  # deterministic), and a run there costs a minute or two. Six at the top rung, whose gap is the verdict: with the
  # GPU's pooled seed noise (0.034 nats a run) six a side tell the 0.054 nats the article's 1.30x is worth there
  # from none (the report's "Seeds the verdict needs": 95% two-sided, 80% power). A checkpoint every
  # 30 s: a stored run keeps its training loss step by step as far as its last checkpoint, and these runs last
  # minutes.
  ladder=(-m hires_hf.cli ladder --device "$DEVICE" --out "$WORK/ladder" --quiet --seeds "${LADDER_SEEDS:-3}"
          --top-seeds "${LADDER_TOP_SEEDS:-6}" --checkpoint-minutes 0.5 ${LADDER_ARGS:-})
  [ -n "${SMOKE:-}" ] && ladder+=(--smoke)
  seconds="${LADDER_SECONDS:-420}"  # whole seconds; with the start, the report and the packing, ten minutes in all
  minutes=$(awk -v s="$seconds" -v tail="${LADDER_TAIL:-60}" 'BEGIN { print (s - tail) / 60 }')
  timeout -k 30 "$seconds" "$PY" "${ladder[@]}" --stages ${LADDER_STAGES:-grid top floor precision} \
    --workers "${LADDER_WORKERS:-6}" --claim-for "$minutes" 2>&1 | tee "$OUT/ladder_log.txt" | tail -5
  status "${PIPESTATUS[0]}" ladder
  rm -rf "$WORK/ladder/runs/checkpoints" "$WORK/ladder/runs/claims"
  pack ladder  # the runs first: the report below may not get its time
  timeout -k 10 "${REPORT_SECONDS:-90}" "$PY" "${ladder[@]}" --report 2>&1 | tee -a "$OUT/ladder_log.txt" | tail -40
  status "${PIPESTATUS[0]}" ladder
  pack ladder
fi
echo "done"
