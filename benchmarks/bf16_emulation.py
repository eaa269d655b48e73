"""Is a bf16 run computed by fp32 kernels (a CPU without bf16 matrix units) the same run as on bf16 kernels?

The ladder's precision check stores bf16 runs of the control and HiRes at its floor's shape (two seeds each, and
the same in fp32), trained on bf16 matrix units. This retrains their seed-0 bf16 runs under
`hires_hf.training.bf16_emulation.emulated_bf16` (the same plan and key: initialisation, batches, recipe) into a
store of its own, and sets each difference against the seed spread and the bf16 - fp32 gap of the stored runs.
If it is far below both, the ladder's runs computed either way are cells of one ladder.

    python -m benchmarks.bf16_emulation           # ~1 h on one core; writes benchmarks/results/bf16_emulation/
    python -m benchmarks.bf16_emulation --smoke   # a minute: a smoke ladder trained here first, then retrained
                                                  # (the plumbing, for the tests: emulated on both sides on a CPU
                                                  # without bf16 units, where the retrained runs must be identical)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from hires_hf.commands.ladder import cache_dir
from hires_hf.experiments.harness import execute
from hires_hf.experiments.ladder import Ladder, LadderSettings, open_ladder, precision_stage, run_stages
from hires_hf.experiments.runs import Run, RunStore
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import pyplot, save_figure
from hires_hf.tables import markdown_table
from hires_hf.training.bf16_emulation import emulated_bf16, needs_emulation

RESULTS = Path(__file__).resolve().parent / "results" / "bf16_emulation"
LADDER = Path(__file__).resolve().parent / "results" / "ladder"


def seed_runs(ladder: Ladder) -> dict[str, dict[str, list[Run]]]:
    """The precision check's stored runs: {arm: {precision: [runs by seed]}}."""
    runs: dict[str, dict[str, list[Run]]] = {}
    for plan in precision_stage(ladder):
        run = ladder.store.get(plan.key)
        if run is not None:
            runs.setdefault(plan.arm.name, {}).setdefault(plan.settings.precision, []).append(run)
    return runs


def retrain(ladder: Ladder, store: RunStore) -> dict[str, tuple[Run, Run]]:
    """{arm: (stored native run, the same plan trained under emulation)} for the precision check's bf16 seed 0."""
    pairs = {}
    for plan in precision_stage(ladder):
        if plan.settings.precision != "bf16" or plan.settings.seed != 0:
            continue
        native = ladder.store.get(plan.key)
        if native is None:
            raise SystemExit(f"No stored bf16 run of {plan.arm.name}: run the ladder's precision stage first.")
        with emulated_bf16():
            execute(plan, ladder.data, ladder.device, store)
        pairs[plan.arm.name] = (native, store.get(plan.key))  # as stored: with the machine it trained on
    return pairs


def summarize(pairs: dict[str, tuple[Run, Run]], seeds: dict[str, dict[str, list[Run]]]) -> dict[str, Any]:
    """Per arm: both final losses, their difference, and the stored runs' seed spread and bf16 - fp32 gap."""
    arms = {}
    for arm, (native, emulated) in pairs.items():
        by_precision = {p: [r.final_loss for r in runs] for p, runs in seeds[arm].items()}
        arms[arm] = {
            "native": native.final_loss,
            "emulated": emulated.final_loss,
            "difference": emulated.final_loss - native.final_loss,
            "largest_curve_difference": max(abs(a[1] - b[1]) for a, b in zip(native.curve, emulated.curve)),
            "seed_spread": max(max(v) - min(v) for v in by_precision.values()),
            "bf16_minus_fp32": statistics.fmean(by_precision["bf16"]) - statistics.fmean(by_precision["fp32"]),
            "native_machine": native.machine,
            "emulated_machine": emulated.machine,
            "tokens_per_second": {"native": native.tokens_per_second, "emulated": emulated.tokens_per_second},
        }
    return {"arms": arms}


def markdown(summary: dict[str, Any], shape: str, tokens: float, command: str) -> str:
    rows = [
        [
            arm,
            f"{a['native']:.4f}",
            f"{a['emulated']:.4f}",
            f"{a['difference']:+.4f}",
            f"{a['largest_curve_difference']:.4f}",
            f"{a['seed_spread']:.4f}",
            f"{a['bf16_minus_fp32']:+.4f}",
            f"{a['tokens_per_second']['native']:,.0f} / {a['tokens_per_second']['emulated']:,.0f}",
        ]
        for arm, a in summary["arms"].items()
    ]
    header = ["arm", "bf16 kernels", "fp32 kernels", "difference", "largest on the curve", "seed spread"]
    header += ["bf16 - fp32", "tokens/s (bf16 / fp32 kernels)"]
    machines = {a["emulated_machine"]["cpu"] for a in summary["arms"].values() if a["emulated_machine"]}
    lines = [
        "# bf16 runs on bf16 kernels and on fp32 kernels",
        "",
        f"`{command}`: the ladder's precision-check runs (bf16, seed 0, {shape}, {tokens / 1e6:g}M tokens) as stored "
        f"(trained on bf16 matrix units) and retrained here under `emulated_bf16` on {', '.join(machines)} "
        "(fp32 kernels on bf16 operands, results rounded to bf16), with the stored runs' seed spread and bf16 - "
        "fp32 gap (two seeds each) to measure the difference by. Final validation loss, nats; the largest "
        "difference anywhere on the two validation curves.",
        "",
        *markdown_table(header, rows, "lrrrrrrr"),
        "",
        "![curves](bf16_emulation.png)",
        "",
    ]
    return "\n".join(lines)


def plot(pairs: dict[str, tuple[Run, Run]], path: Path) -> Path:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for (arm, (native, emulated)), colour in zip(pairs.items(), ("tab:blue", "tab:red"), strict=False):
        for run, style, kernels in ((native, "-", "bf16 kernels"), (emulated, "--", "fp32 kernels")):
            flops, losses = zip(*run.curve[1:], strict=True)
            axes.plot(flops, losses, style, color=colour, label=f"{arm}, {kernels}")
    axes.set(xlabel="counted training FLOPs", ylabel="validation loss (nats)", xscale="log")
    axes.set_title("one bf16 run on two kinds of kernels")
    axes.legend()
    return save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a smoke ladder, trained here first (seconds)")
    parser.add_argument("--ladder", type=Path, default=LADDER, help="the ladder whose precision check to retrain")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: beside the ladder's workers)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        if args.smoke:
            smoke = LadderSettings.smoke(precision="bf16", floor_tokens=(4e3,))  # the floor: its rate alone
            ladder = open_ladder(smoke, Path(scratch), progress=False)
            with emulated_bf16() if needs_emulation("cpu", "bf16") else nullcontext():
                run_stages(ladder, ["floor", "precision"], progress=False, log=lambda line: None)
        else:
            ladder = open_ladder(LadderSettings(), args.ladder, cache_dir())  # the ladder's own prepared corpus
        pairs = retrain(ladder, RunStore(args.out / "runs"))
        summary = summarize(pairs, seed_runs(ladder))
    rung = ladder.rungs[ladder.settings.floor_rung]
    command = "python -m benchmarks.bf16_emulation" + (" --smoke" if args.smoke else "")
    write_json_atomic(args.out / "bf16_emulation.json", summary)
    plot(pairs, args.out / "bf16_emulation.png")
    text = markdown(summary, rung.name, ladder.settings.precision_tokens, command)
    write_text_atomic(args.out / "bf16_emulation.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
