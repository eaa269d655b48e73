"""Rename the weights of a folder saved by hires-hf 0.1 (layers nested in blocks) to today's flat names.

    python -m hires_hf.conversion.legacy FOLDER

hires-hf 0.1 saved layer `i` of block `b` as `model.blocks.{b}.layers.{i}.*`; the layers now live in one flat list
as Llama's do, `model.layers.{b * k + i}.*` (k = `layers_per_block`), and `model.blocks.{b}.*` keeps only the
block's own read / write / norms. `from_pretrained` refuses an old folder in one line that names this command
(an old folder would otherwise load with every layer at its random init). The rename rewrites each safetensors
shard (and the index) in place, through a temporary file per shard; the tensors themselves are unchanged.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import HiResUserError

NESTED = re.compile(r"(^|\.)blocks\.(\d+)\.layers\.(\d+)\.")


def flat_name(name: str, layers_per_block: int) -> str:
    """'model.blocks.1.layers.0.self_attn.q_proj.weight' -> 'model.layers.{k + 0}.self_attn.q_proj.weight'."""

    def flat(match: re.Match) -> str:
        block, inner = int(match.group(2)), int(match.group(3))
        return f"{match.group(1)}layers.{block * layers_per_block + inner}."

    return NESTED.sub(flat, name, count=1)


def rename_nested_layers(folder: str | Path) -> int:
    """Rewrite every old layer name of `folder` to the flat layout; returns how many tensors were renamed."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise HiResUserError(f"{folder} has no config.json; pass a HiRes model folder.")
    config = json.loads(config_path.read_text())
    if config.get("model_type") != "hires":
        raise HiResUserError(f"{folder} is not a HiRes folder (model_type={config.get('model_type')!r}).")
    k = int(config.get("layers_per_block") or 4)  # 4: the config's default, which to_dict always writes anyway
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise HiResUserError(f"{folder} holds no *.safetensors weights.")
    renamed = 0
    for shard in shards:
        with safe_open(shard, framework="pt") as handle:
            names = list(handle.keys())
            if not any(NESTED.search(name) for name in names):
                continue
            metadata = handle.metadata()
            tensors = {flat_name(name, k): handle.get_tensor(name) for name in names}
        renamed += sum(bool(NESTED.search(name)) for name in names)
        tmp = shard.with_name(shard.name + ".tmp")
        save_file(tensors, tmp, metadata=metadata)
        tmp.replace(shard)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {flat_name(name, k): file for name, file in data["weight_map"].items()}
        tmp = index.with_name(index.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(index)
    return renamed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hires_hf.conversion.legacy FOLDER", file=sys.stderr)
        return 2
    try:
        count = rename_nested_layers(args[0])
    except HiResUserError as error:
        print(f"hires_hf.conversion.legacy: error: {error}", file=sys.stderr)
        return 2
    print(f"{args[0]}: {count} tensors renamed to the flat layer names" if count else f"{args[0]}: nothing to rename")
    return 0


if __name__ == "__main__":
    sys.exit(main())
