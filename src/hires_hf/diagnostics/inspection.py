"""Look inside a model folder (one probe) or a training run (its diagnostics over steps): `hires-hf inspect`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import HiResUserError
from ..tables import markdown_row, markdown_table
from .probes import attention_collapsed, collapse_advice
from .recorder import DIAGNOSTICS_FILE, read_rows


def inspect(
    target: str | Path,
    *,
    out: str | Path | None = None,
    probe_ids: Callable[[Path, Any], torch.Tensor] | None = None,
) -> int:
    """Print the table for `target` and write its figure (and a model's numbers) to `out` (default: beside it).

    A model folder is probed on `probe_ids(folder, config)`: (rows, tokens) ids the caller prepares (the inspect
    command: held-out text through the folder's tokenizer, `hires_hf.training.prepare.probe_ids`); without it,
    seeded random ids over the vocabulary.
    """
    target = Path(target)
    # a diagnostics.jsonl, a Trainer output folder holding one, or `hires-hf train`'s OUTPUT_DIR (in checkpoints/)
    candidates = (
        [target] if target.is_file() else [target / DIAGNOSTICS_FILE, target / "checkpoints" / DIAGNOSTICS_FILE]
    )
    run_file = next((path for path in candidates if path.is_file() and path.suffix == ".jsonl"), None)
    if run_file is not None:
        return _inspect_run(run_file, Path(out) if out else run_file.parent)
    if (target / "config.json").is_file():
        return _inspect_model(target, out, probe_ids)
    raise HiResUserError(
        f"{target} holds neither a {DIAGNOSTICS_FILE} (a run trained with `hires-hf train --diagnostics-every N` or"
        " with DiagnosticsCallback) nor a config.json (a model folder); pass one of those."
    )


def _inspect_run(path: Path, out_dir: Path) -> int:
    from .plot import plot_run

    rows = read_rows(path)
    if not rows:
        raise HiResUserError(f"{path} has no rows yet; run more steps with diagnostics on.")
    print(run_table(rows))
    collapsed = next((row for row in rows if attention_collapsed(row.get("attention_entropy", []))), None)
    if collapsed is not None:
        print(f"From step {collapsed['step']}: {collapse_advice(collapsed['attention_entropy'])}.")
    figure = plot_run(rows, out_dir / "diagnostics.png", title=str(path.parent))
    print(f"figure: {figure}")
    return 0


def run_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per diagnosed step, the final hidden state's shared fraction, the largest write/stream ratio
    and the update ratios of the wide-stream groups next to the layers'."""
    groups = ["embed", "read", "write", "read_out", "attn", "mlp", "head"]
    present = [g for g in groups if any(g in row.get("update_ratio", {}) for row in rows)]
    header = ["step", "final shared", "max write/stream", *(f"upd {g}" for g in present)]
    lines = markdown_table(header, align="r" * len(header))
    for row in rows:
        ratios = [u.get("write_to_stream") for u in row["units"] if u.get("write_to_stream") is not None]
        worst = f"{max(ratios):.2f}" if ratios else "-"
        updates = [f"{row.get('update_ratio', {}).get(g, float('nan')):.2e}" for g in present]
        lines.append(markdown_row([row["step"], f"{row['final_shared']:.3f}", worst, *updates]))
    return "\n".join(lines)


def _inspect_model(folder: Path, out: str | Path | None, probe_ids: Callable[[Path, Any], torch.Tensor] | None) -> int:
    from transformers import AutoModelForCausalLM

    import hires_hf  # noqa: F401  (registers the hires model type)

    from .plot import plot_probe
    from .probes import attention_entropy, projection_spectra, stream_probe

    model = AutoModelForCausalLM.from_pretrained(folder)
    if probe_ids is None:
        ids = torch.randint(0, model.config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0))
    else:
        ids = probe_ids(folder, model.config)
    with torch.no_grad():
        probe = stream_probe(model, ids)
        probe["attention_entropy"] = attention_entropy(model, ids)
        probe["spectra"] = projection_spectra(model)
    print(probe_table(probe))
    # never into the model folder itself: whatever lands there would be published with the model
    out_dir = Path(out) if out else folder.resolve().parent / f"{folder.resolve().name}-inspect"
    if out_dir.resolve() == folder.resolve():
        raise HiResUserError(f"--out {out_dir} is the model folder; choose another folder for the figure.")
    figure = plot_probe(probe, out_dir / "inspect.png", title=str(folder))
    (out_dir / "inspect.json").write_text(json.dumps(probe, indent=1))
    print(f"figure: {figure}\nnumbers: {out_dir / 'inspect.json'}")
    return 0


# probe_table's columns for a HiRes model: the key in a probe's block entry -> the column's name
BLOCK_COLUMNS = {
    "stream_rms": "stream RMS",
    "stream_shared": "stream shared",
    "read_rms": "read RMS",
    "inner_rms": "inner RMS",
    "write_rms": "write RMS",
    "write_shared": "write shared",
    "write_to_stream": "write/stream",
}


def probe_table(probe: dict[str, Any]) -> str:
    """Markdown: one row per block (or layer) of a single probe."""
    if probe["kind"] != "block":
        rows = [(u["layer"], f"{u['stream_rms']:.3g}", f"{u['stream_shared']:.3f}") for u in probe["units"]]
        lines = markdown_table(["layer", "stream RMS", "stream shared"], rows, align="rrr")
    else:
        # shared fractions (0..1) to 3 decimals, magnitudes to 3 significant digits
        rows = [
            [u["block"], *(format(u[key], ".3f" if "shared" in key else ".3g") for key in BLOCK_COLUMNS)]
            for u in probe["units"]
        ]
        lines = markdown_table(["block", *BLOCK_COLUMNS.values()], rows, align="r" * (1 + len(BLOCK_COLUMNS)))
    lines.append(f"\nfinal hidden state shared fraction: {probe['final_shared']:.3f}")
    if probe.get("attention_entropy"):
        lines.append(
            "attention entropy / uniform per layer: " + " ".join(f"{e:.2f}" for e in probe["attention_entropy"])
        )
        if attention_collapsed(probe["attention_entropy"]):
            lines.append(collapse_advice(probe["attention_entropy"]).capitalize() + ".")
    for name, values in probe.get("spectra", {}).items():
        lines.append(f"top singular values {name}: " + " ".join(f"{v:.3g}" for v in values))
    return "\n".join(lines)


__all__ = ["inspect", "probe_table", "run_table"]
