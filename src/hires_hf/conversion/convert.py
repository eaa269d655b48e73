"""Convert a vanilla Llama / Mistral / Qwen2 / Qwen3 / OLMoE checkpoint into a HiRes model folder.

The conversion is streamed: source shards are memory-mapped and released once no pending tensor needs them,
and output tensors go to bounded safetensors shards, so peak memory stays near one input plus one output shard
rather than the whole model. Everything is written into a temporary folder next to DST, checked (source and
result on the same random ids), and only then renamed to DST: a failed conversion leaves nothing behind.

With `exact=True` the result computes the source's function (docs/architecture.md, exact equivalence:
identity read / write / read-out, `write_mode="delta"`, `outer_norm=False`, zero-padded embedding). Without it
the HiRes defaults are used (`write_mode="output"`, outer PostNorm on) with the same identity projections as a
warm start for training.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..configuration_hires import HUB_AUTO_MAP, HiResConfig
from ..errors import HiResUserError, first_line
from ..io import staged_folder
from ..twins import hires_layer_fields
from .keymaps import IGNORED_SOURCE_SUFFIXES, KEY_MAPS, Rule

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
# Non-weight files of a model folder that belong to the converted model unchanged.
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
SAMPLE_TEXT = (
    "The residual stream of a transformer carries what every layer has computed so far. "
    "Widening it between blocks lets later layers read more than the width of one layer."
)


class ConversionCheckError(HiResUserError):
    """The converted model does not compute what the source computes (within tolerance)."""


@dataclass
class ConversionReport:
    """What a conversion wrote and what its closing check measured."""

    destination: Path
    config: HiResConfig
    num_tensors: int
    num_shards: int
    max_abs_logit_diff: float | None = None
    tolerance: float | None = None
    source_loss: float | None = None
    hires_loss: float | None = None
    loss_sample: str | None = None  # what the two losses were measured on (text, or random ids and why)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- source config
def resolve_source(src: str | os.PathLike) -> Path:
    """A local folder as is; otherwise a Hub id, downloaded (config, weights, tokenizer) when online."""
    path = Path(src)
    if path.is_dir():
        return path
    if path.exists():
        raise HiResUserError(f"SRC {src} is a file; pass the model folder that holds config.json and the weights.")
    if str(src).count("/") != 1 or str(src).startswith((".", "/")):
        raise HiResUserError(f"SRC {src} does not exist; pass a local model folder or a Hub id (owner/name).")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(src), allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as error:  # offline, unknown repo, no access: all one answer for the user
        raise HiResUserError(
            f"SRC {src} is not a local folder and could not be fetched from the Hub ({type(error).__name__}); "
            "download it first (huggingface-cli download) and pass the folder."
        ) from error


def read_source_config(folder: Path) -> tuple[str, Any]:
    """(model_type, the transformers config) of a supported family; a clear refusal for anything else."""
    path = folder / "config.json"
    if not path.is_file():
        raise HiResUserError(f"{folder} has no config.json; SRC must be a transformers model folder.")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise HiResUserError(f"{path} is not valid JSON ({error}).") from error
    model_type = raw.get("model_type")
    if model_type not in KEY_MAPS:
        architecture = (raw.get("architectures") or [model_type])[0]
        raise HiResUserError(
            f"unsupported architecture {architecture} (model_type={model_type!r}); "
            f"hires-hf convert supports model types: {', '.join(KEY_MAPS)}."
        )
    if raw.get("quantization_config"):
        raise HiResUserError(f"{folder} is a quantized checkpoint; convert the full-precision weights instead.")
    from transformers import AutoConfig

    return model_type, AutoConfig.from_pretrained(folder)


def hires_config(
    source: Any,
    residual_size: int,
    layers_per_block: int,
    exact: bool,
    dtype: str,
    max_position_embeddings: int | None = None,
) -> HiResConfig:
    """The HiRes config whose layers are exactly the source's layers (or a refusal saying why they cannot be)."""
    d, layers = source.hidden_size, source.num_hidden_layers
    if residual_size < d:
        raise HiResUserError(
            f"--residual-size {residual_size} is smaller than the source's hidden_size {d}; HiRes needs D >= d."
        )
    if layers_per_block < 1 or layers % layers_per_block:
        divisors = [k for k in range(1, layers + 1) if layers % k == 0]
        raise HiResUserError(
            f"--layers-per-block {layers_per_block} does not divide the source's {layers} layers; "
            f"choose one of {divisors}."
        )
    context = max_position_embeddings or source.max_position_embeddings
    _refuse_sliding_window(source, context)
    rope = dict(source.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    _refuse_rope(rope, source)

    fields = hires_layer_fields(source) | dict(
        max_position_embeddings=context,
        rope_parameters=rope,
        # Tying survives only where embedding (V x D) and head (V x d) have one shape.
        tie_word_embeddings=bool(source.tie_word_embeddings) and residual_size == d,
        residual_size=residual_size,
        layers_per_block=layers_per_block,
        projection_init="identity",  # exact: required; warm start: the vanilla stream in the first d coordinates
        write_mode="delta" if exact else "output",
        outer_norm=not exact,
        # The copied embedding already has the source's scale, the one its layers and the identity read expect.
        embedding_multiplier=1.0,
        write_multiplier=1.0,  # the identity write is copied as the identity
        router_z_loss_coef=0.0,  # transformers' OLMoE trains without z-loss: keep the source's training loss
        dtype=dtype,
    )
    return HiResConfig(**fields)


def _refuse_sliding_window(source: Any, context: int) -> None:
    """HiRes layers attend over the whole context: a window that can bind would change the function."""
    window = getattr(source, "sliding_window", None)
    layer_types = getattr(source, "layer_types", None)
    windowed = window is not None and (layer_types is None or "sliding_attention" in layer_types)
    if windowed and window < context:
        raise HiResUserError(
            f"the source uses sliding-window attention (sliding_window={window}) within its context "
            f"({context} tokens), which HiRes layers cannot hold; pass --max-position-embeddings {window} "
            "to convert it for contexts up to the window."
        )


def _refuse_rope(rope: dict[str, Any], source: Any) -> None:
    rope_type = rope.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise HiResUserError(
            f"rope_type {rope_type!r} is not supported by HiRes layers; supported: {', '.join(SUPPORTED_ROPE_TYPES)}."
        )
    partial = rope.get("partial_rotary_factor", getattr(source, "partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise HiResUserError(f"partial_rotary_factor={partial}: HiRes layers rotate the whole head; not supported.")


# ---------------------------------------------------------------------------------------------- source weights
class SourceCheckpoint:
    """The source's tensors by name, across shards, each shard opened lazily and memory-mapped.

    `expect(keys)` announces every read to come; `release(key)` marks one read done, and a shard is closed
    (unmapped) once no announced read of it is left.
    """

    def __init__(self, folder: Path) -> None:
        self.key_to_file = _weight_map(folder)
        self.files = sorted(set(self.key_to_file.values()))
        self._pending: Counter[Path] = Counter()
        self._open: dict[Path, Any] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        for path in self.files:
            self._read_header(path)

    def _read_header(self, path: Path) -> None:
        """Shapes and dtypes of every tensor; a truncated or corrupt file fails here, before anything is written."""
        handle = self._handle(path)
        keys = set(handle.keys())
        missing = [k for k, p in self.key_to_file.items() if p == path and k not in keys]
        if missing:
            raise HiResUserError(f"{path} lacks {missing[0]} that the index lists; the checkpoint is incomplete.")
        for key in keys & {k for k, p in self.key_to_file.items() if p == path}:
            if isinstance(handle, dict):
                self.shapes[key], self.dtypes[key] = tuple(handle[key].shape), handle[key].dtype
            else:
                self.shapes[key] = tuple(handle.get_slice(key).get_shape())
                self.dtypes[key] = _SAFETENSORS_DTYPES[handle.get_slice(key).get_dtype()]
        self._close(path)

    def _handle(self, path: Path) -> Any:
        if path not in self._open:
            self._open[path] = _open_shard(path)
        return self._open[path]

    def _close(self, path: Path) -> None:
        self._open.pop(path, None)  # dropping the last reference unmaps the file

    def __contains__(self, key: str) -> bool:
        return key in self.key_to_file

    def get(self, key: str) -> torch.Tensor:
        handle = self._handle(self.key_to_file[key])
        return handle[key] if isinstance(handle, dict) else handle.get_tensor(key)

    def expect(self, keys: list[str]) -> None:
        self._pending.update(self.key_to_file[key] for key in keys)

    def release(self, key: str) -> None:
        path = self.key_to_file[key]
        self._pending[path] -= 1
        if self._pending[path] == 0:
            self._close(path)

    def file_rank(self, key: str) -> int:
        return self.files.index(self.key_to_file[key])


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _weight_map(folder: Path) -> dict[str, Path]:
    """key -> shard path, from the index if there is one; safetensors first, then PyTorch .bin."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as error:
                raise HiResUserError(f"{index} is not a valid shard index ({error}).") from error
            for name in set(weight_map.values()):
                if not (folder / name).is_file():
                    raise HiResUserError(f"{index} lists {name}, which is missing from {folder}.")
            return {key: folder / name for key, name in weight_map.items()}
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (folder / single).is_file():
            return {key: folder / single for key in _open_shard(folder / single).keys()}
    raise HiResUserError(f"{folder} holds no model.safetensors(.index.json) or pytorch_model.bin weights.")


def _open_shard(path: Path) -> Any:
    """A memory-mapped view of one shard: safetensors as is, .bin only through the safe unpickler."""
    if path.suffix == ".safetensors":
        try:
            return safe_open(path, framework="pt")
        except (SafetensorError, OSError) as error:
            raise HiResUserError(
                f"{path} is not a readable safetensors file ({error}); it may be truncated or corrupt, "
                "download it again."
            ) from error
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # the safe unpickler refusing a global, or a damaged zip archive
        raise HiResUserError(
            f"{path} could not be read with torch.load(weights_only=True) ({type(error).__name__}); hires-hf never "
            "unpickles arbitrary objects: convert the weights to safetensors with a tool you trust, then retry."
        ) from error


# ---------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Step:
    """One output tensor: its key, shape, transform and the source keys it reads (grouped per expert)."""

    target: str
    shape: tuple[int, ...]
    transform: str
    groups: tuple[tuple[str, ...], ...]

    @property
    def source_keys(self) -> list[str]:
        return [key for group in self.groups for key in group]


def target_shapes(config: HiResConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a HiRes model with this config saves, with its shape (built on the meta device: no memory)."""
    from ..modeling_hires import HiResForCausalLM

    with torch.device("meta"):
        model = HiResForCausalLM(config)
    shapes = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight")  # saved once, as the embedding
    return shapes


def plan(rules: tuple[Rule, ...], config: HiResConfig, checkpoint: SourceCheckpoint, source_tied: bool) -> list[Step]:
    """Expand the rules over blocks, layers and experts; every target covered, every source tensor used."""
    shapes = target_shapes(config)
    experts = max(config.num_experts, 1)
    steps: dict[str, Step] = {}
    for rule in rules:
        if rule.only_if_source_tied and not source_tied:
            continue
        for names in _positions(rule.target, config):
            target = rule.target.format(**names)
            if target not in shapes or target in steps:
                continue
            per_expert = any("{expert}" in source for source in rule.sources)
            groups = tuple(
                tuple(source.format(**names, expert=e) for source in rule.sources)
                for e in (range(experts) if per_expert else [0])
            )
            if all(key in checkpoint for group in groups for key in group):
                steps[target] = Step(target, shapes[target], rule.transform, groups)
    _require_complete(shapes, steps, checkpoint)
    # Source-shard order: a shard is read once and released before the next is touched.
    return sorted(steps.values(), key=lambda s: min((checkpoint.file_rank(k) for k in s.source_keys), default=-1))


def _positions(template: str, config: HiResConfig) -> Iterator[dict[str, int]]:
    """The placeholder values a target template expands over: every layer, every block, or once."""
    if "{layer}" in template:
        yield from (dict(layer=layer) for layer in range(config.num_hidden_layers))
    elif "{block}" in template:
        yield from (dict(block=block) for block in range(config.num_blocks))
    else:
        yield {}


def _require_complete(shapes: dict[str, tuple[int, ...]], steps: dict[str, Step], checkpoint: SourceCheckpoint) -> None:
    missing = sorted(set(shapes) - set(steps))
    if missing:
        raise HiResUserError(
            f"the source checkpoint has no tensor for {missing[0]} (and {len(missing) - 1} more); "
            "is it a complete *ForCausalLM checkpoint of the family its config names?"
        )
    used = {key for step in steps.values() for key in step.source_keys}
    unused = sorted(
        key for key in checkpoint.key_to_file if key not in used and not key.endswith(IGNORED_SOURCE_SUFFIXES)
    )
    if unused:
        raise HiResUserError(
            f"the source tensor {unused[0]} (and {len(unused) - 1} more) has no place in a HiRes model with this "
            "config; converting would drop it."
        )


# ---------------------------------------------------------------------------------------------- transforms
def _copy(groups: list[list[torch.Tensor]], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return groups[0][0]


def _pad_columns(groups: list[list[torch.Tensor]], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """(V, d) -> (V, D): the vanilla embedding in the first d coordinates of the wide stream, zeros after."""
    source = groups[0][0]
    wide = torch.zeros(shape, dtype=source.dtype)
    wide[:, : source.shape[1]] = source
    return wide


def _stack_experts(groups: list[list[torch.Tensor]], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """E groups of 2D tensors -> (E, rows, cols); within a group, rows concatenated (gate then up)."""
    return torch.stack([torch.cat(group, dim=0) for group in groups])


def _identity(groups: list[list[torch.Tensor]], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """[I | 0] or [I ; 0]: read or write the first d coordinates of the wide stream."""
    return torch.eye(*shape, dtype=dtype)


def _ones(groups: list[list[torch.Tensor]], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype)


TRANSFORMS: dict[str, Callable[[list[list[torch.Tensor]], tuple[int, ...], torch.dtype], torch.Tensor]] = {
    "copy": _copy,
    "pad_columns": _pad_columns,
    "stack_experts": _stack_experts,
    "identity": _identity,
    "ones": _ones,
}


# ---------------------------------------------------------------------------------------------- output shards
class ShardWriter:
    """Collects tensors until a shard is full, writes it, forgets it; `finish` names the shards and the index."""

    def __init__(self, folder: Path, max_shard_bytes: int) -> None:
        self.folder, self.max_shard_bytes = folder, max_shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.parts: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0

    def add(self, key: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_shard_bytes:
            self.flush()
        self.pending[key] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def flush(self) -> None:
        if not self.pending:
            return
        path = self.folder / f"part-{len(self.parts):05d}.safetensors"
        save_file(self.pending, path, metadata={"format": "pt"})
        self.parts.append((path, sorted(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> int:
        """Rename parts to model-0000i-of-0000N.safetensors and write the index; returns N."""
        self.flush()
        count, weight_map = len(self.parts), {}
        for i, (path, keys) in enumerate(self.parts, start=1):
            name = f"model-{i:05d}-of-{count:05d}.safetensors"
            path.rename(self.folder / name)
            weight_map.update(dict.fromkeys(keys, name))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return count


def write_weights(
    steps: list[Step], checkpoint: SourceCheckpoint, folder: Path, dtype: torch.dtype | None, max_shard_bytes: int
) -> int:
    """Build each output tensor from its sources, assert its shape, stream it into shards; returns the shard count."""
    writer = ShardWriter(folder, max_shard_bytes)
    checkpoint.expect([key for step in steps for key in step.source_keys])
    generated_dtype = dtype or checkpoint.dtypes["model.embed_tokens.weight"]
    for step in tqdm(steps, desc="converting tensors", unit="tensor"):
        groups = [[checkpoint.get(key) for key in group] for group in step.groups]
        tensor = TRANSFORMS[step.transform](groups, step.shape, generated_dtype)
        if tuple(tensor.shape) != step.shape:
            raise HiResUserError(
                f"{step.target}: the source gives shape {tuple(tensor.shape)}, the HiRes config needs {step.shape}; "
                "the checkpoint does not match its config.json."
            )
        writer.add(step.target, tensor if dtype is None else tensor.to(dtype))
        del groups, tensor
        for key in step.source_keys:
            checkpoint.release(key)
    return writer.finish()


# ---------------------------------------------------------------------------------------------- folder
def write_config(config: HiResConfig, folder: Path) -> None:
    """config.json with auto_map, plus the two module files, so the folder also loads as Hub remote code.

    The auto_map is what `HiResForCausalLM.save_pretrained` writes, plus the other registered heads; a config's
    own `save_pretrained` writes only its AutoConfig entry and file.
    """
    config.architectures = ["HiResForCausalLM"]
    config.auto_map = dict(HUB_AUTO_MAP)
    config.save_pretrained(folder)
    package = Path(__file__).resolve().parent.parent  # src/hires_hf: the files `save_pretrained` would copy
    for module in ("configuration_hires.py", "modeling_hires.py"):
        shutil.copyfile(package / module, folder / module)


def copy_side_files(source: Path, folder: Path, config: HiResConfig) -> list[str]:
    """Tokenizer files and generation config come over unchanged; a generation config is made if SRC has none."""
    copied = [name for name in SIDE_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copyfile(source / name, folder / name)
    if "generation_config.json" not in copied:
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(config).save_pretrained(folder)
    return copied


def check_destination(source: Path, destination: Path, force: bool) -> None:
    """DST may be written: not SRC itself, and not an existing path unless --force (checked once, up front)."""
    if destination.resolve() == source.resolve():
        raise HiResUserError("DST is SRC; write the HiRes model to another folder.")
    if destination.exists() and not force:
        raise HiResUserError(f"DST {destination} already exists; pass --force to replace it.")


# ---------------------------------------------------------------------------------------------- the check
@dataclass
class LogitCheck:
    """Source and result on the same ids: the largest logit difference, its scale, and both losses on `sample`."""

    max_abs_diff: float
    max_abs_source_logit: float
    source_loss: float
    hires_loss: float
    sample: str  # what the losses are measured on: text, or random ids (and why)


@torch.no_grad()
def compare_logits(
    source: Path, result: Path, dtype: torch.dtype | None, seq_len: int = 16, seed: int = 0
) -> LogitCheck:
    """Source and result on the same random ids, in float32 from the same stored weights; their losses on a short
    English sample when SRC has a tokenizer that encodes it, on the random ids otherwise."""
    from transformers import AutoModelForCausalLM

    load_dtype = dtype or "auto"
    vanilla = AutoModelForCausalLM.from_pretrained(source, dtype=load_dtype).float().eval()
    hires = AutoModelForCausalLM.from_pretrained(result, dtype=load_dtype).float().eval()
    generator = torch.Generator().manual_seed(seed)
    length = min(seq_len, hires.config.max_position_embeddings)  # the context the HiRes model claims
    ids = torch.randint(0, vanilla.config.vocab_size, (2, length), generator=generator)
    source_logits, hires_logits = vanilla(ids).logits, hires(ids).logits
    context = hires.config.max_position_embeddings
    sample, described = sample_ids(source, vanilla.config.vocab_size, context, fallback=ids)
    return LogitCheck(
        max_abs_diff=(source_logits - hires_logits).abs().max().item(),
        max_abs_source_logit=source_logits.abs().max().item(),
        source_loss=vanilla(sample, labels=sample).loss.item(),
        hires_loss=hires(sample, labels=sample).loss.item(),
        sample=described,
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
TEXT_SAMPLE = "a short English sample"


def sample_ids(source: Path, vocab_size: int, max_length: int, fallback: torch.Tensor) -> tuple[torch.Tensor, str]:
    """SAMPLE_TEXT in SRC's tokenizer (cut to the context), and what it is; `fallback` ids, and why, where SRC has
    no tokenizer, one that does not load, or one whose ids the model cannot take. Losses on random ids sit near
    ln(vocab) and say nothing about text, so the report names which it was."""
    if not any((source / name).is_file() for name in TOKENIZER_FILES):
        return fallback, "random token ids (SRC has no tokenizer)"
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:  # missing or damaged tokenizer files, an unknown tokenizer class
        return fallback, f"random token ids (SRC's tokenizer does not load: {first_line(error)})"
    ids = tokenizer(SAMPLE_TEXT, return_tensors="pt").input_ids[:, :max_length]
    if ids.numel() < 2:
        return fallback, "random token ids (SRC's tokenizer encodes the sample as fewer than 2 tokens)"
    if int(ids.max()) >= vocab_size:
        return fallback, f"random token ids (SRC's tokenizer has ids beyond the model's vocab_size {vocab_size})"
    return ids, TEXT_SAMPLE


# ---------------------------------------------------------------------------------------------- entry point
def parse_size(text: str | int) -> int:
    """'2GB', '500MB', '1.5GiB' or a byte count -> bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?I?B?)\s*", text.upper())
    if not match:
        raise HiResUserError(f"shard size {text!r} is not a size like 2GB, 500MB or 1073741824.")
    number, unit = float(match.group(1)), match.group(2).rstrip("B")
    scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
    return int(number * scale[unit])


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    residual_size: int,
    layers_per_block: int,
    exact: bool = False,
    dtype: str = "auto",
    force: bool = False,
    max_shard_size: str | int = "2GB",
    max_position_embeddings: int | None = None,
    check: bool = True,
    tolerance: float | None = None,
) -> ConversionReport:
    """Convert a vanilla checkpoint folder (or Hub id) into the HiRes model folder `dst`.

    `tolerance` (exact only) bounds max |Δ logits|; by default 1e-4 * max(1, max |source logits|).
    """
    source, destination = resolve_source(src), Path(dst)
    check_destination(source, destination, force)
    if dtype != "auto" and dtype not in DTYPES:
        raise HiResUserError(f"--dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}.")
    model_type, source_config = read_source_config(source)
    checkpoint = SourceCheckpoint(source)
    out_dtype = DTYPES.get(dtype)
    stored = out_dtype or checkpoint.dtypes.get("model.embed_tokens.weight", torch.float32)
    config = hires_config(
        source_config,
        residual_size,
        layers_per_block,
        exact,
        str(stored).removeprefix("torch."),
        max_position_embeddings,
    )
    steps = plan(KEY_MAPS[model_type], config, checkpoint, bool(source_config.tie_word_embeddings))

    with staged_folder(destination) as staging:  # DST appears whole, or not at all
        num_shards = write_weights(steps, checkpoint, staging, out_dtype, parse_size(max_shard_size))
        write_config(config, staging)
        copy_side_files(source, staging, config)
        report = ConversionReport(destination, config, len(steps), num_shards)
        report.notes.append(_mode_note(exact))
        if check:
            _check(report, source, staging, out_dtype, exact, tolerance)
    return report


def _mode_note(exact: bool) -> str:
    if exact:
        return "exact: identity read/write/read-out, write_mode='delta', outer_norm=False: logits equal the source's"
    return (
        "warm start: HiRes defaults (write_mode='output', outer_norm=True, write_norm=True) with identity "
        "read/write/read-out; "
        "the function shifts (outer PostNorm) and recovers with continued training"
    )


def _check(
    report: ConversionReport,
    source: Path,
    staging: Path,
    dtype: torch.dtype | None,
    exact: bool,
    tolerance: float | None,
) -> None:
    check = compare_logits(source, staging, dtype)
    report.max_abs_logit_diff, report.loss_sample = check.max_abs_diff, check.sample
    report.source_loss, report.hires_loss = check.source_loss, check.hires_loss
    if not exact:
        return
    diff = check.max_abs_diff
    report.tolerance = tolerance if tolerance is not None else 1e-4 * max(1.0, check.max_abs_source_logit)
    if not math.isfinite(diff) or diff > report.tolerance:
        raise ConversionCheckError(
            f"exact conversion check failed: max |Δ logits| = {diff:.3g} > tolerance {report.tolerance:.3g}; "
            "nothing was written. Please report this with the source's config.json."
        )


__all__ = [
    "KEY_MAPS",
    "TRANSFORMS",
    "ConversionCheckError",
    "ConversionReport",
    "convert",
    "hires_config",
    "plan",
]
