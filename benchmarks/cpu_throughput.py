"""How to spend 2 CPU cores on many small training runs: one process with 2 threads, two processes with one thread
each, or `torch.compile`. Measured on the sweep's d=128, L=16 HiRes (batches of 16 x 128 tokens), side by side in
one run; reports aggregate training tokens/s and the ratio to one process with one thread.

    python -m benchmarks.cpu_throughput          # ~3 minutes; writes benchmarks/results/cpu_throughput.{md,json}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.tables import markdown_table

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_throughput"


def measure(threads: int, compiled: bool, steps: int, batch: int, context: int) -> dict[str, float]:
    """Training tokens/s of one process: a warm-up (compilation included) then `steps` timed optimizer steps."""
    from transformers import AutoModelForCausalLM

    from hires_hf.experiments.harness import Shape

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = Shape().config({"pad_token_id": 0, "bos_token_id": None, "eos_token_id": 0}, context)
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward = torch.compile(model) if compiled else model
    ids = torch.randint(0, config.vocab_size, (batch, context))

    def step() -> None:
        forward(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    start = time.perf_counter()
    for _ in range(2):
        step()
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = time.perf_counter() - start
    return {"tokens_per_second": steps * batch * context / seconds, "warmup_seconds": warmup}


def in_processes(count: int, threads: int, compiled: bool, steps: int) -> dict[str, float]:
    """`count` processes at once, each measuring itself; their tokens/s add up."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.cpu_throughput",
        "--child",
        str(threads),
        str(int(compiled)),
        str(steps),
    ]
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    results = [json.loads(child.communicate()[0].strip().splitlines()[-1]) for child in children]
    return {
        "tokens_per_second": sum(r["tokens_per_second"] for r in results),
        "warmup_seconds": max(r["warmup_seconds"] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="timed optimizer steps per measurement")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        threads, compiled, steps = (int(value) for value in args.child)
        print(json.dumps(measure(threads, bool(compiled), steps, 16, 128)))
        return 0
    layouts = {
        "1 process x 1 thread": (1, 1, False),
        "1 process x 2 threads": (1, 2, False),
        "2 processes x 1 thread": (2, 1, False),
        "1 process x 2 threads, torch.compile": (1, 2, True),
        "2 processes x 1 thread, torch.compile": (2, 1, True),
    }
    rows = {name: in_processes(*layout, args.steps) for name, layout in layouts.items()}
    base = rows["1 process x 1 thread"]["tokens_per_second"]
    lines = [
        "# Spending 2 CPU cores on small training runs",
        "",
        f"`python -m benchmarks.cpu_throughput` (d=128, L=16 HiRes, batches of 16 x 128, {args.steps} timed steps "
        "after 2 warm-up steps; every layout measured in this one run).",
        "",
    ]
    cells = [
        [
            name,
            f"{row['tokens_per_second']:,.0f}",
            f"{row['tokens_per_second'] / base:.2f}x",
            f"{row['warmup_seconds']:.1f}",
        ]
        for name, row in rows.items()
    ]
    lines += markdown_table(["layout", "training tokens/s (all processes)", "vs 1 x 1", "warm-up s"], cells, "lrrr")
    text = "\n".join(lines) + "\n"
    write_text_atomic(RESULTS / "cpu_throughput.md", text)
    write_json_atomic(RESULTS / "cpu_throughput.json", rows)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
