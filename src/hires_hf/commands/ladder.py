"""`hires-hf ladder`: the compute ladder (HiRes against the strongest vanilla over rungs of counted FLOPs).

    hires-hf ladder --workers 2      # two worker processes share the runs (all stages; stop and start at will)
    hires-hf ladder --report         # table, fits, summary.json, plots
    hires-hf ladder --cell hires 64x12 8e-3   # one run the plan skips (a rate outside a bracket), counted by the report
    hires-hf ladder --arms control plain-twin hires k=6   # another set of arms (the report wants the same)

The work is in `hires_hf.experiments.ladder`; results go to benchmarks/results/ladder/ in a checkout (--out).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

from ..errors import HiResUserError
from ..experiments.ladder import (
    ARM_NAMES,
    MOST_SEEDS,
    STAGES,
    Ladder,
    LadderSettings,
    cell_plan,
    check_arms,
    check_corpus_environment,
    check_enough_data,
    open_ladder,
    open_runs,
    record_corpus,
    recorded_data,
    run_label,
    run_stages,
    train_cell,
)
from ..experiments.runs import keyed_as, stored_versions
from ..training.bf16_emulation import emulated_bf16, needs_emulation
from ..training.loop import CHECKPOINT_SECONDS
from . import default, set_threads

DEFAULT_OUT = Path("benchmarks/results/ladder")
# On a CPU without bf16 matrix units torch's own bf16 kernels train 8-11x slower than fp32; the ladder's bf16 runs
# there compute with fp32 kernels instead, with bf16's rounding (`hires_hf.training.bf16_emulation`).
EMULATION_NOTE = (
    "This CPU has no bf16 matrix units (AMX or AVX512-BF16): the ladder's bf16 runs compute their matrix products and "
    "attention with fp32 kernels on bf16 operands, rounded to bf16 (the same runs at 0.86x fp32's speed; each says so)."
)


def cache_dir() -> Path:
    """Where prepared corpora are kept between runs and sessions (HIRES_HF_CACHE, else ~/.cache/hires_hf)."""
    return Path(os.environ.get("HIRES_HF_CACHE", Path.home() / ".cache" / "hires_hf")) / "data"


def settings_of(args: argparse.Namespace) -> LadderSettings:
    settings = LadderSettings.smoke() if args.smoke else LadderSettings()
    changes = {"device": args.device, "precision": args.precision, "compile": args.compile}
    changes |= {"rung_seeds": args.seeds, "top_seeds": args.top_seeds or args.seeds}
    if args.arms:
        changes["arms"] = tuple(check_arms(args.arms))
    if args.checkpoint_minutes is not None:
        changes["checkpoint_seconds"] = 60 * args.checkpoint_minutes
    return replace(settings, **{k: v for k, v in changes.items() if v is not None})


def run_ladder(args: argparse.Namespace) -> int:
    if args.report:
        return run_ladder_report(args)
    if args.from_record:
        raise HiResUserError("--from-record only reads a folder (--report): runs train on the corpus of this machine.")
    unknown = [stage for stage in args.stages if stage not in STAGES]
    if unknown:
        raise HiResUserError(f"Unknown stage(s) {unknown}; choose from {', '.join(STAGES)}.")
    if args.workers < 1:
        raise HiResUserError(f"--workers {args.workers}: give at least 1 worker process.")
    for flag, seeds in (("--seeds", args.seeds), ("--top-seeds", args.top_seeds)):
        if seeds is not None and not 1 <= seeds <= MOST_SEEDS:
            raise HiResUserError(f"{flag} {seeds}: give 1 to {MOST_SEEDS} seeds at each best rate.")
    if args.checkpoint_minutes is not None and args.checkpoint_minutes <= 0:
        raise HiResUserError(f"--checkpoint-minutes {args.checkpoint_minutes:g}: give a positive number of minutes.")
    with exit_on_term():  # `kill`: leave the run's claim free for the next worker
        return train_ladder(args)


def train_ladder(args: argparse.Namespace) -> int:
    """The stages, one `--cell`, or the `--workers` that share the stages, once the arguments are checked."""
    claim_until = claim_deadline(args)
    settings = settings_of(args)
    set_threads(args.threads)
    check_corpus_environment(settings, args.out)
    ladder = open_ladder(settings, args.out, cache_dir(), progress=not args.quiet)
    check_enough_data(ladder)
    record_corpus(ladder, args.out)
    emulate = needs_emulation(settings.device, ladder.precision)
    if emulate and not args.quiet:
        print(EMULATION_NOTE, file=sys.stderr)
    if args.cell:
        with emulated_bf16() if emulate else nullcontext():
            return run_cell(args, ladder)
    if args.workers > 1:
        return run_workers(args, claim_until)
    with emulated_bf16() if emulate else nullcontext():
        trained = run_stages(ladder, args.stages, progress=not args.quiet, claim_until=claim_until)
    left = len(open_runs(ladder, args.stages))
    state = "complete" if not left else f"{left} runs still open"
    if left and not math.isinf(claim_until):
        state = f"{state}, none of them expected to finish by {time.strftime('%H:%M:%S', time.localtime(claim_until))}"
    print(f"Stages {' '.join(args.stages)} {state} ({len(trained)} runs trained by this worker) in {args.out}.")
    return 0


def run_cell(args: argparse.Namespace, ladder: Ladder) -> int:
    """Train one run outside the stages' plan (`--cell`), or say its stored result."""
    arm, rung, lr = args.cell
    try:
        rate = float(lr)
    except ValueError:
        raise HiResUserError(f"--cell {' '.join(args.cell)}: LR is a number, e.g. --cell hires 64x12 8e-3.") from None
    plan = cell_plan(ladder, arm, rung, rate, args.cell_seed)
    run = train_cell(ladder, plan, progress=not args.quiet)
    print(f"{run_label(ladder, plan)}: {run.final_loss:.4f} (stored in {ladder.store.folder}).")
    return 0


def claim_deadline(args: argparse.Namespace) -> float:
    """When a worker starts its last run (`time.time()`): --claim-for minutes from now, or the --workers parent's
    own deadline, passed down whole so that the workers' start-up does not move it."""
    if args.claim_until is not None:
        return args.claim_until
    return math.inf if args.claim_for is None else time.time() + 60 * args.claim_for


def run_workers(args: argparse.Namespace, claim_until: float) -> int:
    """`--workers N`: N worker processes share the runs (the data is prepared once, by this process, before they
    start); each prints a line per finished run. A `kill` of this process stops them all, their claims left free."""
    if time.time() >= claim_until:
        print("No workers started: the --claim-for time had passed once the data was ready.")
        return 0
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // args.workers)
    command = worker_command(args, threads, claim_until)
    workers: list[subprocess.Popen] = []
    try:
        for _ in range(args.workers):
            workers.append(subprocess.Popen(command))
        codes = [exit_code(worker.wait()) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()  # SIGTERM: the worker releases its claim; its run resumes from its checkpoint
        for worker in workers:
            worker.wait()
    failed = [code for code in codes if code != 0]
    print(f"{args.workers} workers done in {args.out}" + (f"; exit codes {codes}" if failed else "."))
    return failed[0] if failed else 0


def exit_code(returncode: int) -> int:
    """A worker's status as a shell reports it: killed by signal N is 128 + N (Popen says -N)."""
    return 128 - returncode if returncode < 0 else returncode


def worker_command(args: argparse.Namespace, threads: int, claim_until: float) -> list[str]:
    """The `hires-hf ladder` line of one of `--workers`' processes: these settings, one worker, no progress bar."""
    command = [sys.executable, "-m", "hires_hf.cli", "ladder", "--stages", *args.stages, "--out", str(args.out)]
    command += ["--threads", str(threads), "--quiet"] + (["--smoke"] if args.smoke else [])
    options = (("--device", args.device), ("--precision", args.precision), ("--compile", args.compile))
    command += ["--arms", *args.arms] if args.arms else []
    counts = (
        ("--seeds", args.seeds),
        ("--top-seeds", args.top_seeds),
        ("--checkpoint-minutes", args.checkpoint_minutes),
    )
    for flag, value in (*options, *counts):
        if value is not None:
            command += [flag, str(value)]
    return command + ([] if math.isinf(claim_until) else ["--claim-until", repr(claim_until)])


@contextmanager
def exit_on_term() -> Iterator[None]:
    """SIGTERM exits through `finally` blocks while the ladder trains, and is the caller's again afterwards (a
    script or notebook that calls `main` keeps its own handling)."""
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: object) -> None:
    """SIGTERM as an exit, so that the claim is released on the way out (the run resumes from its checkpoint); a
    second SIGTERM (`timeout` signals the whole process group, the --workers parent its workers) is ignored, so
    that it cannot cut that way out short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def run_ladder_report(args: argparse.Namespace) -> int:
    from ..experiments.ladder_report import write_report

    settings = settings_of(args)
    if not args.from_record:
        check_corpus_environment(settings, args.out)
    ladder = open_ladder(settings, args.out, cache_dir(), progress=not args.quiet)
    keyed = nullcontext()
    if args.from_record:  # a folder trained elsewhere: its record's data, its runs' library versions
        ladder = replace(ladder, data=recorded_data(args.out, ladder.data), _plans={})
        keyed = keyed_as(stored_versions(args.out / "runs"))
    with keyed:
        print(write_report(ladder, args.out))
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ladder",
        help="the compute ladder: HiRes vs the strongest vanilla over rungs of counted FLOPs",
        description="Train the ladder's stages (resumable; --workers N processes share them), or --report.",
    )
    parser.add_argument("--stages", nargs="+", default=list(STAGES), help=f"of {', '.join(STAGES)} (default: all)")
    parser.add_argument("--report", action="store_true", help="write table, fits, summary.json and plots instead")
    parser.add_argument(
        "--from-record",
        action="store_true",
        help="with --report: a folder trained on another machine (a GPU's), read with its corpus record's sizes "
        "and token hash instead of this machine's corpus",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})")
    parser.add_argument("--smoke", action="store_true", help="the seconds-long ladder (tests)")
    parser.add_argument(
        "--arms",
        nargs="+",
        metavar="ARM",
        help=f"the arms, at least one vanilla and one HiRes (default: {' '.join(default(LadderSettings, 'arms'))}; "
        f"also {', '.join(sorted(set(ARM_NAMES) - set(default(LadderSettings, 'arms'))))}); the report wants the "
        "same list to show them",
    )
    parser.add_argument("--device", help=f"default {default(LadderSettings, 'device')}")
    parser.add_argument(
        "--precision", choices=("auto", "bf16", "fp32"), help=f"default {default(LadderSettings, 'precision')}"
    )
    parser.add_argument("--compile", choices=("auto", "on", "off"), help="default: compile runs that repay it")
    parser.add_argument(
        "--seeds",
        type=int,
        help=f"seeds at each arm's best rate, every rung (default {default(LadderSettings, 'rung_seeds')}; more where "
        "runs are cheap and noisy, as on a GPU)",
    )
    parser.add_argument(
        "--top-seeds",
        type=int,
        help="seeds of both vanillas and the best HiRes at the top rung's best rates (default: as --seeds); the top "
        "rung's gap is the verdict, so it may want more (the report says how many)",
    )
    parser.add_argument(
        "--checkpoint-minutes",
        type=float,
        help=f"minutes between a run's checkpoints (default {CHECKPOINT_SECONDS / 60:g}); a stored run keeps its "
        "training loss step by step as far as its last checkpoint, so runs of a few minutes (a GPU's) want less",
    )
    parser.add_argument(
        "--claim-for",
        type=float,
        metavar="MINUTES",
        help="a machine held this many minutes: start only runs expected to finish in them (at the speed stored runs "
        "measured here at their width, else the nearest width timed here), none after them; the run in hand finishes",
    )
    parser.add_argument("--claim-until", type=float, help=argparse.SUPPRESS)  # --workers' deadline, time.time()
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes that share the runs (default 1; threads split the CPU between them unless --threads)",
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (one per worker when two share 2 cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--cell",
        nargs=3,
        metavar=("ARM", "RUNG", "LR"),
        help="train this one run instead of the stages (a rate the plan skips; its key is the plan's, so the report "
        "shows it in its rung's grid); a run already stored is only reported",
    )
    parser.add_argument("--cell-seed", type=int, default=0, help="the --cell run's seed (default 0)")
    parser.set_defaults(func=run_ladder)
