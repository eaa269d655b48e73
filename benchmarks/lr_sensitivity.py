"""Learning-rate sensitivity: HiRes (k = 2 and k = 4) against its vanilla twin at matched counted FLOPs.

The quality half trains every model at one learning rate. This sweep asks whether that choice decides the
comparison: at each peak learning rate, HiRes and its Llama twin spend the same counted training FLOPs
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

RESULTS = Path(__file__).resolve().parent / "results"


def run_one(job: dict) -> dict:
    """Train one (architecture, lr) run in a fresh process; returns its final validation loss."""
    import torch

    torch.set_num_threads(1)
    from hires_hf import HiResConfig
    from hires_hf.training import (
        PackedDataset,
        TrainSettings,
        build_tokenizer,
        encode_documents,
        load_default_corpus,
        pack,
        special_token_ids,
        train_flops_per_token,
        train_model,
    )
    from hires_hf.twins import vanilla_config

    corpus = load_default_corpus(max_chars=4_000_000)
    tokenizer = build_tokenizer(corpus.train, vocab_size=512, sample_chars=1_000_000)
    eos = tokenizer.eos_token_id
    train = PackedDataset(pack(encode_documents(tokenizer, corpus.train), job["block_size"], eos))
    valid = PackedDataset(pack(encode_documents(tokenizer, corpus.validation), job["block_size"], eos)[:64])
    d, layers = job["hidden_size"], job["layers"]
    hires = HiResConfig(
        vocab_size=512,
        hidden_size=d,
        intermediate_size=int(8 * d / 3 / 8 + 1) * 8,
        num_hidden_layers=layers,
        num_attention_heads=d // 16,
        max_position_embeddings=2 * job["block_size"],
        residual_size=2 * d,
        layers_per_block=job["k"] or 2,
        **special_token_ids(tokenizer),
    )
    config = hires if job["k"] else vanilla_config(hires)
    flops = train_flops_per_token(config, job["block_size"])
    vanilla_flops = train_flops_per_token(vanilla_config(hires), job["block_size"])
    steps = int(job["vanilla_steps"] * vanilla_flops / flops)  # equal counted FLOPs
    settings = TrainSettings(
        max_steps=steps, batch_size=job["batch_size"], learning_rate=job["lr"], progress=False, save_model=False
    )
    scratch = Path(job["scratch"]) / f"{job['arch']}-{job['lr']}"
    result = train_model(config, tokenizer, train, valid, settings, output_dir=scratch)
    return {
        **job,
        "steps": steps,
        "flops": steps * job["batch_size"] * job["block_size"] * flops,
        "loss": result.final_eval_loss,
    }


def write_report(rows: list[dict], command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    archs = sorted({row["arch"] for row in rows}, key=lambda a: (a != "vanilla", a))
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
        "the steps that spend the same counted training FLOPs; one seed, same batches. Final validation loss:",
        "",
        "| peak lr | " + " | ".join(archs) + " |",
        "|---:|" + "---:|" * len(archs),
    ]
    for lr in lrs:
        lines.append(f"| {lr:g} | " + " | ".join(f"{loss[(arch, lr)]:.4f}" for arch in archs) + " |")
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
    parser.add_argument("--scratch", default="runs/lr_sensitivity")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    archs = {"vanilla": 0, "hires k=2": 2, "hires k=4": 4}
    jobs = [
        {
            "arch": arch,
            "k": k,
            "lr": lr,
            "hidden_size": args.hidden_size,
            "layers": args.layers,
            "vanilla_steps": args.vanilla_steps,
            "block_size": args.block_size,
            "batch_size": args.batch_size,
            "scratch": args.scratch,
        }
        for lr in args.lrs
        for arch, k in archs.items()
    ]
    from tqdm import tqdm

    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(tqdm(pool.map(run_one, jobs), total=len(jobs), desc="lr sweep"))
    write_report(rows, "python benchmarks/lr_sensitivity.py " + " ".join(sys.argv[1:]))
    print((RESULTS / "lr_sensitivity.md").read_text())


if __name__ == "__main__":
    main()
