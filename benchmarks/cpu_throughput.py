"""How fast the package trains on this CPU, in every layout, against the cores' own matmul peak.

For d in {128, 256, 512} (the package's shape rule, 8 layers, batches of 16 x 256 tokens, the package's optimizer
and counted FLOPs), HiRes and its control in fp32 and bf16 autocast, each eager and with `torch.compile`, as one
process with every thread or one single-threaded process per core. Reports counted training TFLOP/s, the share
of the cores' measured matmul peak (bf16 or fp32, whichever is faster here: a CPU without bf16 matrix units
emulates bf16), the compile's warm-up (for the first model of a shape and for a second one in the same process:
the compiled graph is reused) and the run length from which the compile pays for itself. Every cell is measured
in this one run, one after the other; run it on a quiet machine.

    python -m benchmarks.cpu_throughput            # writes benchmarks/results/cpu_throughput/
    python -m benchmarks.cpu_throughput --smoke    # seconds (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import pyplot, save_figure
from hires_hf.tables import markdown_table

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_throughput"
# "bf16-emulated": bf16 autocast with fp32 kernels on bf16 operands (`hires_hf.training.bf16_emulation`: what the
# ladder trains with on a CPU without bf16 matrix units)
PRECISIONS = ("fp32", "fp32+compile", "bf16", "bf16+compile", "bf16-emulated", "bf16-emulated+compile")
COLOURS = {
    "fp32": "tab:gray",
    "fp32+compile": "tab:green",
    "bf16": "tab:blue",
    "bf16+compile": "tab:red",
    "bf16-emulated": "tab:purple",
    "bf16-emulated+compile": "tab:pink",
}


def matmul_peak(threads: int, dtype: torch.dtype, largest: int = 4096, seconds: float = 3.0) -> float:
    """TFLOP/s of repeated square products on `threads` threads: the cores' peak. The size doubles from 512 while
    one product takes under a tenth of a second, up to `largest` (where `dtype` is emulated, as bf16 is on a CPU
    without bf16 units, one product of 4096 takes minutes and a smaller one measures the same rate)."""
    torch.set_num_threads(threads)
    size = 256
    while size < largest:
        size *= 2
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        start = time.perf_counter()
        a @ b
        if time.perf_counter() - start > 0.1:
            break
    for _ in range(2):
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - start) / 1e12


def cpu_name() -> str:
    """The CPU's model name and whether it has bf16 matrix units (what decides the loop's "auto" precision)."""
    from hires_hf.experiments.runs import cpu_name as model_name
    from hires_hf.training.loop import bf16_matmul_hardware

    units = "bf16 matrix units (AMX or AVX512-BF16)" if bf16_matmul_hardware("cpu") else "no bf16 matrix units"
    return f"{model_name()}, {units}"


def measure(arm: str, width: int, precision: str, threads: int, steps: int, batch: int, context: int) -> dict:
    """One process: a model of `arm` at `width`, warm-up (compile included), `steps` timed optimizer steps;
    with compile, a second fresh model of the same shape is warmed up too (how much of the compile is reused)."""
    from hires_hf.accounting import train_flops_per_token
    from hires_hf.experiments.harness import CONTROL, HIRES, Arm, Shape
    from hires_hf.training.bf16_emulation import emulated_bf16
    from hires_hf.training.loop import LoopSettings, autocast, build_optimizer

    torch.set_num_threads(threads)
    shape = Shape(hidden_size=width, num_hidden_layers=8)
    chosen = Arm(arm, HIRES if arm == "hires" else CONTROL)

    blocks = SimpleNamespace(special={"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}, context=context)
    config = chosen.config(shape, blocks)  # what Arm needs of the data: the special ids and the context
    cpu = torch.device("cpu")
    ids = torch.randint(0, config.vocab_size, (batch, context))

    def warm_model() -> tuple[Any, Any, float]:
        torch.manual_seed(0)
        model = chosen.model(shape, blocks)
        optimizer = build_optimizer(model, LoopSettings(steps=1, batch_size=batch, learning_rate=1e-3))
        forward = torch.compile(model) if precision.endswith("+compile") else model
        start = time.perf_counter()
        for _ in range(2):
            step(forward, optimizer)
        return forward, optimizer, time.perf_counter() - start

    kind = precision.removesuffix("+compile")

    def step(forward: Any, optimizer: Any) -> None:
        with emulated_bf16() if kind == "bf16-emulated" else nullcontext():
            with autocast(cpu, kind.removesuffix("-emulated")):
                loss = forward(input_ids=ids, labels=ids).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    forward, optimizer, warmup = warm_model()
    start = time.perf_counter()
    for _ in range(steps):
        step(forward, optimizer)
    seconds = time.perf_counter() - start
    second_warmup = warm_model()[2] if precision.endswith("+compile") else None
    tokens_per_second = steps * batch * context / seconds
    return {
        "tokens_per_second": tokens_per_second,
        "tflops": tokens_per_second * train_flops_per_token(config, context) / 1e12,
        "warmup_seconds": warmup,
        "second_model_warmup_seconds": second_warmup,
    }


def in_processes(processes: int, threads: int, cell: dict[str, Any], steps: int, batch: int, context: int) -> dict:
    """`processes` copies of one measurement at once; their throughputs add up, their warm-ups overlap."""
    settings = {**cell, "threads": threads, "steps": steps, "batch": batch, "context": context}
    command = [sys.executable, "-m", "benchmarks.cpu_throughput", "--child", json.dumps(settings)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) for _ in range(processes)]
    results = [json.loads(child.communicate()[0].strip().splitlines()[-1]) for child in children]
    if any(child.returncode for child in children):
        raise RuntimeError(f"a measurement process failed: {cell}")
    return {
        "tokens_per_second": sum(r["tokens_per_second"] for r in results),
        "tflops": sum(r["tflops"] for r in results),
        "warmup_seconds": max(r["warmup_seconds"] for r in results),
        "second_model_warmup_seconds": results[0]["second_model_warmup_seconds"],
    }


def break_even_flops(eager: dict[str, float], compiled: dict[str, float]) -> float | None:
    """Counted FLOPs of a run from which compiling saves more time than its warm-up costs."""
    saved_per_flop = 1 / (eager["tflops"] * 1e12) - 1 / (compiled["tflops"] * 1e12)
    return compiled["warmup_seconds"] / saved_per_flop if saved_per_flop > 0 else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    layouts = {f"1 process x {cores} threads": (1, cores), f"{cores} processes x 1 thread": (cores, 1)}
    peak = {"bf16": matmul_peak(cores, torch.bfloat16), "fp32": matmul_peak(cores, torch.float32)}
    peak["bf16 one core"] = matmul_peak(1, torch.bfloat16)
    best = max(("bf16", "fp32"), key=peak.__getitem__)
    rows = []
    for width in args.widths:
        for arm in ("hires", "control"):
            for precision in args.precisions:
                for layout, (processes, threads) in layouts.items():
                    cell = {"arm": arm, "width": width, "precision": precision}
                    result = in_processes(processes, threads, cell, args.steps, args.batch, args.context)
                    share = result["tflops"] / peak[best]
                    rows.append({**cell, "layout": layout, **result, "share_of_peak": share})
                    print(f"{width} {arm} {precision} {layout}: {result['tflops']:.3f} TFLOP/s", flush=True)
    return {
        "cpu": cpu_name(),
        "peak_tflops": peak,
        "peak_precision": best,
        "rows": rows,
        "batch": args.batch,
        "context": args.context,
        "steps": args.steps,
    }


def table(result: dict[str, Any]) -> list[str]:
    rows = []
    for row in result["rows"]:
        warm = row["second_model_warmup_seconds"]
        rows.append(
            (
                f"{row['width']}x8",
                row["arm"],
                row["precision"],
                row["layout"],
                f"{row['tokens_per_second']:,.0f}",
                f"{row['tflops']:.3f}",
                f"{row['share_of_peak']:.0%}",
                f"{row['warmup_seconds']:.1f}" + ("" if warm is None else f" / {warm:.1f}"),
            )
        )
    peak = f"of {result['peak_precision']} peak"
    headers = ["shape", "arm", "precision", "layout", "tokens/s", "TFLOP/s", peak, "warm-up s (2nd model)"]
    return markdown_table(headers, rows, "llllrrrr")


def hires_cells(result: dict[str, Any]) -> Iterator[tuple[int, str, dict[str, dict[str, Any]]]]:
    """(width, layout, {precision: row}) of HiRes's rows, in order: what the compile and precision lines compare."""
    rows = [row for row in result["rows"] if row["arm"] == "hires"]
    for width in sorted({row["width"] for row in rows}):
        for layout in sorted({row["layout"] for row in rows}):
            yield width, layout, {r["precision"]: r for r in rows if (r["width"], r["layout"]) == (width, layout)}


def compile_lines(result: dict[str, Any]) -> list[str]:
    """Per shape, layout and precision: how much faster the compiled loop is and from how many counted FLOPs a run
    repays its compile (HiRes)."""
    lines = []
    for width, layout, cells in hires_cells(result):
        for eager in ("fp32", "bf16", "bf16-emulated"):
            if eager not in cells or f"{eager}+compile" not in cells:
                continue
            compiled = cells[f"{eager}+compile"]
            flops = break_even_flops(cells[eager], compiled)
            lines.append(
                f"- {width}x8, {layout}: compile x{compiled['tflops'] / cells[eager]['tflops']:.2f} over {eager} "
                "eager; repays itself from " + (f"{flops:.2g} counted FLOPs a run" if flops else "never")
            )
    return lines


def precision_lines(result: dict[str, Any]) -> list[str]:
    """Per shape and layout: bf16 (and emulated bf16) over fp32, eager (HiRes): whether the loop's "auto" precision
    is the faster one, and what the emulation costs."""
    return [
        f"- {width}x8, {layout}: {kind} x{cells[kind]['tflops'] / cells['fp32']['tflops']:.2f} the speed of fp32"
        for width, layout, cells in hires_cells(result)
        for kind in ("bf16", "bf16-emulated")
        if "fp32" in cells and kind in cells
    ]


def plot(result: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    layouts = sorted({row["layout"] for row in result["rows"]})
    widths = sorted({row["width"] for row in result["rows"]})
    for axis, layout in zip(axes, layouts, strict=True):
        for precision, colour in COLOURS.items():
            for arm, marker in (("hires", "o"), ("control", "s")):
                cells = {
                    r["width"]: r["share_of_peak"]
                    for r in result["rows"]
                    if (r["arm"], r["precision"], r["layout"]) == (arm, precision, layout)
                }
                if not cells:
                    continue
                shares = [cells[w] for w in widths]
                axis.plot(widths, [100 * s for s in shares], marker=marker, color=colour, label=f"{precision} {arm}")
        axis.axhline(25, color="black", linestyle=":", linewidth=1)
        axis.set(xscale="log", xlabel="hidden size d (L = 8)", title=layout)
        axis.set_xticks(widths, [str(w) for w in widths])
        axis.set_xticks([], minor=True)  # a log axis's minor labels crowd two or three widths
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(f"counted training TFLOP/s, % of the cores' {result['peak_precision']} matmul peak")
    axes[0].legend(fontsize=7)
    return save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps per measurement")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS[:4]), choices=PRECISIONS)
    parser.add_argument("--smoke", action="store_true", help="tiny widths and batches, into a temporary folder")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        cell = json.loads(args.child)
        keys = ("arm", "width", "precision", "threads", "steps", "batch", "context")
        print(json.dumps(measure(*(cell[k] for k in keys))))
        return 0
    if args.smoke:
        args.widths, args.steps, args.batch, args.context, args.precisions = [32, 64], 1, 2, 32, ["fp32", "bf16"]
    result = run(args) | {"command": "python -m benchmarks.cpu_throughput " + " ".join(argv or sys.argv[1:])}
    peak = result["peak_tflops"]
    lines = [
        "# Training throughput on this CPU",
        "",
        f"`{result['command'].strip()}`: the package's shape rule at d x 8, batches of {args.batch} x {args.context}, "
        f"{args.steps} timed steps after 2 warm-up steps, every cell in this one run. CPU: {result['cpu']}. The "
        f"cores' measured matmul peak: bf16 {peak['bf16']:.3g} TFLOP/s ({peak['bf16 one core']:.3g} on one core), "
        f"fp32 {peak['fp32']:.3g}.",
        "",
        *table(result),
        "",
        "When `torch.compile` pays (HiRes; the loop compiles runs of at least `COMPILE_MIN_FLOPS` counted FLOPs):",
        "",
        *compile_lines(result),
        "",
        "bf16 against fp32 (HiRes, eager; the loop's `auto` precision is bf16 only on CPUs with bf16 matrix units):",
        "",
        *precision_lines(result),
        "",
        "![share of peak](cpu_throughput.png)",
    ]
    text = "\n".join(lines) + "\n"
    write_json_atomic(args.out / "cpu_throughput.json", result)
    plot(result, args.out / "cpu_throughput.png")
    write_text_atomic(args.out / "cpu_throughput.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
