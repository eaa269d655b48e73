"""One rank of the multi-process tests (tests/training/test_distributed.py), started by torchrun on CPU with gloo.

Runs every requested case in one launch (process start and imports cost ~10 s a launch): a case loads a saved
tiny model with `from_pretrained(..., distributed_config=DistributedConfig(...))`, then either computes the logits
of the shared batch or takes one AdamW step on it, and writes what it got (full tensors, gathered from the shards)
to `<out>/<case>-rank<r>.pt`. Data-parallel modes give each rank its own half of the batch, as a real run would;
tensor parallelism gives both ranks the whole batch. The test compares everything with the single-process model.

    torchrun --nproc_per_node 2 tests/training/distributed_worker.py MODELS_DIR OUT_DIR CASE [CASE ...]

A case is `<mode>:<preset>` (forward logits) or `<mode>-step:<preset>` (one optimizer step); modes are the keys of
MODES. `pp` records the refusal message instead of results.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

# The opt-in override of docs/distributed.md: the HiRes projections split over the tensor-parallel ranks too.
SHARDED_PROJECTIONS = {
    "model.blocks.*.read_proj": "colwise_gather_output",
    "model.blocks.*.write_proj": "colwise_gather_output",
    "model.read_out": "colwise_gather_output",
}
# DistributedConfig keyword arguments of each mode, and whether its ranks split the batch (data parallelism).
MODES: dict[str, tuple[dict[str, Any], bool]] = {
    "tp": ({"tp_plan": "auto"}, False),
    "tp-sharded-projections": ({"tp_plan": SHARDED_PROJECTIONS}, False),
    "fsdp": ({"fsdp_size": 2}, True),
    "hsdp": ({"fsdp_size": 1, "dp_replicate_size": 2}, True),
    "fsdp-ep": ({"fsdp_size": 2, "ep_size": 2}, True),
    "pp": ({"pp_size": 2}, False),
}
LEARNING_RATE = 1e-3  # one AdamW step (betas 0.9 / 0.95, weight decay 0.1: the project's training defaults)
BATCH_ROWS = 4


def rank_batch(input_ids: torch.Tensor, rank: int, world: int, data_parallel: bool) -> torch.Tensor:
    """The rows this rank sees: its share under data parallelism, all of them under tensor parallelism."""
    if not data_parallel:
        return input_ids
    rows = input_ids.shape[0] // world
    return input_ids[rank * rows : (rank + 1) * rows]


def one_step(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.optim.Optimizer]:
    """Loss on `input_ids` (next-token, labels = inputs), backward, one AdamW step; returns the loss."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.1, foreach=False
    )
    model.train()
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a whole tensor (DTensor shards gathered: every rank must call this)."""
    from torch.distributed.tensor import DTensor

    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
        for name, value in model.state_dict().items()
    }


def split_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters this rank holds only a part of (DTensors with a Shard placement)."""
    from torch.distributed.tensor import DTensor, Shard

    return [
        name
        for name, value in model.named_parameters()
        if isinstance(value, DTensor) and any(isinstance(p, Shard) for p in value.placements)
    ]


def fsdp_units(model: torch.nn.Module) -> list[str]:
    """Names of the modules FSDP2 gathers as one unit."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]


def run_case(case: str, models: Path, out: Path, input_ids: torch.Tensor) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    import hires_hf  # noqa: F401  (registers the HiRes Auto classes)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mode, _, preset = case.partition(":")
    step = mode.endswith("-step")
    kwargs, data_parallel = MODES[mode.removesuffix("-step")]
    result: dict[str, Any] = {}
    try:
        model = AutoModelForCausalLM.from_pretrained(models / preset, distributed_config=DistributedConfig(**kwargs))
    except ValueError as error:
        result["error"] = str(error)
    else:
        ids = rank_batch(input_ids, rank, world, data_parallel)
        if step:
            loss = one_step(model, ids)
            if data_parallel:  # the mean over ranks of equal-sized halves is the whole batch's mean
                torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.AVG)
            result["loss"] = loss
            result["params"] = full_state(model)
        else:
            with torch.no_grad():
                result["logits"] = model(input_ids=ids).logits.detach().clone()
            result["split"] = split_parameters(model)
            result["fsdp_units"] = fsdp_units(model)
    torch.save(result, out / f"{case}-rank{rank}.pt")
    torch.distributed.barrier()


def main(argv: list[str]) -> int:
    models, out, *cases = argv
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    input_ids = torch.load(Path(models) / "batch.pt", weights_only=True)
    for case in cases:
        run_case(case, Path(models), Path(out), input_ids)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
