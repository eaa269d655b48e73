"""Learning-rate sensitivity: HiRes (k = 2 and k = 4) against the vanilla control at matched counted FLOPs.

The quality half trains every model at one learning rate. This sweep asks whether that choice decides the
comparison: at each peak learning rate, HiRes, the control (the Llama twin with HiRes's embedding scale, the
baseline) and the plain Llama twin spend the same counted training FLOPs
(HiRes takes fewer steps), on the same batches, and the final validation losses are compared.

    python benchmarks/lr_sensitivity.py                      # d=96, L=8, D=2d; ~25 CPU minutes on one thread
    python benchmarks/lr_sensitivity.py --lrs 1e-3 2e-3 --vanilla-steps 600 --jobs 2

Writes benchmarks/results/lr_sensitivity.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from hires_hf.experiments.harness import CONTROL, HIRES, PLAIN, Arm
from hires_hf.tables import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
# The control (Llama with HiRes's embedding scale) is the baseline; the plain twin is a second row.
ARMS = {
    "control": Arm("control", CONTROL),
    "plain twin": Arm("plain twin", PLAIN),
    "hires k=2": Arm("hires k=2", HIRES, {"layers_per_block": 2}),
    "hires k=4": Arm("hires k=4", HIRES, {"layers_per_block": 4}),
}


def run_one(job: dict) -> dict:
    """Train one (architecture, lr) run in a fresh process through the experiment harness (its data path, shape
    rule, FLOP budget and loop); returns its final validation loss."""
    import torch

    torch.set_num_threads(1)
    from hires_hf.experiments.harness import Budget, Shape, prepare_data, train_run

    data = prepare_data("stdlib", 512, job["block_size"], max_chars=4_000_000, validation_fraction=0.05, progress=False)
    shape = Shape(hidden_size=job["hidden_size"], num_hidden_layers=job["layers"], head_dim=16, vocab_size=512)
    tokens_per_step = job["batch_size"] * job["block_size"]
    control = ARMS["control"].flops_per_token(shape, data) * tokens_per_step
    budget = Budget(job["vanilla_steps"] * control * (1 + 1e-9), job["batch_size"])  # equal counted FLOPs
    run = train_run(ARMS[job["arch"]], job["lr"], shape, data, budget, evaluations=4)
    return {
        **job,
        "steps": run.steps,
        "flops": run.steps * tokens_per_step * run.flops_per_token,
        "loss": run.final_loss,
    }


def write_report(rows: list[dict], command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    archs = [arch for arch in (*ARMS, "vanilla") if any(row["arch"] == arch for row in rows)]
    lrs = sorted({row["lr"] for row in rows})
    loss = {(row["arch"], row["lr"]): row["loss"] for row in rows}
    lines = [
        "## Learning-rate sensitivity",
        "",
        f"Command: `{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {_commit()}); "
        f"{platform.processor() or platform.machine()}, 1 torch thread per run.",
        "",
        f"d={rows[0]['hidden_size']}, L={rows[0]['layers']}, D=2d, vocab 512, blocks of {rows[0]['block_size']} "
        f"tokens, batch {rows[0]['batch_size']}; vanilla takes {rows[0]['vanilla_steps']} steps and each HiRes "
        "the steps that spend the same counted training FLOPs; one seed, same batches; the experiment harness's loop. "
        "The control (the baseline) is the Llama twin with HiRes's embedding scale. Final validation loss:",
        "",
        *markdown_table(
            ["peak lr", *archs],
            [[f"{lr:g}", *(f"{loss[(arch, lr)]:.4f}" for arch in archs)] for lr in lrs],
            align="r" * (len(archs) + 1),
        ),
    ]
    best = {arch: min(lrs, key=lambda lr: loss[(arch, lr)]) for arch in archs}
    lines += ["", "Best learning rate: " + ", ".join(f"{a} {best[a]:g} ({loss[(a, best[a])]:.4f})" for a in archs)]
    lines += ["", "![lr_sensitivity.png](results/lr_sensitivity.png)", ""]
    (RESULTS / "lr_sensitivity.md").write_text("\n".join(lines))
    (RESULTS / "lr_sensitivity.json").write_text(json.dumps(rows, indent=2) + "\n")
    figure, axis = plt.subplots(figsize=(6, 4))
    for arch in archs:
        axis.plot(lrs, [loss[(arch, lr)] for lr in lrs], marker="o", label=arch)
    axis.set(
        xscale="log",
        xlabel="peak learning rate",
        ylabel="final validation loss",
        title="Matched counted FLOPs: loss vs learning rate",
    )
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / "lr_sensitivity.png", dpi=120)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[5e-4, 1e-3, 2e-3, 4e-3])
    parser.add_argument("--hidden-size", type=int, default=96)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vanilla-steps", type=int, default=1800)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    jobs = [
        {
            "arch": arch,
            "lr": lr,
            "hidden_size": args.hidden_size,
            "layers": args.layers,
            "vanilla_steps": args.vanilla_steps,
            "block_size": args.block_size,
            "batch_size": args.batch_size,
        }
        for lr in args.lrs
        for arch in ARMS
    ]
    from tqdm import tqdm

    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(tqdm(pool.map(run_one, jobs), total=len(jobs), desc="lr sweep"))
    write_report(rows, "python benchmarks/lr_sensitivity.py " + " ".join(sys.argv[1:]))
    print((RESULTS / "lr_sensitivity.md").read_text())


if __name__ == "__main__":
    main()
