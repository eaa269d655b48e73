"""The compute ladder: does HiRes buy compute against the strongest simple vanilla, and does that change with scale?

Rungs of counted training FLOPs per run, each with its shape from the package's one shape rule (three blocks of
k = 4 layers, width growing with the rung so that tokens stay ~20-30x the non-embedding parameters), on the
Python sources of this interpreter (large enough that no run repeats data). Every arm trains for its rung's
FLOPs on the same batches, with the one recipe, bf16 and compiled (`hires_hf.experiments.harness`). Stages:

- `floor`: the noise floor. The control at the middle rung's shape, its rate bracketed at one length, three
  seeds at each of several run lengths: how the seed spread (max - min) falls with tokens, and the shortest
  length whose spread is at most `FLOOR_NATS`. Every other run must be at least that long.
- `precision`: bf16 against fp32 (the control and HiRes, two seeds each, at the floor's shape and rate): does
  the fast path learn the same?
- `grid`: every arm's rate bracketed (x2 grid, extended) at each rung but the top; at a rung the arms take turns,
  each starting from the rate it carries over; then `rung_seeds` seeds of every arm at its best rate there.
- `top`: at the top rung, each arm at the rate carried over from the rung below and x sqrt(2) either side
  (extended by sqrt(2) if the best is at an edge), then `top_seeds` seeds of both vanillas (the baseline is the
  better of them, and they can be closer than one seed tells) and of the best HiRes.
`--report` writes the table, fits of loss vs compute per arm, the FLOPs multiplier of the best HiRes over the
baseline (the better of the control and the plain twin at the top rung) with a bootstrap CI, the gap at each rung,
`summary.json` and plots.

Stages are plans over a run store (`RunStore`): a worker trains the first planned run nobody holds, so any
number of workers (`--workers N`) share the work, a killed worker's run resumes from its checkpoint, and a
run is reused only when everything that made it is unchanged.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..errors import HiResUserError
from ..io import write_json_atomic, write_text_atomic
from ..training.checkpoint import read_progress
from ..training.data import python_sources_environment
from ..training.loop import CHECKPOINT_SECONDS, resolve_precision
from .harness import (
    CONTROL,
    HIRES,
    MAX_EXTENSIONS,
    PLAIN,
    Arm,
    Budget,
    Data,
    Run,
    RunPlan,
    RunStore,
    Shape,
    best_rate,
    bracket_status,
    execute,
    pending_rates,
    plan_run,
    prepare_data,
    tidy_rate,
)
from .runs import machine
from .stalls import Stalled, StallWatch, stalled_run

FLOOR_NATS = 0.02  # the seed spread (max - min) a verdict's runs must stay under
SQRT2 = math.sqrt(2.0)
# Seeds a cell can have (`--seeds`, `--cell-seed`): the report looks this far for them. The CPU ladder's HiRes noise
# asks more than eight a side to tell the article's gap from none (the report's "Seeds the verdict needs").
MOST_SEEDS = 16


@dataclass(frozen=True)
class Rung:
    """One level of compute: a shape and the counted training FLOPs every run at it gets."""

    shape: Shape
    flops: float

    @property
    def name(self) -> str:
        return self.shape.name


ARMS = {
    "control": Arm("control", CONTROL),
    "plain-twin": Arm("plain-twin", PLAIN),
    "hires": Arm("hires", HIRES),
    "D=4d": Arm("D=4d", fields={"residual_ratio": 4.0}),
    "D=d": Arm("D=d", fields={"residual_ratio": 1.0}),
    "k=2": Arm("k=2", fields={"layers_per_block": 2}),
    "k=6": Arm("k=6", fields={"layers_per_block": 6}),  # fewer block boundaries for a circuit to straddle
    "delta-write": Arm("delta-write", fields={"write_mode": "delta"}),
    # a block boundary without its PostNorm (write norm and multipliers as shipped): which part of it delays a circuit
    "no-outer-norm": Arm("no-outer-norm", fields={"outer_norm_only": True}),
    "qk-norm": Arm("qk-norm", fields={"qk_norm": "per_head"}),  # against the attention-entropy collapse
}
ARM_NAMES = tuple(ARMS)


def ladder_arms(names: Sequence[str]) -> list[Arm]:
    """The ladder's arms by name: the two vanillas, the shipped HiRes and HiRes variants."""
    unknown = [name for name in names if name not in ARMS]
    if unknown:
        raise HiResUserError(f"Unknown ladder arm(s) {unknown}; choose from {', '.join(ARMS)}.")
    return [ARMS[name] for name in names]


def check_arms(names: Sequence[str]) -> list[str]:
    """A ladder's arm list, refused unless it can give a verdict: a vanilla for the baseline, a HiRes to set against
    it, no arm twice."""
    arms = ladder_arms(names)
    if len(set(names)) < len(names):
        raise HiResUserError(f"--arms {' '.join(names)}: an arm is named twice; name each once.")
    if not any(arm.kind != HIRES for arm in arms) or not any(arm.kind == HIRES for arm in arms):
        raise HiResUserError(
            f"--arms {' '.join(names)}: give at least one vanilla (control, plain-twin) and one HiRes arm: the "
            "verdict sets the best HiRes against the better vanilla."
        )
    return list(names)


@dataclass(frozen=True)
class LadderSettings:
    """The ladder's design; `smoke()` is the seconds-long version the tests run."""

    rungs: tuple[tuple[str, float], ...] = (("64x12", 1.25e14), ("96x12", 3.5e14), ("128x12", 1e15))
    arms: tuple[str, ...] = ("control", "plain-twin", "hires", "D=4d")
    batch_size: int = 32
    context: int = 256
    vocab_size: int = 4096
    corpus: str = "python"
    max_chars: int = 250_000_000
    validation_fraction: float = 0.005
    eval_blocks: int = 256
    evaluations: int = 8
    rates: tuple[float, ...] = (4e-3, 8e-3, 1.6e-2)  # the first rung's grid: centred on the floor's best rate
    # An arm's first-rung grid centred on its best rate in an earlier ladder instead (x2 either side, extended as
    # ever): these are the bests of the first corpus's bracketed 64x12 runs (benchmarks/results/archive/
    # ladder_first_corpus), a prior that saves the runs a far-off centre costs; the bracket is checked anew.
    first_rung_centres: tuple[tuple[str, float], ...] = (
        ("control", 3.2e-2),
        ("plain-twin", 8e-3),
        ("hires", 3.2e-2),
        ("D=4d", 8e-3),
    )
    top_seeds: int = 2
    # seeds at each arm's best rate at the rungs below the top, once its bracket is done: single HiRes runs moved
    # 0.14-0.18 nats between two corpora where the vanillas moved 0.01, so a rung's gap is read from seed means
    rung_seeds: int = 2
    floor_rung: int = 1  # index into rungs: the noise floor's shape
    floor_tokens: tuple[float, ...] = (1e6, 2e6, 4e6, 8e6, 16e6)
    floor_grid_tokens: float = 4e6  # the length the floor's rate is bracketed at
    floor_seeds: int = 3
    precision_tokens: float = 2e6  # bf16 against fp32 at the floor's shape: this long, these seeds
    precision_seeds: int = 2
    # an arm's rate in the precision check where the floor's (the control's) is one it does not train at: HiRes at
    # 1.6e-2 collapses its attention onto one token at this length and sits at the bigram loss, whatever the precision
    # (`benchmarks/results/ladder_stall`); at 4e-3 it learns
    precision_rates: tuple[tuple[str, float], ...] = (("hires", 4e-3),)
    # bf16 wherever it trains: its stored runs are keyed by it, so a report on any machine finds them (a CPU
    # without bf16 matrix units computes it with fp32 kernels: `hires_hf.training.bf16_emulation`)
    precision: str = "bf16"
    compile: str = "auto"
    device: str = "cpu"
    # wall clock between a run's checkpoints: where runs last minutes (a GPU's), a shorter one keeps a stored run's
    # step-by-step training loss (saved with each checkpoint) nearly whole; not part of any run's key
    checkpoint_seconds: float = CHECKPOINT_SECONDS

    @classmethod
    def smoke(cls, **overrides: Any) -> LadderSettings:
        fields: dict[str, Any] = dict(
            rungs=(("32x4", 2e9), ("48x4", 4e9), ("64x4", 8e9)),
            arms=("control", "plain-twin", "hires"),
            batch_size=4,
            context=32,
            vocab_size=300,
            corpus="stdlib",
            max_chars=300_000,
            validation_fraction=0.05,
            eval_blocks=8,
            evaluations=2,
            floor_tokens=(4e3, 8e3),
            floor_grid_tokens=4e3,
            floor_seeds=2,
            precision_tokens=4e3,
            precision="auto",
            compile="off",
            first_rung_centres=(),
        )
        return cls(**{**fields, **overrides})

    def ladder_rungs(self) -> list[Rung]:
        return [Rung(Shape.parse(name, vocab_size=self.vocab_size), flops) for name, flops in self.rungs]


@dataclass
class Ladder:
    """The ladder's settings with its data and store: what the stages plan over."""

    settings: LadderSettings
    data: Data
    store: RunStore
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _plans: dict[tuple, RunPlan] = field(default_factory=dict, repr=False)

    @property
    def rungs(self) -> list[Rung]:
        return self.settings.ladder_rungs()

    @property
    def arms(self) -> list[Arm]:
        return ladder_arms(self.settings.arms)

    @property
    def precision(self) -> str:
        """What its runs train in ("bf16" or "fp32"); the precision check's runs in the other one are the exception."""
        return resolve_precision(self.device, self.settings.precision)

    def plan(
        self,
        arm: Arm,
        rung: Rung,
        lr: float,
        seed: int = 0,
        flops: float | None = None,
        precision: str | None = None,
    ) -> RunPlan:
        """The run of `arm` at `rung` (or at `flops` instead of the rung's), planned once and remembered."""
        s = self.settings
        budget = Budget(flops=flops or rung.flops, batch_size=s.batch_size)
        precision = precision or s.precision
        index = (arm.name, arm.kind, repr(sorted(arm.fields.items())), rung.shape, lr, seed, budget, precision)
        if index not in self._plans:
            self._plans[index] = plan_run(
                arm, lr, rung.shape, self.data, budget, seed, self.device, s.evaluations, precision, s.compile
            )
        return self._plans[index]

    def stored(
        self, arm: Arm, rung: Rung, rates: Sequence[float], seed: int = 0, flops: float | None = None
    ) -> dict[float, Run]:
        """{rate: stored run} of `arm` at `rung` among `rates` (the ones not trained yet are left out)."""
        runs = {lr: self.store.get(self.plan(arm, rung, lr, seed, flops).key) for lr in rates}
        return {lr: run for lr, run in runs.items() if run is not None}

    def bracket(
        self, arm: Arm, rung: Rung, grid: Sequence[float], step: float, flops: float | None = None
    ) -> tuple[list[RunPlan], dict[float, float]]:
        """The runs still needed to bracket `arm`'s rate at `rung` (seed 0), and the losses known so far."""
        tried = _rates_around(grid, step)
        losses = {lr: run.final_loss for lr, run in self.stored(arm, rung, tried, 0, flops).items()}
        todo = pending_rates(grid, losses, step)
        return [self.plan(arm, rung, lr, 0, flops) for lr in todo], losses

    def grid(self, arm: Arm, index: int) -> tuple[tuple[float, ...], float] | None:
        """`arm`'s starting grid and step at rung `index`: at the first rung the settings' rates (or centred on the
        arm's `first_rung_centres`), then centred on the arm's best rate at the rung below (x2 either side, x sqrt(2)
        at the top); None while that is open."""
        if index == 0:
            centre = dict(self.settings.first_rung_centres).get(arm.name)
            if centre is None:
                return tuple(self.settings.rates), 2.0
            return (tidy_rate(centre / 2), centre, tidy_rate(centre * 2)), 2.0
        below = self.settled(arm, index - 1)
        if below is None:
            return None
        centre = best_rate(below)
        if index == len(self.rungs) - 1:
            return top_grid(centre), SQRT2
        return (tidy_rate(centre / 2), centre, tidy_rate(centre * 2)), 2.0

    def settled(self, arm: Arm, index: int) -> dict[float, float] | None:
        """{rate: loss} of `arm`'s finished bracketing at rung `index` (seed 0), or None while runs are missing."""
        grid = self.grid(arm, index)
        if grid is None:
            return None
        todo, losses = self.bracket(arm, self.rungs[index], *grid)
        return None if todo or not losses else losses

    def seed_runs(self, arm: Arm, index: int, lr: float) -> list[Run]:
        """Every stored seed of `arm` at rate `lr` at rung `index`, seed 0 first: the runs a cell's mean is over."""
        runs = (self.stored(arm, self.rungs[index], [lr], seed=seed).get(lr) for seed in range(MOST_SEEDS))
        return [run for run in runs if run is not None]


def check_enough_data(ladder: Ladder) -> None:
    """Refuse a corpus too small for the ladder's longest run: a run that wraps around its data would compare the
    arms on repeated text, which the rungs were not sized for (a machine with few Python sources, say)."""
    s, data = ladder.settings, ladder.data
    tokens = {"the noise floor's longest seeds": max(*s.floor_tokens, s.floor_grid_tokens)}
    tokens["the precision check"] = s.precision_tokens
    for rung in ladder.rungs:
        for arm in ladder.arms:
            steps = Budget(rung.flops, s.batch_size).steps(arm.flops_per_token(rung.shape, data), data.context)
            tokens[f"{arm.name} at {rung.name}"] = steps * s.batch_size * data.context
    longest = max(tokens, key=tokens.__getitem__)
    available = len(data.train) * data.context
    if tokens[longest] > available:
        raise HiResUserError(
            f"The ladder's corpus ({data.source!r}) has {available / 1e6:.2f}M training tokens, but its longest run "
            f"({longest}) needs {tokens[longest] / 1e6:.2f}M: its runs would repeat data. Run it where the corpus "
            "is larger (more Python packages installed) or with shorter runs."
        )


CORPUS_RECORD = "corpus.json"  # beside runs/: the data the stored runs trained on, and what decided it
CORPUS_REQUIREMENTS = "corpus-requirements.txt"
_SIZES = ("train_blocks", "validation_blocks", "tokens_sha256")


def check_corpus_environment(settings: LadderSettings, folder: Path) -> None:
    """Refuse, before any data is prepared, an interpreter whose Python sources differ from those the ladder's
    stored runs trained on: the "python" corpus is read from site-packages, so another package version is other
    data, and every stored run would silently become a stale cell that the ladder trains again from scratch."""
    record = _read_corpus_record(folder)
    if record is None or settings.corpus != "python" or record["data"].get("source") != "python":
        return
    here, there = python_sources_environment(), record["environment"]
    changes = [f"Python {here['python']} here, {there['python']} there"] if here["python"] != there["python"] else []
    for name in sorted(set(here["packages"]) | set(there["packages"])):
        mine, theirs = here["packages"].get(name), there["packages"].get(name)
        if mine != theirs:
            changes.append(f"{name} {mine or 'absent'} here, {theirs or 'absent'} there")
    if changes:
        shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more" if len(changes) > 6 else "")
        extra = sorted(set(here["packages"]) - set(there["packages"]))
        remove = f" and remove what they lacked (`pip uninstall -y {' '.join(extra)}`)" if extra else ""
        raise HiResUserError(
            f"This interpreter's Python sources (the ladder's corpus) differ from those its runs in {folder} "
            f"trained on ({shown}): install theirs (`pip install --no-deps -r {folder / CORPUS_REQUIREMENTS}`, "
            f"Python {there['python']}){remove}, or give --out a new folder."
        )


def record_corpus(ladder: Ladder, folder: Path) -> None:
    """Write the ladder's corpus record (its data spec and what decided it) the first time its data is prepared;
    later, refuse data of the same recipe whose tokens differ from the recorded ones (sources changed by hand)."""
    spec, record = ladder.data.spec, _read_corpus_record(folder)
    if record is not None and _recipe(record["data"]) == _recipe(spec):
        if record["data"]["tokens_sha256"] != spec["tokens_sha256"]:
            raise HiResUserError(
                f"The ladder's corpus has other tokens than the one its runs in {folder} trained on (sha256 "
                f"{spec['tokens_sha256'][:12]} here, {record['data']['tokens_sha256'][:12]} there) although its "
                "recipe is the same: its source files changed. Restore them or give --out a new folder."
            )
        return
    environment = python_sources_environment()
    write_json_atomic(folder / CORPUS_RECORD, {"data": spec, "environment": environment})
    if spec["source"] == "python":  # the packages to install where the corpus differs (`check_corpus_environment`)
        pins = "".join(f"{name}=={version}\n" for name, version in environment["packages"].items())
        write_text_atomic(folder / CORPUS_REQUIREMENTS, pins)


def recorded_data(folder: Path, local: Data) -> Data:
    """The data a ladder folder's corpus record describes, without its tokens: enough to key, count and report the
    runs of a folder trained on another machine (whose corpus differs from this one's). Sizes and the token hash
    come from the record, the tokenizer from `local` (one recipe gives the same special ids)."""
    record = _read_corpus_record(folder)
    if record is None:
        raise HiResUserError(
            f"{folder} has no {CORPUS_RECORD}: its runs cannot be read without the corpus they trained on."
        )
    spec = record["data"]
    data = Data(
        train=torch.zeros((), dtype=torch.long).expand(spec["train_blocks"], spec["context"]),
        validation=torch.zeros((), dtype=torch.long).expand(spec["validation_blocks"], spec["context"]),
        tokenizer=local.tokenizer,
        unigram_loss=local.unigram_loss,
        source=spec["source"],
        recipe=_recipe(spec),
    )
    data.__dict__["spec"] = spec  # the recorded hash: these blocks hold no tokens to hash
    return data


def _recipe(spec: dict[str, Any]) -> dict[str, Any]:
    """What a data spec asks for, without what the text it was read from made of it (sizes, token hash)."""
    return {key: value for key, value in spec.items() if key not in _SIZES}


def _read_corpus_record(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / CORPUS_RECORD
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def top_grid(carried: float) -> tuple[float, float, float]:
    """The top rung's starting grid: the rate carried over from the rung below and x sqrt(2) either side."""
    return tidy_rate(carried / SQRT2), carried, tidy_rate(carried * SQRT2)


def _rates_around(grid: Sequence[float], step: float, extensions: int = MAX_EXTENSIONS) -> list[float]:
    """Every rate a bracketing of `grid` can reach: the grid and `extensions` steps past either end (each step
    tidied as `next_rate` tidies it, so that the rates are the very floats the runs were keyed with)."""
    rates, low, high = list(grid), min(grid), max(grid)
    for _ in range(extensions):
        low, high = tidy_rate(low / step), tidy_rate(high * step)
        rates += [low, high]
    return rates


# ---------------------------------------------------------------------------------------------------- stages
def floor_stage(ladder: Ladder) -> Iterator[RunPlan]:
    """The control at the floor's shape: its rate bracketed at `floor_grid_tokens`, then seeds at each length,
    shortest first, up to the first length whose spread is at most `FLOOR_NATS` (longer ones would add nothing
    to the verdict and cost the most)."""
    s, control = ladder.settings, ladder_arms(["control"])[0]
    rung = ladder.rungs[s.floor_rung]
    per_token = control.flops_per_token(rung.shape, ladder.data)
    todo, losses = ladder.bracket(control, rung, s.rates, 2.0, s.floor_grid_tokens * per_token)
    yield from todo
    if todo or bracket_status(losses) != "bracketed":
        return
    lr = best_rate(losses)
    for tokens in s.floor_tokens:
        plans = [ladder.plan(control, rung, lr, seed, tokens * per_token) for seed in range(s.floor_seeds)]
        yield from plans
        runs = [ladder.store.get(plan.key) for plan in plans]
        if None in runs:
            return  # the next length waits for this one's spread
        finals = [run.final_loss for run in runs if run is not None]
        if max(finals) - min(finals) <= FLOOR_NATS:
            return


def precision_rate(ladder: Ladder, arm: Arm, floor_lr: float) -> float:
    """`arm`'s rate in the precision check: the floor's, unless the settings name one the arm trains at."""
    return dict(ladder.settings.precision_rates).get(arm.name, floor_lr)


def precision_stage(ladder: Ladder) -> Iterator[RunPlan]:
    """bf16 against fp32: the control and HiRes at the floor's shape and rate (`precision_rate`), `precision_seeds`
    seeds each, at `precision_tokens` tokens (the bf16 control runs are the floor's own)."""
    s, control = ladder.settings, ladder_arms(["control"])[0]
    rung = ladder.rungs[s.floor_rung]
    per_token = control.flops_per_token(rung.shape, ladder.data)
    todo, losses = ladder.bracket(control, rung, s.rates, 2.0, s.floor_grid_tokens * per_token)
    if todo or bracket_status(losses) != "bracketed":
        return
    for arm in ladder_arms(["control", "hires"]):
        lr = precision_rate(ladder, arm, best_rate(losses))
        for precision in ("bf16", "fp32"):
            for seed in range(s.precision_seeds):
                yield ladder.plan(arm, rung, lr, seed, s.precision_tokens * per_token, precision=precision)


def grid_stage(ladder: Ladder) -> Iterator[RunPlan]:
    """Every arm's rate bracketed (x2) at every rung but the top, each rung's grid centred on the rung below's.

    At a rung the arms take turns, the one with the fewest runs there first, each starting at the centre of its
    grid (the rate carried over): a rung cut short by a stop already compares every arm near its best rate. The
    seeds at the arms' best rates follow once every bracket at the rung that can be planned is planned."""
    for index, rung in enumerate(ladder.rungs[:-1]):
        ranked: list[tuple[tuple[int, int, int], RunPlan]] = []
        for position, arm in enumerate(ladder.arms):
            grid = ladder.grid(arm, index)
            if grid is None:
                continue
            centre = grid[0][len(grid[0]) // 2]
            todo, losses = ladder.bracket(arm, rung, *grid)
            todo.sort(key=lambda plan: plan.settings.learning_rate != centre)
            ranked += [((0, len(losses) + turn, position), plan) for turn, plan in enumerate(todo)]
            if not todo and losses:
                seeds = range(1, ladder.settings.rung_seeds)
                ranked += [((1, seed, position), ladder.plan(arm, rung, best_rate(losses), seed)) for seed in seeds]
        yield from (plan for _, plan in sorted(ranked, key=lambda item: item[0]))


def top_contenders(ladder: Ladder) -> tuple[list[Arm], dict[str, float]] | None:
    """The arms that go to the top rung, and {pruned HiRes arm: its gap to the best HiRes at the rung below}.

    Both vanillas always go (the baseline is the better of them at the top). A HiRes arm goes if its loss at the
    rung below (the mean of its seeds at its best rate, as the report's table has it) is within `FLOOR_NATS` of the
    best HiRes arm's there: a variant already worse by more than the noise does not get the most expensive runs,
    and one seed's luck alone does not decide which. None until every HiRes arm's seeds are in at the rung below.
    """
    below = len(ladder.rungs) - 2
    if below < 0:
        return [*ladder.arms], {}
    means = {}
    for arm in (arm for arm in ladder.arms if arm.kind == HIRES):
        losses = ladder.settled(arm, below)
        seeds = [] if losses is None else ladder.seed_runs(arm, below, best_rate(losses))
        if len(seeds) < ladder.settings.rung_seeds:
            return None
        means[arm.name] = statistics.fmean(run.final_loss for run in seeds)
    lowest = min(means.values(), default=0.0)
    pruned = {name: loss - lowest for name, loss in means.items() if loss - lowest > FLOOR_NATS}
    return [arm for arm in ladder.arms if arm.name not in pruned], pruned


def top_stage(ladder: Ladder) -> Iterator[RunPlan]:
    """At the top rung: the carried-over rate and x sqrt(2) either side (extended) for each contender, then more
    seeds of both vanillas (either can be the baseline) and of the best HiRes."""
    index, top = len(ladder.rungs) - 1, ladder.rungs[-1]
    contenders = top_contenders(ladder)
    arms = contenders[0] if contenders else [arm for arm in ladder.arms if arm.kind != HIRES]
    finals: dict[str, tuple[float, float]] = {}
    for arm in arms:
        grid = ladder.grid(arm, index)
        if grid is None:
            continue  # the rung below is not done for this arm: nothing to carry yet
        todo, top_losses = ladder.bracket(arm, top, *grid)
        yield from todo
        if not todo:
            finals[arm.name] = (best_rate(top_losses), min(top_losses.values()))
    if contenders is None or len(finals) < len(arms):
        return
    hires = [name for name in finals if ladder_arms([name])[0].kind == HIRES]
    vanillas = [name for name in finals if name not in hires]
    seeded = vanillas + ([min(hires, key=lambda name: finals[name][1])] if hires else [])
    for name in seeded:
        arm = ladder_arms([name])[0]
        for seed in range(1, ladder.settings.top_seeds):
            yield ladder.plan(arm, top, finals[name][0], seed)


STAGES: dict[str, Callable[[Ladder], Iterator[RunPlan]]] = {
    "floor": floor_stage,
    "precision": precision_stage,
    "grid": grid_stage,
    "top": top_stage,
}


# ---------------------------------------------------------------------------------------------------- workers
def claim(store: RunStore, key: str) -> bool:
    """Take a run for this process: an exclusive claim file, or one left by a process that no longer runs."""
    path = store.folder / "claims" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{key}.{os.getpid()}")
    for _ in range(2):
        try:  # the staged file is written inside: a worker stopped while writing it leaves nothing behind
            staged.write_text(f"{os.getpid()} {_boot_id()}", encoding="utf-8")
            os.link(staged, path)  # whole or not at all: a claim is never seen empty
            return True
        except FileExistsError:
            if _alive(path):
                return False
            path.unlink(missing_ok=True)  # a killed worker's claim: take the run over (its checkpoint resumes)
        finally:
            staged.unlink(missing_ok=True)
    return False


def _boot_id() -> str:
    """This boot of the machine: a pid in a claim written before a reboot names some other process now."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _alive(path: Path) -> bool:
    try:
        pid, _, boot = path.read_text(encoding="utf-8").partition(" ")
        if boot and boot.strip() != _boot_id():
            return False  # written before this machine last started (a claim without a boot id: the pid decides)
        if int(pid) <= 0:
            return False  # no process of its own named (os.kill would test this process's group)
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError, FileNotFoundError):
        return False
    except PermissionError:
        return True
    return True


def take(ladder: Ladder, plan: RunPlan) -> bool:
    """Claim a planned run that is still not stored. Another worker may have finished it, and released its claim,
    since the plan was read: the claim alone would let a run be trained twice (seen with six workers on one GPU)."""
    if not claim(ladder.store, plan.key):
        return False
    ladder.store.refresh()
    if ladder.store.get(plan.key) is None:
        return True
    release(ladder.store, plan.key)
    return False


def release(store: RunStore, key: str) -> None:
    (store.folder / "claims" / key).unlink(missing_ok=True)


def open_runs(ladder: Ladder, stages: Sequence[str]) -> list[RunPlan]:
    """The stages' runs planned so far (as far as the stored results decide) that are not in the store yet: those
    with a stored checkpoint first, then in plan order. On cores where a run spans several sessions, a run already
    begun is finished before a new one starts, or every session would begin runs and end none."""
    ladder.store.refresh()
    plans = [plan for stage in stages for plan in STAGES[stage](ladder)]
    todo = [plan for plan in plans if ladder.store.get(plan.key) is None]
    return sorted(todo, key=lambda plan: not ladder.store.checkpoint(plan.key).exists())


def run_stages(
    ladder: Ladder,
    stages: Sequence[str],
    progress: bool = True,
    poll_seconds: float = 5.0,
    log: Callable[[str], None] | None = None,
    claim_until: float = math.inf,
) -> list[Run]:
    """Train the stages' planned runs until none is left; waits while other workers hold the runs it needs.

    On a machine held until `claim_until` (`time.time()`, one clock for every worker process) a worker starts only
    runs expected to finish by then (`finishes_by`), and none after it: it finishes the run in hand and stops,
    rather than being killed in a run whose progress would be lost."""
    log = log or say
    trained: list[Run] = []
    while True:
        if time.time() >= claim_until:
            return trained
        open_plans = [plan for plan in open_runs(ladder, stages) if finishes_by(ladder, plan, claim_until)]
        if not open_plans:
            return trained
        plan = next((p for p in open_plans if take(ladder, p)), None)
        if plan is None:
            time.sleep(poll_seconds)  # every open run is held by another worker (a wait costs a re-plan: cheap)
            continue
        log(start_line(ladder, plan))
        try:
            run = _train(ladder, plan, progress)
        finally:
            release(ladder.store, plan.key)
        trained.append(run)
        log(
            f"{clock()} {run_label(ladder, plan)} tokens={run.tokens / 1e6:.1f}M: "
            f"{run.final_loss:.4f} ({run.seconds / 60:.1f} min, {run.tokens_per_second:,.0f} tokens/s)"
        )


def cell_plan(ladder: Ladder, arm: str, rung: str, lr: float, seed: int = 0) -> RunPlan:
    """One run named by hand (`hires-hf ladder --cell`): a rate the stages' plan skips, under the key the plan would
    give it, so that the report counts it wherever its rung's grid reaches (a bracket's one-minimum assumption is
    checked this way)."""
    rungs = {r.name: r for r in ladder.rungs}
    if rung not in rungs:
        raise HiResUserError(f"No rung {rung!r} in this ladder; choose from {', '.join(rungs)}.")
    if not (math.isfinite(lr) and lr > 0):
        raise HiResUserError(f"Learning rate {lr}: give a positive number, e.g. 8e-3.")
    if not 0 <= seed < MOST_SEEDS:
        raise HiResUserError(f"Seed {seed}: give 0 to {MOST_SEEDS - 1} (the report reads that many a cell).")
    return ladder.plan(ladder_arms([arm])[0], rungs[rung], tidy_rate(lr), seed)


def train_cell(ladder: Ladder, plan: RunPlan, progress: bool = True) -> Run:
    """The stored run of `plan`, trained first (from its checkpoint, if it has one) unless it is stored already."""
    ladder.store.refresh()
    stored = ladder.store.get(plan.key)
    if stored is not None:
        return stored
    if not take(ladder, plan):
        ladder.store.refresh()
        stored = ladder.store.get(plan.key)
        if stored is not None:
            return stored
        raise HiResUserError(
            f"{run_label(ladder, plan)} is being trained by another worker (claim {plan.key}); wait for it."
        )
    say(start_line(ladder, plan))
    try:
        return _train(ladder, plan, progress)
    finally:
        release(ladder.store, plan.key)


def start_line(ladder: Ladder, plan: RunPlan) -> str:
    """What a worker says as it takes a run: which, from where, and when it should end (a worker is otherwise silent
    for the hours a run takes)."""
    progress = read_progress(ladder.store.checkpoint(plan.key))
    begun = f" from step {progress['step']:,}" if progress else ""
    seconds = expected_seconds(ladder, plan)
    ends = "" if seconds is None else f", expected to end at {clock(time.time() + seconds)}"
    return f"{clock()} starting {run_label(ladder, plan)}{begun} ({plan.settings.steps:,} steps{ends})"


def run_label(ladder: Ladder, plan: RunPlan) -> str:
    """A run as a worker names it: shape, arm, rate, seed, and its precision where it is not the ladder's (the
    precision stage's fp32 runs would otherwise read as the floor's bf16 ones)."""
    label = f"{plan.shape.name} {plan.arm.name} lr={plan.settings.learning_rate:.3g} seed={plan.settings.seed}"
    precision = plan.settings.precision
    return label if precision == ladder.precision else f"{label} {precision}"


def say(line: str) -> None:
    """A worker's line, flushed: its output is a log file, read while it trains."""
    print(line, flush=True)


def clock(when: float | None = None) -> str:
    """Hours and minutes, local time (now, or `when` as `time.time()`), for the lines a worker prints."""
    return time.strftime("%H:%M", time.localtime(when))


def finishes_by(ladder: Ladder, plan: RunPlan, deadline: float) -> bool:
    """Whether `plan` should end before `deadline` (`time.time()`) if started now; a run whose speed is not known
    yet is given the chance."""
    if math.isinf(deadline):
        return True
    seconds = expected_seconds(ladder, plan)
    return seconds is None or time.time() + seconds <= deadline


def expected_seconds(ladder: Ladder, plan: RunPlan) -> float | None:
    """What is left of `plan` (past its checkpoint) at the median speed, in counted FLOPs a second, of the stored
    runs that trained on this machine at its width, else at the nearest width timed here (a GPU runs a wider model
    at more FLOPs a second, so this errs long); None before any run has trained here."""
    here, width = machine(plan.spec), plan.shape.hidden_size
    by_width: dict[int, list[float]] = {}
    for run in ladder.store.runs():
        if run.machine == here and run.seconds > 0 and not run.diverged and run.stalled is None:
            by_width.setdefault(run.spec["config"]["hidden_size"], []).append(run.spec["budget"]["flops"] / run.seconds)
    if not by_width:
        return None
    speeds = by_width.get(width) or by_width[min(by_width, key=lambda timed: (abs(timed - width), timed))]
    progress = read_progress(ladder.store.checkpoint(plan.key))
    left = 1.0 - (progress["step"] / plan.settings.steps if progress else 0.0)
    return left * plan.budget.flops / statistics.median(speeds)


def _train(ladder: Ladder, plan: RunPlan, progress: bool) -> Run:
    """Train a planned run (from its checkpoint, if it has one); a run that stalls is stored as it stands."""
    label = run_label(ladder, plan)
    # each run compiles its own graphs: a worker that trains many runs would otherwise pass dynamo's recompile
    # limit (one more graph for each control's embedding hook and each shape) and train on in eager mode
    torch._dynamo.reset()
    saved = read_progress(ladder.store.checkpoint(plan.key)) or {"curve": [], "seconds": 0.0}
    ladder.store.started(plan.key, plan.spec)
    watch = StallWatch(plan, ladder.data, baseline_curve(ladder, plan), saved["curve"])
    start = time.perf_counter()
    bar = tqdm(
        total=plan.settings.steps,
        initial=saved.get("step", 0),  # a resumed run counts from its checkpoint, not as a restart
        desc=label,
        disable=not progress,
        dynamic_ncols=True,
        mininterval=5,
    )
    with bar:
        try:
            return execute(
                plan,
                ladder.data,
                ladder.device,
                ladder.store,
                on_step=lambda _: bar.update(1),
                after_update=watch,
                checkpoint_seconds=ladder.settings.checkpoint_seconds,
            )
        except Stalled as stall:
            run = stalled_run(plan, ladder.data, stall, saved["seconds"] + time.perf_counter() - start)
            ladder.store.put(run)
            return run


def baseline_curve(ladder: Ladder, plan: RunPlan) -> list[tuple[float, float]]:
    """The best finished vanilla run at `plan`'s rung as (share of its budget, validation loss): what `StallWatch`
    holds a run against. Empty off the rungs (the floor, the precision check) and before a vanilla has finished."""
    index = next(
        (i for i, r in enumerate(ladder.rungs) if r.shape == plan.shape and r.flops == plan.budget.flops), None
    )
    if index is None:
        return []
    runs = []
    for arm in ladder.arms:
        grid = ladder.grid(arm, index) if arm.kind != HIRES else None
        if grid is not None:
            runs += ladder.stored(arm, ladder.rungs[index], _rates_around(*grid)).values()
    finished = [run for run in runs if not run.diverged and run.stalled is None]
    if not finished:
        return []
    best = min(finished, key=lambda run: run.final_loss)
    return [(spent / best.curve[-1][0], loss) for spent, loss in best.curve]


def open_ladder(settings: LadderSettings, folder: Path, cache_dir: Path | None = None, progress: bool = True) -> Ladder:
    """The ladder's data (prepared once, then read from `cache_dir`) and its run store under `folder`."""
    data = prepare_data(
        settings.corpus,
        settings.vocab_size,
        settings.context,
        settings.max_chars,
        validation_fraction=settings.validation_fraction,
        eval_blocks=settings.eval_blocks,
        progress=progress,
        cache_dir=cache_dir,
    )
    return Ladder(settings, data, RunStore(folder / "runs"), torch.device(settings.device))


__all__ = [
    "FLOOR_NATS",
    "MOST_SEEDS",
    "STAGES",
    "Ladder",
    "LadderSettings",
    "Rung",
    "check_corpus_environment",
    "check_enough_data",
    "expected_seconds",
    "finishes_by",
    "ladder_arms",
    "open_ladder",
    "open_runs",
    "precision_rate",
    "record_corpus",
    "recorded_data",
    "run_stages",
]
