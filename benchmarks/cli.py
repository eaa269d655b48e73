"""`python -m benchmarks` (from the repository root): run the benchmark halves and rewrite RESULTS.md.

The benchmarks belong to the repository checkout, not to the installed `hires_hf` package, which never imports
them. Each half saves what it measured in its folder under `results/` (cost/cost.json, gpu/gpu.json) and the
report is then reassembled from everything there, so running one half keeps the others' sections. Quality is the
compute ladder's (`hires-hf ladder`, results/ladder/), which writes its own section.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hires_hf.errors import HiResUserError

from . import report, serving
from .cost import CostSettings, profile_misses, run_cost
from .gpu import SHAPES, GpuSettings, run_gpu

HALVES = ("cost", "gpu", "serving")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from error


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = CostSettings()
    parser.add_argument(
        "--only", action="append", choices=HALVES, help="run only this half (repeatable); default: all of them"
    )
    parser.add_argument(
        "--output-dir", type=Path, default=report.BENCHMARKS_DIR, help="where RESULTS.md and results/ go"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")

    cost = parser.add_argument_group("cost half (defaults fit a shared 2-core CPU; raise them on a bigger machine)")
    cost.add_argument("--hidden-size", type=int, default=defaults.hidden_size, help="d, every row's compute width")
    cost.add_argument("--layers", type=int, default=defaults.num_layers, help="L")
    cost.add_argument("--heads", type=int, default=defaults.num_heads)
    cost.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    cost.add_argument("--seq-len", type=int, default=defaults.seq_len)
    cost.add_argument("--batch-size", type=int, default=defaults.batch_size)
    cost.add_argument("--experts", type=int, default=defaults.num_experts)
    cost.add_argument("--experts-per-tok", type=int, default=defaults.experts_per_tok)
    cost.add_argument("--expert-width", type=int, default=None, help="default: d")
    cost.add_argument(
        "--experts-implementation",
        default=defaults.experts_implementation,
        choices=("eager", "batched_mm", "grouped_mm"),
        help="experts kernel, the same for OLMoE and HiRes-MoE",
    )
    cost.add_argument("--layers-per-block", type=_ints, default=defaults.layers_per_block, help="k values, e.g. 2,4,8")
    cost.add_argument("--width-factors", type=_ints, default=defaults.width_factors, help="D / d values, e.g. 1,2,4")
    cost.add_argument("--repeats", type=int, default=defaults.repeats, help="timed interleaved repetitions")
    cost.add_argument("--warmup", type=int, default=defaults.warmup)
    cost.add_argument("--decode-tokens", type=int, default=defaults.decode_tokens)
    cost.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help="torch threads; 1 keeps ratios stable on a shared CPU (spinning threads suffer most from contention)",
    )
    cost.add_argument("--no-moe", action="store_true", help="dense rows only")
    cost.add_argument("--no-peers", action="store_true", help="leave out mHC and Block AttnRes")
    cost.add_argument("--no-profile", action="store_true", help="do not profile rows that miss a time target")

    gpu = parser.add_argument_group("GPU section (CUDA only; skipped elsewhere)")
    gpu.add_argument("--gpu-shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}")
    gpu.add_argument("--gpu-seq-len", type=int, default=GpuSettings.seq_len)
    gpu.add_argument("--gpu-batch-size", type=int, default=GpuSettings.batch_size)
    gpu.add_argument("--gpu-steps", type=int, default=GpuSettings.steps)
    gpu.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s, for an unlisted GPU")
    serving.add_arguments(parser)


def cost_settings(args: argparse.Namespace) -> CostSettings:
    """Settings from the flags, refusing shapes that cannot build every row."""
    for k in args.layers_per_block:
        if k <= 0 or args.layers % k:
            raise HiResUserError(
                f"--layers-per-block {k} does not divide --layers {args.layers}; pick k values that divide L."
            )
    if any(factor < 1 for factor in args.width_factors):
        raise HiResUserError(f"--width-factors {args.width_factors}: D = factor x d needs factors >= 1.")
    if args.repeats < 1:
        raise HiResUserError("--repeats must be at least 1 (ratios need a timed repetition).")
    return CostSettings(
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        num_experts=args.experts,
        experts_per_tok=args.experts_per_tok,
        expert_width=args.expert_width,
        experts_implementation=args.experts_implementation,
        layers_per_block=args.layers_per_block,
        width_factors=args.width_factors,
        include_moe=not args.no_moe,
        include_peers=not args.no_peers,
        repeats=args.repeats,
        warmup=args.warmup,
        prompt_len=min(32, args.seq_len),
        decode_tokens=args.decode_tokens,
        threads=args.threads,
    )


def gpu_settings(args: argparse.Namespace) -> GpuSettings:
    shapes = tuple(args.gpu_shapes.split(","))
    unknown = [shape for shape in shapes if shape not in SHAPES]
    if unknown:
        raise HiResUserError(f"--gpu-shapes: unknown {unknown}; choose from {', '.join(SHAPES)}.")
    return GpuSettings(
        shapes=shapes,
        seq_len=args.gpu_seq_len,
        batch_size=args.gpu_batch_size,
        steps=args.gpu_steps,
        peak_tflops=args.peak_tflops,
    )


def run_bench(args: argparse.Namespace) -> int:
    """Run the requested halves, save each one's measurements, rewrite RESULTS.md."""
    halves = args.only or list(HALVES)
    results_dir = args.output_dir / "results"
    command = report.command_line()
    progress = not args.quiet
    if "cost" in halves:
        settings = cost_settings(args)
        environment = report.environment() | {"torch_threads": settings.threads}
        cost = run_cost(settings, progress=progress)
        if not args.no_profile:
            cost["profiles"] = profile_misses(settings, cost)
        cost |= {"command": command, "environment": environment, "load_average_end": os.getloadavg()[0]}
        report.save_json(results_dir / "cost" / "cost.json", cost)
    if "gpu" in halves:
        gpu = run_gpu(gpu_settings(args), progress=progress)
        gpu |= {"command": command, "environment": report.environment()}
        # A CPU-only run must not overwrite real GPU rows measured earlier on a CUDA machine.
        earlier = report.load_json(results_dir / "gpu" / "gpu.json")
        if not (gpu.get("skipped") and earlier and not earlier.get("skipped")):
            report.save_json(results_dir / "gpu" / "gpu.json", gpu)
        if gpu.get("skipped"):
            print(f"benchmarks: GPU section: {gpu['skipped']}", file=sys.stderr)
    if "serving" in halves:  # vLLM only: skipped with one line where it is not installed
        serving.run_serving(serving.settings_from(args), results_dir / "serving")
    path = report.write_results(args.output_dir)
    print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_bench(args)
    except (HiResUserError, ValueError) as error:
        cause = error.__cause__ if isinstance(error.__cause__, ValueError) else error
        print(f"benchmarks: error: {cause}", file=sys.stderr)
        return 2


__all__ = ["add_arguments", "main", "run_bench"]
