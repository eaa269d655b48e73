"""Where a ladder cell's seed spread comes from: the model's initialisation, or the order of its batches.

A ladder seed fixes two things at once: the initial weights (`torch.manual_seed(seed)` before the model is built)
and the batches (`batch_order(seed)`). On the CPU ladder the shipped HiRes's seeds spread 5-15x wider than the
vanillas' (rung 1 at 8e-3: 2.968 / 2.815 / 3.079; the vanillas' seeds ≤ 0.025 apart). This script trains a
ladder run with the two split: weights from seed i, batches from seed j, everything else the ladder's run (shape,
budget, rate, schedule, precision, compile). The ladder's own runs are the cells with i = j, read from its store;
the crossed cells say which seed moves the loss. Nothing is written to the ladder's store.

    python benchmarks/seed_sources.py --arm hires --rung 64x12 --lr 8e-3 --pairs 1:2 --threads 1
    python benchmarks/seed_sources.py --arm hires --rung 64x12 --lr 8e-3 --pairs 2:1 --threads 1   # beside it
    python benchmarks/seed_sources.py --report          # the table and plot from every stored crossed run

A run checkpoints every few minutes under `checkpoints/` and a rerun of the same command resumes it. Writes
benchmarks/results/seed_sources/{cases/*.json, seed_sources.{json,md,png}} (or under --out-dir).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from hires_hf.commands import set_threads
from hires_hf.commands.ladder import cache_dir
from hires_hf.errors import HiResUserError
from hires_hf.experiments.harness import RunPlan
from hires_hf.experiments.ladder import Ladder, LadderSettings, cell_plan, open_ladder
from hires_hf.experiments.runs import git_commit, machine
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import pyplot
from hires_hf.tables import markdown_table
from hires_hf.training.loop import train_loop

RESULTS = Path(__file__).resolve().parent / "results" / "seed_sources"
LADDER = Path(__file__).resolve().parent / "results" / "ladder"


def case_name(arm: str, rung: str, lr: float, init_seed: int, order_seed: int) -> str:
    return f"{arm}-{rung}-lr{lr:.4g}-init{init_seed}-order{order_seed}"


def train_crossed(ladder: Ladder, plan: RunPlan, init_seed: int, checkpoints: Path, progress: bool) -> dict[str, Any]:
    """`plan` (a ladder run, whose seed fixes the batches) trained from the weights seed `init_seed` draws; with
    `init_seed` equal to the plan's seed this is the ladder's own run, step for step."""
    torch._dynamo.reset()  # a process may train several cases: each compiles its own graphs, as a ladder worker's do
    torch.manual_seed(init_seed)
    model = plan.arm.model(plan.shape, ladder.data).to(ladder.device)
    settings = plan.settings
    checkpoint = checkpoints / f"{plan.key}-init{init_seed}.safetensors"
    checkpoints.mkdir(parents=True, exist_ok=True)
    label = f"{plan.shape.name} {plan.arm.name} lr={settings.learning_rate:g} init={init_seed} order={settings.seed}"
    with tqdm(total=settings.steps, desc=label, disable=not progress, dynamic_ncols=True, mininterval=30) as bar:
        result = train_loop(
            model,
            ladder.data.train,
            ladder.data.validation,
            settings,
            on_step=lambda _: bar.update(1),
            checkpoint=checkpoint,
            checkpoint_seconds=ladder.settings.checkpoint_seconds,
        )
    checkpoint.unlink(missing_ok=True)
    return {
        "arm": plan.arm.name,
        "rung": plan.shape.name,
        "lr": settings.learning_rate,
        "init_seed": init_seed,
        "order_seed": settings.seed,
        "final_loss": result.final_loss,
        "curve": [list(point) for point in result.curve],  # (step, validation loss)
        "steps": result.steps,
        "seconds": result.train_seconds,
        "ladder_key": plan.key,  # the ladder run it crosses: a case whose run has since changed is not read
        "commit": git_commit(),
        "machine": machine(plan.spec),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def ladder_cell(ladder: Ladder, arm: str, rung: str, lr: float, seed: int) -> dict[str, Any] | None:
    """The ladder's stored run at `seed` as a case (weights and batches from the same seed), or None."""
    plan = cell_plan(ladder, arm, rung, lr, seed)
    run = ladder.store.get(plan.key)
    if run is None or run.diverged:
        return None
    tokens_per_step = plan.budget.batch_size * ladder.data.context
    curve = [[round(flops / run.flops_per_token / tokens_per_step), loss] for flops, loss in run.curve]
    return {
        "arm": arm,
        "rung": rung,
        "lr": plan.settings.learning_rate,
        "init_seed": seed,
        "order_seed": seed,
        "final_loss": run.final_loss,
        "curve": curve,
        "steps": run.steps,
        "ladder_key": plan.key,
        "from_ladder": True,
    }


def crossed_cases(ladder: Ladder, out_dir: Path) -> list[dict[str, Any]]:
    """Every stored crossed run whose ladder run is still the one the ladder plans, and the ladder's own runs at the
    seeds they involve (where a same-seed case was not trained here)."""
    cases, cells = [], set()
    for path in sorted((out_dir / "cases").glob("*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        plan = cell_plan(ladder, case["arm"], case["rung"], case["lr"], case["order_seed"])
        if plan.key == case["ladder_key"]:
            cases.append(case)
            cells.add((case["arm"], case["rung"], case["lr"]))
    for arm, rung, lr in sorted(cells):
        mine = {seeds_of(c) for c in cases if (c["arm"], c["rung"], c["lr"]) == (arm, rung, lr)}
        missing = sorted({s for pair in mine for s in pair if (s, s) not in mine})
        cases += [c for seed in missing if (c := ladder_cell(ladder, arm, rung, lr, seed)) is not None]
    return cases


def seeds_of(case: dict[str, Any]) -> tuple[int, int]:
    return case["init_seed"], case["order_seed"]


def effects(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each pair of seeds (a, b) whose four cells are all there, the loss moved by the weights (seed b's
    against seed a's, averaged over both batch orders), by the batches, and their interaction."""
    loss = {(c["arm"], c["rung"], c["lr"], *seeds_of(c)): c["final_loss"] for c in cases}
    rows = []
    for arm, rung, lr in sorted({key[:3] for key in loss}):
        seeds = sorted({s for key in loss if key[:3] == (arm, rung, lr) for s in key[3:]})
        for a, b in itertools.combinations(seeds, 2):
            cell = {(i, j): loss.get((arm, rung, lr, i, j)) for i in (a, b) for j in (a, b)}
            if None in cell.values():
                continue
            init = (cell[b, a] + cell[b, b] - cell[a, a] - cell[a, b]) / 2
            order = (cell[a, b] + cell[b, b] - cell[a, a] - cell[b, a]) / 2
            both = (cell[b, b] - cell[b, a] - cell[a, b] + cell[a, a]) / 2
            rows.append(
                {"arm": arm, "rung": rung, "lr": lr, "seeds": [a, b], "init": init, "order": order, "both": both}
            )
    return rows


def tables(cases: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """Per cell (arm, rung, rate) a matrix of final losses, weights' seed down, batches' seed across; then the
    effects of each complete pair."""
    parts = []
    for arm, rung, lr in sorted({(c["arm"], c["rung"], c["lr"]) for c in cases}):
        mine = {seeds_of(c): c for c in cases if (c["arm"], c["rung"], c["lr"]) == (arm, rung, lr)}
        seeds = sorted({s for pair in mine for s in pair})
        header = ["weights' seed \\ batches' seed", *map(str, seeds)]
        body = []
        for i in seeds:
            cells = [mine.get((i, j)) for j in seeds]
            body.append([str(i), *("" if c is None else f"{c['final_loss']:.3f}" for c in cells)])
        parts += [f"**{arm}, {rung}, lr {lr:g}** (diagonal: the ladder's own runs)", ""]
        parts += [*markdown_table(header, body, align="l" + "r" * len(seeds)), ""]
    if rows:
        header = ["cell", "seeds a, b", "weights b - a", "batches b - a", "interaction"]
        body = [
            [f"{r['arm']} {r['rung']} lr {r['lr']:g}", f"{r['seeds'][0]}, {r['seeds'][1]}"]
            + [f"{r[k]:+.3f}" for k in ("init", "order", "both")]
            for r in rows
        ]
        parts += ["Effects (final loss, each averaged over the other seed):", ""]
        parts += [*markdown_table(header, body, align="llrrr"), ""]
    return "\n".join(parts)


def plot(cases: list[dict[str, Any]], path: Path) -> Path:
    """Validation loss against step for every case: colour the weights' seed, line style the batches'."""
    plt = pyplot()
    cells = sorted({(c["arm"], c["rung"], c["lr"]) for c in cases})
    fig, axes = plt.subplots(1, len(cells), figsize=(7 * len(cells), 5), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, (arm, rung, lr) in zip(axes[0], cells, strict=True):
        mine = sorted((c for c in cases if (c["arm"], c["rung"], c["lr"]) == (arm, rung, lr)), key=seeds_of)
        for case in mine:
            steps, losses = zip(*case["curve"], strict=True)
            init, order = seeds_of(case)
            label = f"weights {init}, batches {order}: {case['final_loss']:.3f}"
            ax.plot(steps[1:], losses[1:], color=f"C{init % 10}", ls=styles[order % len(styles)], label=label)
        ax.set_title(f"{arm}, {rung}, lr {lr:g}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(ladder: Ladder, out_dir: Path) -> str:
    cases = crossed_cases(ladder, out_dir)
    if not cases:
        raise HiResUserError(f"No crossed runs under {out_dir / 'cases'}: train one first (see --help).")
    rows = effects(cases)
    commands = "\n".join(dict.fromkeys(c["command"] for c in cases if "command" in c))
    write_json_atomic(out_dir / "seed_sources.json", {"cases": cases, "effects": rows})
    plot(cases, out_dir / "seed_sources.png")
    text = (
        "# Where the seed spread comes from: weights or batches\n\n"
        "A ladder run trained with its weights from one seed and its batches from another "
        "(`benchmarks/seed_sources.py`); the diagonal is the ladder's own runs.\n\n"
        f"```\n{commands}\n```\n\n{tables(cases, rows)}\n![seed sources](seed_sources.png)\n"
    )
    write_text_atomic(out_dir / "seed_sources.md", text)
    return tables(cases, rows)


def parse_pair(text: str) -> tuple[int, int]:
    init, sep, order = text.partition(":")
    if not sep or not init.isdigit() or not order.isdigit():
        raise argparse.ArgumentTypeError(f"pair {text!r} is not WEIGHTS_SEED:BATCHES_SEED (e.g. 1:2)")
    return int(init), int(order)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arm", default="hires")
    parser.add_argument("--rung", default="64x12", help="a rung of the ladder (its shape's name)")
    parser.add_argument("--lr", type=float, default=8e-3)
    parser.add_argument("--pairs", nargs="*", type=parse_pair, default=[], help="WEIGHTS_SEED:BATCHES_SEED to train")
    parser.add_argument("--report", action="store_true", help="write the table and plot (also after training)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--ladder-dir", type=Path, default=LADDER, help="the ladder whose runs are crossed")
    parser.add_argument("--smoke", action="store_true", help="the ladder's seconds-long smoke settings")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if not args.pairs and not args.report:
        parser.error("nothing to do: give --pairs to train, or --report")
    set_threads(args.threads)
    settings = LadderSettings.smoke() if args.smoke else LadderSettings()
    ladder = open_ladder(settings, args.ladder_dir, cache_dir(), progress=not args.quiet)
    command = shlex.join(["python", "benchmarks/seed_sources.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        for init_seed, order_seed in args.pairs:
            plan = cell_plan(ladder, args.arm, args.rung, args.lr, order_seed)
            name = case_name(args.arm, args.rung, plan.settings.learning_rate, init_seed, order_seed)
            path = args.out_dir / "cases" / f"{name}.json"
            if path.exists() and json.loads(path.read_text(encoding="utf-8"))["ladder_key"] == plan.key:
                continue
            case = train_crossed(ladder, plan, init_seed, args.out_dir / "checkpoints", not args.quiet)
            write_json_atomic(path, {**case, "command": command})
            print(f"weights {init_seed}, batches {order_seed}: {case['final_loss']:.4f}", flush=True)
        print(write_report(ladder, args.out_dir))
    except HiResUserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
