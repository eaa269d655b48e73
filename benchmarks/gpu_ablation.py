"""The GPU stability grid as an ablation: what each part of the fix buys at d=512 on one H200.

The grid ran as two runs of `scripts/gpu_session.sh`, on the same data, tokenizer and batches (their unigram
cross-entropies agree to every digit), before the last part of the fix existed:

- run 1 (`run1_embedding_fix.json`): the twin, the old default (`embedding_multiplier=1.0`, no write norm)
  and the embedding fix alone;
- run 2 (`run2_write_norm.json`): the embedding fix with the write norm.

The shipped default adds `write_multiplier` (0.25 at d=512) on top; it has not run on a GPU yet:
`scripts/gpu_session.sh` runs it. This script merges the two runs' JSON files into one table and figure.

    python -m benchmarks.gpu_ablation   # writes benchmarks/results/stability_gpu_ablation.{md,png}
"""

from __future__ import annotations

import json
from pathlib import Path

from hires_hf.io import write_text_atomic

from .stability import markdown, plot

RESULTS = Path(__file__).resolve().parent / "results"
RUNS_DIR = RESULTS / "stability_gpu"
# Run file -> {arch in that file: label in the merged table}; the old default is the same model in both.
LABELS = {
    "run1_embedding_fix.json": {
        "vanilla": "vanilla",
        "hires-vanilla-embedding": "old default",
        "hires": "+ embedding multiplier",
    },
    "run2_write_norm.json": {"hires": "+ write norm"},
}


def merged() -> dict:
    """One payload: the first run's settings, every run's rows under their labels."""
    payloads = {name: json.loads((RUNS_DIR / name).read_text()) for name in LABELS}
    first = payloads[next(iter(LABELS))]
    order = ["vanilla", "old default", "+ embedding multiplier", "+ write norm"]
    runs = [{**run, "arch": LABELS[name][run["arch"]]} for name, payload in payloads.items() for run in payload["runs"]]
    runs.sort(key=lambda run: (order.index(run["arch"]), run["lr"]))
    return {
        **first,
        "title": "HiRes at d=512 on one H200: each part of the fix, over a learning-rate grid",
        "command": "scripts/gpu_session.sh (two runs; benchmarks/results/stability_gpu/*.json)",
        "minutes": sum(p["minutes"] for p in payloads.values()),
        "figure": "stability_gpu_ablation.png",
        "runs": runs,
    }


def main() -> int:
    payload = merged()
    plot(payload, RESULTS / "stability_gpu_ablation.png")
    text = markdown(payload, checked="+ write norm")
    write_text_atomic(RESULTS / "stability_gpu_ablation.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
