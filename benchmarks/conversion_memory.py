"""Peak memory of a streamed `hires-hf convert` on a synthetic multi-shard Llama checkpoint of >= 1 GB.

The claim under test: peak RSS stays near one input shard plus one output shard, not the whole model.
The source is written shard by shard from random tensors (never held whole), then converted in a fresh Python
process whose peak RSS (VmHWM, which counts memory-mapped pages too) is compared with its RSS after imports.

    python benchmarks/conversion_memory.py            # writes benchmarks/results/conversion_memory.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from hires_hf.tables import markdown_table

RESULTS = Path(__file__).resolve().parent / "results" / "conversion_memory" / "conversion_memory.md"
MB = 2**20

# ~271M parameters, 1.08 GB in float32.
SOURCE_SHAPE = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=16,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)

# VmHWM (peak RSS of this process's own memory map), not ru_maxrss: Linux carries ru_maxrss over from the
# parent across fork + exec, so it would report this benchmark's own peak.
CHILD = """
import json, sys, time
from hires_hf.conversion import convert
def hwm():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
baseline = hwm()
start = time.perf_counter()
report = convert(sys.argv[1], sys.argv[2], residual_size=int(sys.argv[3]), layers_per_block=int(sys.argv[4]),
                 exact=True, max_shard_size=sys.argv[5], check=False)
seconds = time.perf_counter() - start
peak = hwm()
print(json.dumps(dict(baseline_kib=baseline, peak_kib=peak, seconds=seconds, shards=report.num_shards)))
"""


def write_synthetic_source(folder: Path, shard_bytes: int) -> list[int]:
    """A Llama checkpoint of random weights, written one shard at a time; returns the shard sizes in bytes."""
    config = LlamaConfig(**SOURCE_SHAPE)
    config.save_pretrained(folder)
    with torch.device("meta"):
        shapes = {key: tuple(t.shape) for key, t in LlamaForCausalLM(config).state_dict().items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes, weight_map = [0], {}
    names = [f"model-{i:05d}.safetensors" for i in range(1000)]
    for key, shape in tqdm(shapes.items(), desc="writing synthetic source", unit="tensor"):
        tensor = torch.randn(shape) * 0.02
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and sizes[-1] + size > shard_bytes:
            save_file(shards[-1], folder / names[len(shards) - 1], metadata={"format": "pt"})
            shards[-1] = {}  # forget the written shard before starting the next
            shards.append({})
            sizes.append(0)
        shards[-1][key] = tensor
        sizes[-1] += size
        weight_map[key] = names[len(shards) - 1]
    save_file(shards[-1], folder / names[len(shards) - 1], metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return sizes


def measure(src: Path, dst: Path, residual_size: int, layers_per_block: int, max_shard_size: str) -> dict:
    """Convert in a fresh process (so nothing of this one counts) and return its RSS figures."""
    args = [sys.executable, "-c", CHILD, str(src), str(dst), str(residual_size), str(layers_per_block)]
    done = subprocess.run([*args, max_shard_size], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(sizes: list[int], result: dict, residual_size: int, max_shard_size: str, output_bytes: int) -> str:
    peak, baseline = result["peak_kib"] / 1024, result["baseline_kib"] / 1024
    total = sum(sizes) / MB
    d = SOURCE_SHAPE["hidden_size"]
    return "\n".join(
        [
            "# Streamed conversion: peak memory",
            "",
            f"Written by `python benchmarks/conversion_memory.py` on {time.strftime('%Y-%m-%d')}, "
            f"torch {torch.__version__}, CPU.",
            "",
            f"Source: synthetic Llama (d={d}, L={SOURCE_SHAPE['num_hidden_layers']}, "
            f"vocab {SOURCE_SHAPE['vocab_size']}), float32, {total:,.0f} MiB in {len(sizes)} shards "
            f"(largest {max(sizes) / MB:,.0f} MiB).",
            f"Target: HiRes `--exact`, D={residual_size}, k=4, output shards of at most {max_shard_size} "
            f"({result['shards']} shards, {output_bytes / MB:,.0f} MiB).",
            "",
            *markdown_table(
                ["measure", "MiB"],
                [
                    ("whole source checkpoint", f"{total:,.0f}"),
                    ("RSS after imports (python, torch, transformers, hires_hf)", f"{baseline:,.0f}"),
                    ("peak RSS during conversion", f"{peak:,.0f}"),
                    ("peak RSS above the imports", f"{peak - baseline:,.0f}"),
                    ("largest input shard + output shard limit", f"{max(sizes) / MB + _size_mib(max_shard_size):,.0f}"),
                ],
                align="lr",
            ),
            "",
            f"Conversion time: {result['seconds']:.1f} s (without the closing logits check, which loads both models"
            " in float32 and so needs about twice the model in memory).",
            "",
            "Peak RSS (VmHWM) counts memory-mapped source pages that were touched; a shard is unmapped once "
            "every tensor read from it has been written.",
            "",
        ]
    )


def _size_mib(text: str) -> float:
    from hires_hf.conversion.convert import parse_size

    return parse_size(text) / MB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-shard-mb", type=int, default=256)
    parser.add_argument("--max-shard-size", default="256MB")
    parser.add_argument("--residual-size", type=int, default=1536)
    parser.add_argument("--workdir", default=None, help="where the synthetic source and result go (a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        src, dst = Path(work) / "source", Path(work) / "hires"
        src.mkdir()
        sizes = write_synthetic_source(src, args.source_shard_mb * MB)
        result = measure(src, dst, args.residual_size, 4, args.max_shard_size)
        output_bytes = sum(p.stat().st_size for p in dst.glob("*.safetensors"))
    text = report(sizes, result, args.residual_size, args.max_shard_size, output_bytes)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
