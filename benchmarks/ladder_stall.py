"""Why HiRes stalls at the ladder's second rung: the first steps of its runs, watched.

At 96x12 the shipped HiRes at its rung-1 best rate (3.2e-2) sat at 4.5-4.7 nats for half its budget, and at 1.6e-2
on the floor's length it was at 4.65 where the control was at 3.9. That level is not the unigram loss (6.54 on this
corpus), the stall `docs/stability.md` explains: it is the *bigram* loss, what a model reaches that predicts the
next token from the current one alone. This script trains the first steps of runs at that shape on the ladder's
data and schedule (the floor's length: warm-up over 24 steps, so a rate is reached early) and records, every few
steps, the loss on validation blocks beside the bigram loss, each layer's attention entropy, and per HiRes block
the stream's shared fraction and the write's size against the stream (`hires_hf.diagnostics`). Nothing is stored
in the ladder's run store: these runs end early by design.

    python benchmarks/ladder_stall.py                  # hires at 4e-3 / 1.6e-2, D=4d and the control at 1.6e-2
    python benchmarks/ladder_stall.py --cases hires:3.2e-2 --steps 150
    python benchmarks/ladder_stall.py --smoke          # seconds: tests

Writes benchmarks/results/ladder_stall/stall.{json,md,png} (or under --out-dir), after every case.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from hires_hf.commands.ladder import cache_dir
from hires_hf.diagnostics import DiagnosticsRecorder
from hires_hf.diagnostics.probes import attention_weights
from hires_hf.errors import HiResUserError
from hires_hf.experiments.harness import execute
from hires_hf.experiments.ladder import Ladder, LadderSettings, ladder_arms, open_ladder
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import pyplot
from hires_hf.tables import markdown_table
from hires_hf.training.loop import evaluate
from hires_hf.training.prepare import Data

RESULTS = Path(__file__).resolve().parent / "results" / "ladder_stall"
DEFAULT_CASES = ("hires:1.6e-2", "control:1.6e-2", "D=4d:1.6e-2", "hires:4e-3")
PROBE_BLOCKS = 8


class Enough(Exception):
    """Raised from the loop's hook once a case has trained the steps it was asked for."""


def bigram_loss(data: Data, blocks: torch.Tensor, train_blocks: int = 20_000, smoothing: float = 0.01) -> float:
    """Cross-entropy of `blocks` under next-token counts given the current token alone, from the first
    `train_blocks` training blocks (add-`smoothing` counts): the loss of a model that ignores all earlier context."""
    vocab = int(max(data.train.max(), blocks.max())) + 1
    train = data.train[:train_blocks].long()
    pairs = train[:, :-1].reshape(-1) * vocab + train[:, 1:].reshape(-1)
    counts = torch.bincount(pairs, minlength=vocab * vocab).double().view(vocab, vocab) + smoothing
    log_p = (counts / counts.sum(1, keepdim=True)).log()
    blocks = blocks.long()
    return -log_p[blocks[:, :-1].reshape(-1), blocks[:, 1:].reshape(-1)].mean().item()


@torch.no_grad()
def attention_targets(model: nn.Module, input_ids: torch.Tensor) -> dict[str, list[float]]:
    """Per layer, the mean attention weight a query puts on its own token, the one before it and the block's first:
    where an attention whose entropy collapsed looks (on itself it passes on the current token alone, on the first
    token nothing, on the previous one what a bigram model lacks)."""
    attentions = attention_weights(model, input_ids)
    own = [probs.float().diagonal(dim1=-2, dim2=-1)[..., 1:].mean().item() for probs in attentions]
    previous = [probs.float().diagonal(offset=-1, dim1=-2, dim2=-1).mean().item() for probs in attentions]
    first = [probs.float()[..., 1:, 0].mean().item() for probs in attentions]  # the first query has no choice
    return {"attention_on_self": own, "attention_on_previous": previous, "attention_on_first": first}


def watch_case(ladder: Ladder, arm_name: str, lr: float, steps: int, every: int, flops: float) -> dict[str, Any]:
    """Train `arm_name` at peak `lr` on the ladder's floor shape for `steps` steps of a run of `flops`, with the
    diagnostics every `every` steps; the run is the ladder's own (same batches, schedule and precision)."""
    arm = ladder_arms([arm_name])[0]
    rung = ladder.rungs[ladder.settings.floor_rung]
    per_token = arm.flops_per_token(rung.shape, ladder.data)
    plan = ladder.plan(arm, rung, lr, 0, flops * per_token)
    steps = min(steps, plan.settings.steps)
    probe = ladder.data.validation[:PROBE_BLOCKS].to(ladder.device)
    recorder = DiagnosticsRecorder(probe, every=every)
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=steps, desc=f"{arm_name} lr={lr:g}", dynamic_ncols=True, mininterval=5)

    def after_update(model: nn.Module, step: int) -> None:
        bar.update(1)
        done = step + 1
        row = recorder.after_step(model, step)
        if row is not None or done == steps:
            row = row or {"step": step, **recorder.probe(model)}  # the recorder's probe has the attention's entropy
            targets = attention_targets(model, probe)
            loss = evaluate(model, probe, PROBE_BLOCKS, "fp32")
            rows.append({**_slim(row), **targets, "step": done, "loss": loss})
        if done >= steps and steps < plan.settings.steps:
            raise Enough

    final_loss = None  # a run trained to its end has its validation loss, comparable with the ladder's runs
    try:
        run = execute(plan, ladder.data, ladder.device, before_update=recorder.before_step, after_update=after_update)
        final_loss = run.final_loss
    except Enough:
        pass
    finally:
        bar.close()
    case = {"arm": arm_name, "lr": lr, "steps": steps, "of_steps": plan.settings.steps, "rows": rows}
    return {**case, "final_loss": final_loss}


def _slim(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("step", "final_shared", "units", "attention_entropy", "grad_norm", "update_ratio", "kind")
    return {key: row[key] for key in keep if key in row}


# ---------------------------------------------------------------------------------------------------- output
def case_label(case: dict[str, Any]) -> str:
    return f"{case['arm']} lr={case['lr']:g}"


def summary_table(cases: list[dict[str, Any]], bigram: float, unigram: float) -> str:
    """Per case at its last probe: loss, against the bigram loss, attention entropy (mean and lowest layer), the
    final hidden state's shared fraction and the largest write-to-stream ratio of a HiRes block; for a run trained
    to its end, its loss on the whole validation set (the ladder's measure)."""
    rows = []
    for case in cases:
        last = case["rows"][-1]
        entropy = last["attention_entropy"]
        writes = [unit["write_to_stream"] for unit in last["units"] if "write_to_stream" in unit]
        rows.append(
            [
                case_label(case),
                f"{last['step']} of {case['of_steps']}",
                f"{last['loss']:.3f}",
                f"{last['loss'] - bigram:+.3f}",
                f"{sum(entropy) / len(entropy):.2f}",
                f"{min(entropy):.2f}",
                f"{last['final_shared']:.2f}",
                f"{max(writes):.2f}" if writes else "",
                "" if case.get("final_loss") is None else f"{case['final_loss']:.4f}",
            ]
        )
    header = ["run", "step", "loss", "vs bigram", "attention entropy", "lowest layer", "final shared", "max write"]
    header.append("validation loss at the end")
    note = f"Unigram loss {unigram:.3f}, bigram loss {bigram:.3f} (the probe's {PROBE_BLOCKS} validation blocks)."
    return note + "\n\n" + "\n".join(markdown_table(header, rows, align="llrrrrrrr"))


def plot(cases: list[dict[str, Any]], bigram: float, unigram: float, path: Path) -> Path:
    """Loss, mean attention entropy and the lowest layer's, and the largest write-to-stream ratio, against step."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for index, case in enumerate(cases):
        steps = [row["step"] for row in case["rows"]]
        entropy = [row["attention_entropy"] for row in case["rows"]]
        style = {"label": case_label(case), "color": f"C{index % 10}"}  # one colour a case in every panel
        axes[0, 0].plot(steps, [row["loss"] for row in case["rows"]], **style)
        axes[0, 1].plot(steps, [sum(e) / len(e) for e in entropy], **style)
        axes[1, 0].plot(steps, [min(e) for e in entropy], **style)
        writes = [[u["write_to_stream"] for u in row["units"] if "write_to_stream" in u] for row in case["rows"]]
        if all(writes):
            axes[1, 1].plot(steps, [max(w) for w in writes], **style)
    axes[0, 0].axhline(bigram, color="k", ls="--", lw=1, label="bigram loss")
    axes[0, 0].axhline(unigram, color="grey", ls=":", lw=1, label="unigram loss")
    axes[1, 1].set_yscale("log")
    titles = [
        "validation loss (probe blocks)",
        "attention entropy, mean over layers (1 = uniform)",
        "attention entropy, lowest layer",
        "largest RMS(write) / RMS(stream) of a HiRes block",
    ]
    for ax, title in zip(axes.flat, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:  # a vanilla-only watch draws no writes
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(cases: list[dict[str, Any]], bigram: float, unigram: float, out_dir: Path, meta: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {**meta, "bigram_loss": bigram, "unigram_loss": unigram, "cases": cases}
    write_json_atomic(out_dir / "stall.json", payload)
    plot(cases, bigram, unigram, out_dir / "stall.png")
    commands = "\n".join(dict.fromkeys(case["command"] for case in cases))
    text = f"# The rung-2 stall, watched\n\n```\n{commands}\n```\n\n{summary_table(cases, bigram, unigram)}\n\n"
    write_text_atomic(out_dir / "stall.md", text + "![stall](stall.png)\n")


# ---------------------------------------------------------------------------------------------------- command
def earlier_cases(out_dir: Path, tokens: float, steps: int) -> list[dict[str, Any]]:
    """The cases an earlier call wrote at the same run length and steps (kept beside the new ones; a case asked for
    again is trained again)."""
    path = out_dir / "stall.json"
    if not path.exists():
        return []
    payload = json.loads(path.read_text(encoding="utf-8"))
    kept = [c for c in payload["cases"] if payload.get("tokens") == tokens and c["steps"] == steps]
    return [{"command": payload.get("command", "python benchmarks/ladder_stall.py"), **case} for case in kept]


def parse_case(text: str) -> tuple[str, float]:
    arm, sep, lr = text.partition(":")
    try:
        rate = float(lr)
    except ValueError:
        rate = math.nan
    if not sep or not math.isfinite(rate) or rate <= 0:
        raise argparse.ArgumentTypeError(f"case {text!r} is not ARM:LR (e.g. hires:1.6e-2)")
    return arm, rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", type=parse_case, default=[parse_case(c) for c in DEFAULT_CASES])
    parser.add_argument("--steps", type=int, default=150, help="steps trained of each case's run")
    parser.add_argument("--every", type=int, default=10, help="steps between probes")
    parser.add_argument("--tokens", type=float, default=None, help="the run's length (default: the floor's 4M)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--smoke", action="store_true", help="the ladder's seconds-long smoke settings")
    args = parser.parse_args(argv)
    try:
        ladder_arms([arm for arm, _ in args.cases])
    except HiResUserError as error:
        parser.error(str(error))
    settings = LadderSettings.smoke() if args.smoke else LadderSettings()
    ladder = open_ladder(replace(settings, compile="off"), args.out_dir, cache_dir(), progress=not args.smoke)
    tokens = args.tokens or settings.floor_grid_tokens
    probe = ladder.data.validation[:PROBE_BLOCKS]
    bigram, unigram = bigram_loss(ladder.data, probe), ladder.data.unigram_loss
    command = shlex.join(["python", "benchmarks/ladder_stall.py", *(sys.argv[1:] if argv is None else argv)])
    meta = {"tokens": tokens, "torch": torch.__version__}
    cases = [c for c in earlier_cases(args.out_dir, tokens, args.steps) if (c["arm"], c["lr"]) not in args.cases]
    for arm, lr in args.cases:
        case = watch_case(ladder, arm, lr, args.steps, args.every, tokens)
        cases.append({**case, "command": command, "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
        write(cases, bigram, unigram, args.out_dir, meta)
    print(summary_table(cases, bigram, unigram))
    return 0


if __name__ == "__main__":
    sys.exit(main())
