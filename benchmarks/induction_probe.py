"""Is a ladder run's mid-run plateau the induction-head transition, and does HiRes make it later?

The shipped HiRes's seeds at CPU rung 1 end 0.264 apart (the vanillas' ≤ 0.07). Their traces part at step ~700:
some fall, others sit on a plateau near 3.2 nats for a few hundred steps. A plateau at that point of a small
language model's training is the textbook sign of the induction-head phase change (a model learns to copy what
followed an earlier occurrence of the current token). This script retrains a ladder run, step for step the
ladder's own, and every `--every` steps measures its in-context copying: the loss on a second copy of a random
token sequence against the loss on the first copy (shuffled validation tokens, so nothing but copying helps).
If the hypothesis holds, the copying gain jumps as each run leaves the plateau, later for the seeds that sit on
it longer. The training loss is read from the ladder's stored trace of the same run. The report also reads, for
every ladder run at each arm's best rate, when it left the plateau from that trace alone (no retraining), and
whether within a cell the seeds that leave later end worse (`plateau_exits.png`).

    python benchmarks/induction_probe.py --arm hires --rung 64x12 --lr 8e-3 --seeds 1 2 --until 1600 --threads 1
    python benchmarks/induction_probe.py --report      # table and plot from every stored case

A run stops at `--until` (its learning-rate schedule is still the full run's); it checkpoints every few minutes
under `checkpoints/` and a rerun of the same command resumes it. Writes
benchmarks/results/induction_probe/{cases/*.json, induction_probe.{json,md,png}} (or under --out-dir).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from hires_hf.commands import set_threads
from hires_hf.commands.ladder import cache_dir
from hires_hf.errors import HiResUserError
from hires_hf.experiments.harness import HIRES, RunPlan, Shape
from hires_hf.experiments.ladder import Ladder, LadderSettings, cell_plan, ladder_arms, open_ladder
from hires_hf.experiments.ladder_plots import running_mean
from hires_hf.experiments.runs import RunStore, git_commit, machine
from hires_hf.experiments.seed_noise import t_quantile
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import ARM_COLOURS, pyplot
from hires_hf.tables import markdown_table
from hires_hf.training.checkpoint import read_progress
from hires_hf.training.loop import autocast, train_loop

RESULTS = Path(__file__).resolve().parent / "results" / "induction_probe"
LADDER = Path(__file__).resolve().parent / "results" / "ladder"
ONSET_NATS = 1.0  # a copying gain this large marks the transition as under way
HEAD_SCORE = 0.5  # a previous-token head this strong (half its attention on the token before) has formed
PROBE_SEQUENCES = 32
ZOOM_FROM = 300  # the loss plot's top is the highest loss from this step on
LINE_STYLES = ("-", "--", ":", "-.")  # one per seed of an arm, in the order they are listed
PROBE_SEED = 1234  # the probe's own generator: the training run's random state is never touched
EXIT_NATS = 3.0  # the plateau before copying sits at 3.2-3.4 nats on the ladder's corpus: under 3.0 a run has left it
PERMUTATIONS = 10_000  # shuffles of each cell's final losses behind the exit order's p-value
EXIT_WINDOW = 50  # steps the training loss is averaged over before it is compared with EXIT_NATS
DELAY_STEPS = 100  # the delay whose cost in final loss the exit table reports
VANILLAS = ("control", "plain-twin")  # the arms whose latest exit at a rung marks a seed there as on time or late


class Enough(Exception):
    """Raised from the step hook at `--until`: the rest of the run is not needed for the probe."""


def case_name(arm: str, rung: str, lr: float, seed: int) -> str:
    return f"{arm}-{rung}-lr{lr:.4g}-s{seed}"


def repeated_sequences(validation: torch.Tensor, count: int, half: int) -> torch.Tensor:
    """(count, 2 * half) sequences, each a random draw of validation tokens followed by the same draw again:
    only copying from the first half can predict the second better than the first."""
    generator = torch.Generator().manual_seed(PROBE_SEED)
    tokens = validation.flatten()
    picks = torch.randint(len(tokens), (count, half), generator=generator)
    first = tokens[picks]
    return torch.cat([first, first], dim=1)


@torch.no_grad()
def copy_losses(model: nn.Module, sequences: torch.Tensor, precision: str) -> tuple[float, float]:
    """Mean next-token loss on the first copy and on the second (each copy's first token left out: nothing
    before it says what it is)."""
    was_training = model.training
    model.eval()
    with autocast(sequences.device, precision):
        logits = model(input_ids=sequences).logits
    model.train(was_training)
    losses = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), sequences[:, 1:], reduction="none")
    half = sequences.shape[1] // 2
    return losses[:, : half - 1].mean().item(), losses[:, half:].mean().item()


@torch.no_grad()
def head_scores(model: nn.Module, sequences: torch.Tensor) -> dict[str, list[float]]:
    """Per layer, its strongest head's *induction* score (the attention a second-copy token pays to the token that
    followed its first occurrence, which is what an induction head looks up) and *previous-token* score (the
    attention a first-copy token pays to the token just before it, the other half of the circuit): where in depth
    the copying circuit lives. Read in fp32 eager attention, the only kind that returns its weights."""
    was_training, implementation = model.training, model.config._attn_implementation
    model.eval()
    model.set_attn_implementation("eager")
    try:
        attentions = model(input_ids=sequences, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(implementation)
        model.train(was_training)
    half = sequences.shape[1] // 2
    second = torch.arange(half, 2 * half - 1, device=sequences.device)  # a token whose successor is known
    first = torch.arange(1, half, device=sequences.device)
    induction, previous = [], []
    for weights in attentions:  # (batch, heads, query, key)
        induction.append(weights[:, :, second, second - half + 1].mean(dim=(0, 2)).max().item())
        previous.append(weights[:, :, first, first - 1].mean(dim=(0, 2)).max().item())
    return {"induction": induction, "previous": previous}


def probe_hook(
    sequences: torch.Tensor, precision: str, every: int, rows: dict[int, dict[str, float]], save: Callable[[], None]
) -> Callable[[nn.Module, int], None]:
    """An `after_update` hook: every `every` steps, the copy losses into `rows` (keyed by step), then `save()`."""

    def hook(model: nn.Module, step: int) -> None:
        if (step + 1) % every:
            return
        first, second = copy_losses(model, sequences, precision)
        row = {"step": step + 1, "first": first, "second": second, "gain": first - second}
        rows[step + 1] = {**row, **head_scores(model, sequences)}
        save()

    return hook


def train_probed(
    ladder: Ladder, plan: RunPlan, every: int, until: int, checkpoints: Path, progress: bool
) -> dict[str, Any]:
    """The ladder's run `plan` (same seed, weights, batches and schedule), probed every `every` steps up to step
    `until`; the final loss only where `until` reaches the run's end."""
    torch._dynamo.reset()
    settings = plan.settings
    torch.manual_seed(settings.seed)
    model = plan.arm.model(plan.shape, ladder.data).to(ladder.device)
    sequences = repeated_sequences(ladder.data.validation, PROBE_SEQUENCES, ladder.data.context // 2)
    checkpoints.mkdir(parents=True, exist_ok=True)
    checkpoint = checkpoints / f"{plan.key}-probe.safetensors"
    sidecar = checkpoints / f"{plan.key}-probe.json"  # probe rows so far: a resumed run keeps them
    rows = {}
    if checkpoint.exists() and sidecar.exists():
        rows = {row["step"]: row for row in json.loads(sidecar.read_text(encoding="utf-8"))}
    hook = probe_hook(
        sequences.to(ladder.device),
        settings.precision,
        every,
        rows,
        lambda: write_json_atomic(sidecar, sorted(rows.values(), key=lambda r: r["step"])),
    )
    until = min(until, settings.steps)
    label = f"{plan.shape.name} {plan.arm.name} lr={settings.learning_rate:g} seed={settings.seed} probed"

    def on_step(step: int) -> None:
        bar.update(1)
        if step + 1 >= until and until < settings.steps:
            raise Enough

    result = None
    with tqdm(total=until, desc=label, disable=not progress, dynamic_ncols=True, mininterval=30) as bar:
        try:
            result = train_loop(
                model,
                ladder.data.train,
                ladder.data.validation,
                settings,
                on_step=on_step,
                after_update=hook,
                checkpoint=checkpoint,
                checkpoint_seconds=ladder.settings.checkpoint_seconds,
            )
        except Enough:
            pass
    # stopped early, the run's training loss is what its last checkpoint carried (it is saved every few minutes)
    losses = result.train_losses if result is not None else (read_progress(checkpoint) or {}).get("train_losses")
    checkpoint.unlink(missing_ok=True)
    sidecar.unlink(missing_ok=True)
    return {
        "arm": plan.arm.name,
        "rung": plan.shape.name,
        "lr": settings.learning_rate,
        "seed": settings.seed,
        "every": every,
        "until": until,
        "steps": settings.steps,
        "final_loss": None if result is None else result.final_loss,
        # a run the ladder never trained (an arm probed for a mechanism) has no stored trace: keep the probe's own
        "train_loss": [[int(step), round(loss, 5)] for step, loss in losses] if losses else None,
        "probes": sorted(rows.values(), key=lambda r: r["step"]),
        "ladder_key": plan.key,  # the ladder run it retrains: its trace gives the training loss
        "commit": git_commit(),
        "machine": machine(plan.spec),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def own_trace(case: dict[str, Any]) -> list[tuple[int, float]] | None:
    """The training loss a probed run kept itself (every step of a run probed to its end; of one stopped early, as far
    as its last checkpoint), for a run the ladder lacks."""
    return None if case.get("train_loss") is None else [(int(step), loss) for step, loss in case["train_loss"]]


def onset(case: dict[str, Any]) -> int | None:
    """The first probed step whose copying gain is at least ONSET_NATS, or None."""
    return next((row["step"] for row in case["probes"] if row["gain"] >= ONSET_NATS), None)


def loss_at(trace: list[tuple[int, float]] | None, step: int, window: int = 50) -> float | None:
    """The mean training loss over the `window` steps up to `step`, from a ladder trace."""
    if not trace:
        return None
    values = [loss for s, loss in trace if step - window < s <= step]
    return sum(values) / len(values) if values else None


def plateau_exit(trace: list[tuple[int, float]] | None, nats: float = EXIT_NATS) -> int | None:
    """The first step whose mean training loss over the EXIT_WINDOW steps up to it is at or under `nats`: when a run
    leaves the plateau, read from its trace alone, so that every ladder run gets a time without being retrained."""
    if not trace:
        return None
    smooth = running_mean([loss for _, loss in trace], EXIT_WINDOW)
    return next((step for (step, _), loss in zip(trace, smooth, strict=True) if loss <= nats), None)


def ladder_exits(ladder_dir: Path) -> list[dict[str, Any]]:
    """Every seed at each arm's best rate at each rung of a ladder's report (its `summary.json`, with every arm it was
    written for): its plateau exit from the stored trace (None where it kept none or never left) and its final
    validation loss. Reads only the committed report and runs, so a GPU ladder's exits need no corpus."""
    path = ladder_dir / "summary.json"
    if not path.is_file():
        raise HiResUserError(f"No ladder report at {path}: write one first (`hires-hf ladder --report`).")
    summary = json.loads(path.read_text(encoding="utf-8"))
    store = RunStore(ladder_dir / "runs")
    rows = []
    for rung in summary["rungs"]:
        for arm, cell in rung["arms"].items():
            for seed, key, final in zip(cell["seed_ids"], cell["keys"], cell["seed_losses"], strict=True):
                trace = store.trace(key)
                rows.append(
                    {
                        "rung": rung["shape"],
                        "baseline": rung.get("baseline"),
                        "arm": arm,
                        "lr": cell["best_lr"],
                        "seed": seed,
                        "key": key,
                        "traced": trace is not None,
                        "exit": plateau_exit(trace),
                        "final": final,
                    }
                )
    return rows


def write_exits(ladder_dir: Path, out_dir: Path, cases: list[dict[str, Any]]) -> str:
    """The exits of a ladder's runs as a markdown section and, where any run left, `plateau_exits.png` under
    `out_dir`; '' for a ladder whose runs kept no traces."""
    exits = ladder_exits(ladder_dir)
    if not any(row["traced"] for row in exits):
        return ""
    figure = ""
    if any(row["exit"] is not None for row in exits):
        plot_exits(exits, out_dir / "plateau_exits.png")
        figure = "\n![final loss against plateau exit](plateau_exits.png)\n"
    flying = in_flight_exits(ladder_dir, exits)
    return (
        f"## When every run of `{ladder_dir.name}` left the plateau\n\n"
        "No retraining: the *exit* is read from each run's stored training loss, the first step whose mean over "
        f"the {EXIT_WINDOW} steps up to it is at or under {EXIT_NATS:g} nats (the plateau sits at 3.2-3.4). Every "
        "seed at each arm's best rate, at every rung of the ladder's report; runs trained before traces were kept "
        f"have none.\n\n{exit_table(exits, cases)}\n{split_table(exits)}{flying}{figure}"
    )


def in_flight_exits(ladder_dir: Path, rows: list[dict[str, Any]]) -> str:
    """The runs the ladder's report lists as in flight, each read from its checkpoint as it stands now: whether it
    has left the plateau and, if it has, the final loss its cell's exit line predicts for it (an early read of a
    seed, checkable when it ends); '' when none is in flight."""
    summary = json.loads((ladder_dir / "summary.json").read_text(encoding="utf-8"))
    store = RunStore(ladder_dir / "runs")
    cells = by_cell(rows)
    body = []
    for run in summary.get("in_flight", []):
        progress = read_progress(store.checkpoint(run["key"]))
        if not progress or not progress.get("train_losses"):
            continue  # ended since the report was written, or no step kept yet
        trace = [(int(step), loss) for step, loss in progress["train_losses"]]
        left = plateau_exit(trace)
        line = exit_line(cells.get((run["shape"], run["arm"], run["lr"]), []))
        prediction = ""
        if left is None:
            smooth = running_mean([loss for _, loss in trace], EXIT_WINDOW)[-1]
            exit_label = f"not yet ({smooth:.3f} at step {trace[-1][0]:,})"
        else:
            exit_label = f"{left:,}"
            if line is not None:
                centre, half_width = line.predict(left)
                prediction = f"{centre:.3f} ± {half_width:.3f} ({line.seeds} seeds)"
        step = f"{progress['step']:,} of {run['steps']:,}"
        body.append([run["shape"], run["arm"], f"{run['lr']:g}", str(run["seed"]), step, exit_label, prediction])
    if not body:
        return ""
    header = ["rung", "arm", "lr", "seed", "checkpoint at", "exit", "final predicted from the exit (95%)"]
    return (
        "\n**In flight**, read from each run's checkpoint; the prediction is the cell's exit line (least squares "
        "through its finished seeds) at the run's exit, with a 95% prediction interval:\n\n"
        + "\n".join(markdown_table(header, body))
        + "\n"
    )


def by_cell(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float], list[dict[str, Any]]]:
    """Rows grouped by cell (rung, arm, rate): the seeds whose exits are compared with one another."""
    cells: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["rung"], row["arm"], row["lr"]), []).append(row)
    return cells


def later_exit_worse(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """Over the pairs of seeds of one cell (same rung, arm and rate) that both left the plateau at different steps:
    how many pairs the later-leaving seed ended worse in, and how many pairs there are."""
    worse = pairs = 0
    for members in by_cell(rows).values():
        timed = [row for row in members if row["exit"] is not None]
        for i, a in enumerate(timed):
            for b in timed[i + 1 :]:
                if a["exit"] != b["exit"]:
                    later, earlier = (a, b) if a["exit"] > b["exit"] else (b, a)
                    pairs += 1
                    worse += later["final"] > earlier["final"]
    return worse, pairs


class ExitLine(NamedTuple):
    """Final loss against plateau exit over one cell's timed seeds, by least squares."""

    mean_exit: float
    mean_final: float
    slope: float  # nats per step
    residual_sd: float
    spread: float  # the sum of squared exit deviations
    seeds: int

    @property
    def df(self) -> int:
        return self.seeds - 2

    def predict(self, exit_step: int) -> tuple[float, float]:
        """A new seed's final loss from its exit, and the half-width of its 95% prediction interval: the line's own
        uncertainty and one seed's scatter about it."""
        offset = exit_step - self.mean_exit
        scale = math.sqrt(1 + 1 / self.seeds + offset**2 / self.spread)
        return self.mean_final + self.slope * offset, t_quantile(0.975, self.df) * self.residual_sd * scale


def exit_line(members: list[dict[str, Any]]) -> ExitLine | None:
    """The least-squares line of final loss on exit step through a cell's timed seeds; None under four (two degrees
    of freedom left) or where they all left at one step."""
    timed = [(row["exit"], row["final"]) for row in members if row["exit"] is not None]
    if len(timed) < 4:
        return None
    exits, finals = (np.array(values, dtype=float) for values in zip(*timed, strict=True))
    spread = float(((exits - exits.mean()) ** 2).sum())
    if spread == 0:
        return None
    slope = float(((exits - exits.mean()) * (finals - finals.mean())).sum()) / spread
    residuals = finals - finals.mean() - slope * (exits - exits.mean())
    residual_sd = math.sqrt(float((residuals**2).sum()) / (len(timed) - 2))
    return ExitLine(float(exits.mean()), float(finals.mean()), slope, residual_sd, spread, len(timed))


def delay_cost(members: list[dict[str, Any]]) -> tuple[float, float, int] | None:
    """What leaving the plateau DELAY_STEPS later costs one cell's seeds in final loss: the slope of the exit line,
    its 95% half-width (Student's t on the residuals) and its degrees of freedom; None under four timed seeds. If
    HiRes's deficit is a delay at a fixed step, this cost falls as runs grow longer."""
    line = exit_line(members)
    if line is None:
        return None
    half_width = t_quantile(0.975, line.df) * line.residual_sd / math.sqrt(line.spread)
    return line.slope * DELAY_STEPS, half_width * DELAY_STEPS, line.df


def chance_of_as_many(rows: list[dict[str, Any]], draws: int = PERMUTATIONS, seed: int = PROBE_SEED) -> float:
    """How often the later leaver ends worse in at least as many pairs as observed when each cell's final losses are
    shuffled among its seeds (exit order and end independent): a one-sided permutation p-value, which respects that
    a cell's pairs share seeds and so are not independent coin flips."""
    observed, _ = later_exit_worse(rows)
    cells = by_cell(rows)
    generator = random.Random(seed)
    hits = 0
    for _ in range(draws):
        shuffled = []
        for members in cells.values():
            finals = [row["final"] for row in members]
            generator.shuffle(finals)
            shuffled += [{**row, "final": final} for row, final in zip(members, finals, strict=True)]
        hits += later_exit_worse(shuffled)[0] >= observed
    return (hits + 1) / (draws + 1)


def exit_table(rows: list[dict[str, Any]], cases: list[dict[str, Any]]) -> str:
    """Per rung and arm: each seed's plateau exit and final loss, in the order they left; then whether the later
    seed of a pair ends worse, per family of arms, and how the exits line up with the probed copying onsets."""
    body = []
    for (rung, arm, lr), members in by_cell(rows).items():
        ordered = sorted(members, key=lambda r: (r["exit"] is None, r["exit"] or 0, r["seed"]))
        seeds = "; ".join(f"s{r['seed']} {_exit_label(r)} → {r['final']:.3f}" for r in ordered)
        worse, pairs = later_exit_worse(members)
        cost = delay_cost(members)
        cost_label = f"{cost[0]:+.3f} ± {cost[1]:.3f} ({cost[2]} df)" if cost else ""
        body.append([rung, arm, f"{lr:g}", seeds, f"{worse} of {pairs}" if pairs else "", cost_label])
    header = ["rung", "arm", "lr", "seed: exit step → final loss", "later exit ends worse"]
    lines = markdown_table([*header, f"{DELAY_STEPS} steps later costs (nats)"], body)
    families = {
        "vanillas": VANILLAS,
        "the shipped HiRes": ("hires",),
        "all HiRes arms": ("hires", "D=4d", "k=6"),
    }
    for family, arms in families.items():
        members = [r for r in rows if r["arm"] in arms]
        worse, pairs = later_exit_worse(members)
        if pairs:
            chance = chance_of_as_many(members)
            lines.append(
                f"\n{family}: the seed that left the plateau later ended worse in {worse} of {pairs} pairs (as many or "
                f"more in {chance:.3f} of {PERMUTATIONS:,} shuffles of each cell's final losses)."
            )
    onsets = {c["ladder_key"]: onset(c) for c in cases}
    leads = [(row["exit"] - onsets[row["key"]]) for row in rows if onsets.get(row["key"]) and row["exit"]]
    if leads:
        lines.append(
            f"\nWhere a run was also probed ({len(leads)} runs), its exit came {statistics.median(leads):+.0f} steps "
            f"after its copying gain passed {ONSET_NATS:g} nat (median; {min(leads):+d} to {max(leads):+d})."
        )
    return "\n".join(lines)


def on_time_split(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rung's other arms' timed seeds split at the rung's latest vanilla exit: on time (at or before it) or
    late, with each group's mean final loss against the rung's baseline (the mean over its seeds). Reads a late exit
    as a threshold rather than a slope; a rung with no timed vanilla seed or no baseline seeds, and an arm with no
    timed seed, are left out."""
    split = []
    for rung in dict.fromkeys(row["rung"] for row in rows):
        members = [row for row in rows if row["rung"] == rung]
        vanilla_exits = [row["exit"] for row in members if row["arm"] in VANILLAS and row["exit"] is not None]
        baseline = [row["final"] for row in members if row["arm"] == row["baseline"]]
        if not vanilla_exits or not baseline:
            continue
        limit, baseline_mean = max(vanilla_exits), statistics.fmean(baseline)
        for arm in dict.fromkeys(row["arm"] for row in members if row["arm"] not in VANILLAS):
            timed = [row for row in members if row["arm"] == arm and row["exit"] is not None]
            if not timed:
                continue
            groups = {
                "on_time": [row["final"] for row in timed if row["exit"] <= limit],
                "late": [row["final"] for row in timed if row["exit"] > limit],
            }
            entry: dict[str, Any] = {"rung": rung, "arm": arm, "limit": limit, "baseline": baseline_mean}
            for name, finals in groups.items():
                entry[name] = (len(finals), statistics.fmean(finals)) if finals else (0, None)
            split.append(entry)
    return split


def split_table(rows: list[dict[str, Any]]) -> str:
    """`on_time_split` as a markdown paragraph and table; '' where no rung can be split."""
    split = on_time_split(rows)
    if not split:
        return ""

    def group(entry: dict[str, Any], name: str) -> str:
        count, mean = entry[name]
        return f"{count}: {mean:.3f} ({mean - entry['baseline']:+.3f})" if count else "0"

    body = [[e["rung"], f"{e['limit']:,}", e["arm"], group(e, "on_time"), group(e, "late")] for e in split]
    header = [
        "rung",
        "latest vanilla exit",
        "arm",
        "on time: seeds: mean (vs baseline)",
        "late: seeds: mean (vs baseline)",
    ]
    return (
        "\n**On time or late**: a seed is on time when it left the plateau no later than every vanilla seed at its "
        "rung did; each group's mean final loss, and its gap to the mean of the rung's baseline seeds:\n\n"
        + "\n".join(markdown_table(header, body))
        + "\n"
    )


def _exit_label(row: dict[str, Any]) -> str:
    if not row["traced"]:
        return "no trace"
    return "not left" if row["exit"] is None else f"{row['exit']:,}"


def plot_exits(rows: list[dict[str, Any]], path: Path) -> Path:
    """Final loss against plateau exit, one panel a rung, a colour per arm: whether the seeds that leave late are
    the ones that end badly, and whether HiRes's seeds leave later and more apart than the vanillas'."""
    plt = pyplot()
    rungs = list(dict.fromkeys(r["rung"] for r in rows if r["exit"] is not None))  # a rung with none timed: no panel
    fig, axes = plt.subplots(1, len(rungs), figsize=(6.4 * len(rungs), 4.6), squeeze=False)
    for axis, rung in zip(axes[0], rungs, strict=True):
        for arm in dict.fromkeys(r["arm"] for r in rows):
            points = [(r["exit"], r["final"]) for r in rows if r["rung"] == rung and r["arm"] == arm and r["exit"]]
            if points:
                axis.plot(*zip(*points, strict=True), "o", color=ARM_COLOURS.get(arm), label=arm, alpha=0.8)
        axis.set(
            xlabel=f"plateau exit: first step with {EXIT_WINDOW}-step mean training loss ≤ {EXIT_NATS:g}",
            ylabel="final validation loss (nats)",
        )
        axis.set_title(f"{rung}: every seed at each arm's best rate", fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def is_complete(case: dict[str, Any], key: str, until: int) -> bool:
    """A stored case stands for ladder run `key` probed to step `until` if it probed that run at least that far
    and measured the heads too (a case stored before the head scores existed, or stopped earlier than asked, is
    probed again from the start: the run is deterministic, so its earlier probes come back the same)."""
    reached = min(until, case["steps"]) <= case["until"]
    return case["ladder_key"] == key and reached and all("induction" in row for row in case["probes"])


def block_size(case: dict[str, Any]) -> int | None:
    """Layers per block of a case's HiRes arm at its rung (an arm may set it, as `k=6` does); None for a vanilla,
    which has no blocks."""
    arm = ladder_arms([case["arm"]])[0]
    if arm.kind != HIRES:
        return None
    return arm.fields.get("layers_per_block", Shape.parse(case["rung"]).layers_per_block)


def circuit(case: dict[str, Any]) -> str:
    """The copying circuit when it formed (the onset's probe, else the last): the layer of the strongest induction
    head, the layer before it with the strongest previous-token head (the half it composes with), their scores,
    and for HiRes whether the two share a block or the circuit crosses a block boundary (through the write, the
    outer norm and the read). '' for a case without head scores."""
    start = onset(case)
    row = next((r for r in case["probes"] if r["step"] == start), case["probes"][-1] if case["probes"] else {})
    if "induction" not in row:
        return ""
    induction, previous = row["induction"], row["previous"]
    head = max(range(len(induction)), key=induction.__getitem__)
    text = f"indu. L{head} {induction[head]:.2f} @{row['step']:,}"
    if head == 0:
        return text
    tail = max(range(head), key=previous.__getitem__)
    formed = next((r["step"] for r in case["probes"] if r["previous"][tail] >= HEAD_SCORE), None)
    text += f" ← prev. L{tail} {previous[tail]:.2f}"
    text += "" if formed is None else f" (≥ {HEAD_SCORE:g} from {formed:,})"
    k = block_size(case)
    if k is None:
        return text
    return text + (", one block" if head // k == tail // k else ", across blocks")


def stored_cases(out_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted((out_dir / "cases").glob("*.json"))]


def table(cases: list[dict[str, Any]], traces: dict[str, list[tuple[int, float]] | None], marks: list[int]) -> str:
    """One row per case: when its copying gain passes ONSET_NATS, the gain there and at the last probe, the
    training loss at `marks`, and the ladder run's final loss."""
    header = ["run", f"gain ≥ {ONSET_NATS:g} nat at step", "last gain", "circuit at the onset"]
    header += [*(f"loss @{m}" for m in marks), "final"]
    body = []
    for case in cases:
        trace, start = traces.get(case["ladder_key"]), onset(case)
        last = case["probes"][-1] if case["probes"] else None
        losses = [loss_at(trace, m) for m in marks]
        final = case.get("ladder_final")  # the ladder run's, else the probe's own (write_report decides)
        body.append(
            [
                f"{case['arm']} {case['rung']} lr {case['lr']:g} seed {case['seed']}",
                f"not by {case['until']:,}" if start is None else f"{start:,}",
                "" if last is None else f"{last['gain']:.2f} @{last['step']:,}",
                circuit(case),
                *("" if x is None else f"{x:.3f}" for x in losses),
                "" if final is None else f"{final:.3f}",
            ]
        )
    return "\n".join(markdown_table(header, body, align="llrl" + "r" * len(marks) + "r"))


def plot(cases: list[dict[str, Any]], traces: dict[str, list[tuple[int, float]] | None], path: Path) -> Path:
    """Per rung: the training loss (running mean, from the ladder's trace) above the copying gain, on one step
    axis: a colour per arm, a line style per seed, each run's final loss in its label."""
    plt = pyplot()
    rungs = sorted({c["rung"] for c in cases})
    fig, axes = plt.subplots(2, len(rungs), figsize=(7 * len(rungs), 8), squeeze=False, sharex="col")
    for column, rung in enumerate(rungs):
        top, bottom = axes[0][column], axes[1][column]
        seen: dict[str, int] = {}
        ceiling = 0.0
        for case in (c for c in cases if c["rung"] == rung):
            nth = seen[case["arm"]] = seen.get(case["arm"], -1) + 1
            final = "" if case.get("ladder_final") is None else f", final {case['ladder_final']:.3f}"
            style = {"color": ARM_COLOURS.get(case["arm"]), "ls": LINE_STYLES[nth % len(LINE_STYLES)]}
            label = f"{case['arm']} lr {case['lr']:g} seed {case['seed']}{final}"
            trace = traces.get(case["ladder_key"])
            if trace:
                steps = [s for s, _ in trace if s <= case["until"]]
                losses = running_mean([x for s, x in trace if s <= case["until"]], 25)
                top.plot(steps, losses, label=label, **style)
                later = [x for step, x in zip(steps, losses, strict=True) if step >= ZOOM_FROM]
                ceiling = max([ceiling, *later])  # a trace that ends before ZOOM_FROM adds nothing
            probes = case["probes"]
            bottom.plot([r["step"] for r in probes], [r["gain"] for r in probes], label=label, **style)
        if ceiling:
            top.set_ylim(top=ceiling + 0.05)  # the first steps' fall from ~8 nats would flatten the plateau
        top.set_title(f"{rung}: training loss (running mean of 25 steps)", fontsize=10)
        top.set_ylabel("training loss")
        named = {line.get_label(): line for axis in (top, bottom) for line in axis.lines}  # traced runs first
        top.legend(list(named.values()), list(named), fontsize=8)  # a run without a trace is named by its gain line
        bottom.axhline(ONSET_NATS, color="grey", lw=0.8, ls=":")
        bottom.set_title("copying gain: loss on a random sequence's first copy minus its second", fontsize=10)
        bottom.set_xlabel("step")
        bottom.set_ylabel("nats")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_heads(cases: list[dict[str, Any]], path: Path) -> Path | None:
    """One row per case with head scores: each layer's strongest previous-token score (left) and induction score
    (right) along the steps, HiRes's block boundaries drawn across, so that one sees in which layers, and when,
    each half of the circuit forms. None if no case has head scores."""
    cases = [c for c in cases if c["probes"] and all("induction" in row for row in c["probes"])]
    if not cases:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(len(cases), 2, figsize=(11, 2.4 * len(cases) + 0.6), squeeze=False, layout="constrained")
    for row, case in zip(axes, cases, strict=True):
        probes = case["probes"]
        layers = len(probes[0]["induction"])
        extent = (probes[0]["step"], probes[-1]["step"], layers - 0.5, -0.5)
        start = onset(case)
        name = f"{case['arm']} {case['rung']} seed {case['seed']}"
        copies = "-" if start is None else f"{start:,}"
        k = block_size(case)
        for ax, score, label in zip(row, ("previous", "induction"), ("previous-token", "induction"), strict=True):
            grid = [[probe[score][layer] for probe in probes] for layer in range(layers)]
            image = ax.imshow(grid, aspect="auto", vmin=0, vmax=1, cmap="viridis", extent=extent)
            if k is not None:
                for boundary in range(k, layers, k):
                    ax.axhline(boundary - 0.5, color="white", lw=0.8, ls="--")
            ax.set_title(f"{name}: {label} score (copies from step {copies})", fontsize=9)
            ax.set_ylabel("layer")
    axes[-1][0].set_xlabel("step")
    axes[-1][1].set_xlabel("step")
    fig.colorbar(image, ax=axes, shrink=0.6, label="strongest head's attention on its target token")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(ladder: Ladder, out_dir: Path, marks: list[int]) -> str:
    cases = stored_cases(out_dir)
    if not cases:
        raise HiResUserError(f"No probed runs under {out_dir / 'cases'}: train one first (see --help).")
    traces = {c["ladder_key"]: ladder.store.trace(c["ladder_key"]) or own_trace(c) for c in cases}
    for case in cases:
        run = ladder.store.get(case["ladder_key"])
        case["ladder_final"] = case.get("final_loss") if run is None else run.final_loss
    text = table(cases, traces, marks)
    commands = "\n".join(dict.fromkeys(c["command"] for c in cases if "command" in c))
    summary = [{k: v for k, v in case.items() if k != "train_loss"} for case in cases]  # the traces stay in cases/
    write_json_atomic(out_dir / "induction_probe.json", {"onset_nats": ONSET_NATS, "cases": summary})
    plot(cases, traces, out_dir / "induction_probe.png")
    heads = plot_heads(cases, out_dir / "induction_heads.png")
    intro = (
        "# Is the plateau the induction-head transition?\n\n"
        "Ladder runs retrained step for step (`benchmarks/induction_probe.py`), their in-context copying probed: "
        f"{PROBE_SEQUENCES} sequences of shuffled validation tokens, each followed by itself; the *gain* is the "
        "loss on the first copy minus the loss on the second. Training losses are the ladder's trace of the same "
        "run (for an arm the ladder never trained, such as `k=6`, `k=2` and `no-outer-norm`, the probe's own: every "
        "step of a run probed to its end, of one stopped early as far as its last checkpoint), a mean over the 50 "
        "steps up to each mark; *final* is the run's final validation loss. "
        "*Circuit*, at the probe where the gain passes 1 nat (else the last): the layer (from 0; the shipped "
        "HiRes's and `no-outer-norm`'s blocks are 4 layers, `k=6`'s 6 and `k=2`'s 2) whose strongest head pays the "
        "most attention to the token after the current token's earlier occurrence (*indu.*, an induction head), and "
        "the layer before it whose strongest head pays the most to the token just before (*prev.*, the "
        "previous-token head it can compose with), with those attentions, and the "
        f"first probe at which that previous-token score reached {HEAD_SCORE:g}.\n\n"
    )
    figures = "![induction probe](induction_probe.png)\n"
    if heads is not None:
        figures += "\n![induction score by layer and step](induction_heads.png)\n"
    ladder_dir = ladder.store.folder.parent
    exits = write_exits(ladder_dir, out_dir, cases) if (ladder_dir / "summary.json").is_file() else ""
    figures += f"\n{exits}" if exits else ""
    write_text_atomic(out_dir / "induction_probe.md", f"{intro}```\n{commands}\n```\n\n{text}\n\n{figures}")
    return text


def exits_only(ladder_dir: Path) -> int:
    """`--exits`: a ladder's plateau exits as `plateau_exits.md` and `.png` beside its report."""
    try:
        text = write_exits(ladder_dir, ladder_dir, [])
    except HiResUserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if not text:
        print(f"error: no run of {ladder_dir} kept a training trace, so no exit can be read.", file=sys.stderr)
        return 1
    command = f"python benchmarks/induction_probe.py --exits {ladder_dir}"
    write_text_atomic(ladder_dir / "plateau_exits.md", f"# Plateau exits\n\n```\n{command}\n```\n\n{text}")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arm", default="hires")
    parser.add_argument("--rung", default="64x12", help="a rung of the ladder (its shape's name)")
    parser.add_argument("--lr", type=float, default=8e-3)
    parser.add_argument("--seeds", nargs="*", type=int, default=[], help="ladder seeds to retrain and probe")
    parser.add_argument("--every", type=int, default=50, help="probe every this many steps")
    parser.add_argument("--until", type=int, default=1600, help="stop the run after this step")
    parser.add_argument("--marks", type=int, nargs="*", default=[600, 800, 1000, 1200, 1400], help="table's steps")
    parser.add_argument("--report", action="store_true", help="write the table and plot (also after training)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--ladder-dir", type=Path, default=LADDER, help="the ladder whose runs are retrained")
    parser.add_argument("--smoke", action="store_true", help="the ladder's seconds-long smoke settings")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--exits",
        type=Path,
        metavar="LADDER_DIR",
        help="only the plateau exits of that ladder's report and runs "
        "(no corpus, no probing; a GPU ladder's too), written beside its report as plateau_exits.{md,png}",
    )
    args = parser.parse_args(argv)
    if args.exits:
        return exits_only(args.exits)
    if not args.seeds and not args.report:
        parser.error("nothing to do: give --seeds to train, or --report")
    if args.every < 1 or args.until < 1:
        parser.error("--every and --until must be at least 1")
    set_threads(args.threads)
    settings = LadderSettings.smoke() if args.smoke else LadderSettings()
    ladder = open_ladder(settings, args.ladder_dir, cache_dir(), progress=not args.quiet)
    command = shlex.join(["python", "benchmarks/induction_probe.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        for seed in args.seeds:
            plan = cell_plan(ladder, args.arm, args.rung, args.lr, seed)
            path = args.out_dir / "cases" / f"{case_name(args.arm, args.rung, plan.settings.learning_rate, seed)}.json"
            if path.exists() and is_complete(json.loads(path.read_text(encoding="utf-8")), plan.key, args.until):
                continue
            case = train_probed(ladder, plan, args.every, args.until, args.out_dir / "checkpoints", not args.quiet)
            write_json_atomic(path, {**case, "command": command})
            print(f"seed {seed}: copying gain passes {ONSET_NATS:g} nat at step {onset(case)}", flush=True)
        print(write_report(ladder, args.out_dir, args.marks))
    except HiResUserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
