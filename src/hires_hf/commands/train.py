"""`hires-hf train`: argument parsing, data and tokenizer from the flags; the work is in `hires_hf.training`.

Multi-process: `torchrun --nproc_per_node N -m hires_hf.cli train ...` runs DDP (gloo on CPU). transformers' native
engine shards the model instead: `--fsdp` (FSDP2 over the N processes), `--tp T` (tensor parallelism over T of them,
FSDP2 over the N / T groups with `--fsdp`), `--ep E` (expert parallelism, MoE; with `--fsdp` or `--tp`). See
docs/distributed.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import torch

from ..configuration_hires import PRESETS
from ..diagnostics import DiagnosticsCallback
from ..errors import HiResUserError
from ..io import ensure_writable, staged_folder
from ..loading import load_config, with_overrides
from ..training.data import Corpus, PackedDataset, load_default_corpus, load_hub_dataset, load_text_files
from ..training.prepare import pack_splits
from ..training.tokenizer import build_tokenizer, load_tokenizer, save_tokenizer, special_token_ids
from ..training.trainer import TrainSettings, require_checkpoint, sharding_config, train_model
from . import default, set_threads


def run_train(args: argparse.Namespace) -> int:
    """`hires-hf train`; a run that fails before its first checkpoint leaves no folder it created behind."""
    output_dir = Path(args.output_dir)
    created = [path for path in (output_dir, *output_dir.parents) if not path.exists()]
    try:
        return _train(args)
    except BaseException:
        if created and not any(output_dir.glob("checkpoints/checkpoint-*")):
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost folder this command made
        raise


def _train(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    if args.diagnostics_every is not None and args.diagnostics_every < 1:
        raise HiResUserError(f"--diagnostics-every must be a positive number of steps, got {args.diagnostics_every}.")
    parallel = _parallel_sizes(args, int(os.environ.get("WORLD_SIZE", "1")))
    output_dir = Path(args.output_dir)
    ensure_writable(output_dir)
    if args.resume:
        require_checkpoint(output_dir)  # before reading any data
    config = load_config(args.model)
    pretrained = Path(args.model).is_dir()
    if args.override:
        if pretrained:
            raise HiResUserError("--override changes the architecture; it applies to a preset or a config.json only.")
        config = with_overrides(config, args.override)
    corpus = _load_corpus(args)
    tokenizer = _tokenizer_for(args, config, corpus, output_dir)
    if not pretrained:  # a fresh model names the tokenizer's own special tokens (generation stops on eos)
        config = type(config).from_dict({**config.to_dict(), **special_token_ids(tokenizer)})
    train_blocks, eval_blocks = pack_splits(corpus, tokenizer, args.block_size, args.eval_blocks)
    train_data, eval_data = PackedDataset(train_blocks), PackedDataset(eval_blocks)
    # every N optimizer steps, the wide stream per block on a few validation blocks (`hires-hf inspect`)
    every = args.diagnostics_every
    callbacks = [DiagnosticsCallback(eval_blocks[:8], every=every)] if every else []
    settings = TrainSettings(
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        eval_steps=args.eval_steps,
        save_steps=args.save_steps,
        seed=args.seed,
        resume=args.resume,
        max_seconds=args.max_minutes * 60 if args.max_minutes else None,
        bf16=args.bf16,
        tf32=args.tf32,
        activation_checkpointing=args.activation_checkpointing,
        **parallel,
    )
    result = train_model(
        args.model if pretrained else config,
        tokenizer,
        train_data,
        eval_data,
        settings,
        output_dir=output_dir,
        callbacks=callbacks,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            f"validation loss {result.final_eval_loss:.4f} after {result.tokens_seen:,} tokens "
            f"({result.flops:.3e} counted training FLOPs, {result.tokens_per_second:,.0f} tokens/s); "
            f"model saved to {result.model_dir}"
        )
    return 0


# ------------------------------------------------------------------------------------------------- helpers
def _parallel_sizes(args: argparse.Namespace, world: int) -> dict[str, int | None]:
    """fsdp_size / tp_size / ep_size for TrainSettings from --fsdp, --tp, --ep and the number of processes."""
    tp, ep = args.tp or 1, args.ep or 1
    if tp < 1 or ep < 1:
        raise HiResUserError(f"--tp and --ep must be positive integers, got --tp {tp} --ep {ep}.")
    if world % tp:
        raise HiResUserError(f"--tp {tp} must divide the number of processes ({world}).")
    if tp > 1 and world > tp and not args.fsdp:
        raise HiResUserError(
            f"--tp {tp} on {world} processes: add --fsdp to shard the {world // tp} tensor-parallel groups with FSDP2 "
            "(transformers' engine does not combine tensor parallelism with DDP)."
        )
    if ep > 1 and not (args.fsdp or tp > 1):
        raise HiResUserError(f"--ep {ep} needs --fsdp or --tp: experts are split over the sharded processes.")
    sizes = {"fsdp_size": world // tp if args.fsdp else None, "tp_size": tp if tp > 1 else None}
    sizes["ep_size"] = ep if ep > 1 else None
    sharding_config(**sizes)  # what the engine or the Trainer cannot do fails now, before any data is read
    return sizes


def _load_corpus(args: argparse.Namespace) -> Corpus:
    if args.dataset:
        return load_hub_dataset(args.dataset, args.dataset_config, args.text_field, max_chars=args.max_chars)
    if args.data:
        return load_text_files(args.data, args.validation_data, max_chars=args.max_chars, text_field=args.text_field)
    if args.validation_data:
        raise HiResUserError("--validation-data needs --data (the default corpus has its own validation split).")
    return load_default_corpus(max_chars=args.max_chars)


def _tokenizer_for(args: argparse.Namespace, config, corpus: Corpus, output_dir: Path):
    """--tokenizer, else the model folder's own tokenizer, else a BPE trained on the data (shared by all ranks)."""
    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    if Path(args.model).is_dir() and (Path(args.model) / "tokenizer.json").is_file():
        return load_tokenizer(args.model)
    folder = output_dir / "tokenizer"
    if args.resume and (folder / "tokenizer.json").is_file():
        return load_tokenizer(folder)  # the one the checkpoints were trained with
    vocab_size = args.vocab_size or config.vocab_size
    if _rank() == 0:
        tokenizer = build_tokenizer(corpus.train, vocab_size=vocab_size, sample_chars=args.tokenizer_sample_chars)
        with staged_folder(folder) as staging:
            save_tokenizer(tokenizer, staging, config.max_position_embeddings)
    _barrier()
    return load_tokenizer(folder)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _barrier() -> None:
    """Make other ranks wait for rank 0's tokenizer; sets up the process group the Trainer then reuses."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if not torch.distributed.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.distributed.barrier()


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    presets = ", ".join(sorted(PRESETS))
    train = subparsers.add_parser("train", help="train a HiRes model with the HF Trainer (torchrun for DDP / FSDP2)")
    train.add_argument("--model", default="tiny", help=f"preset ({presets}), config.json, or a model folder")
    train.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE", help="config field")
    data = train.add_argument_group("data (default: the Python standard library's sources, split by file)")
    data.add_argument("--data", nargs="+", help="text / jsonl files or folders")
    data.add_argument("--validation-data", nargs="+", help="validation files (default: a hashed split of --data)")
    data.add_argument("--dataset", help="a `datasets` name (needs the network and the datasets package)")
    data.add_argument("--dataset-config", help="the dataset's configuration name")
    data.add_argument(
        "--text-field",
        default=default(load_hub_dataset, "text_field"),
        help="column holding the text (jsonl and datasets)",
    )
    data.add_argument("--max-chars", type=int, help="read at most this many characters of text")
    data.add_argument("--block-size", type=int, default=128, help="tokens per packed training block")
    data.add_argument("--eval-blocks", type=int, default=128, help="validation blocks used per evaluation")
    tok = train.add_argument_group("tokenizer")
    tok.add_argument("--tokenizer", help="an existing tokenizer folder (default: train a byte-level BPE)")
    tok.add_argument("--vocab-size", type=int, help="BPE vocabulary size (default: the model's vocab_size)")
    tok.add_argument(
        "--tokenizer-sample-chars",
        type=int,
        default=default(build_tokenizer, "sample_chars"),
        help="text the BPE is trained on",
    )
    opt = train.add_argument_group("optimisation")
    opt.add_argument("--max-steps", type=int, default=1000)
    opt.add_argument("--max-minutes", type=float, help="stop (and evaluate) after this much wall clock")
    opt.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="blocks per device per step (default 16: the command's own; TrainSettings has 8)",
    )
    opt.add_argument("--grad-accum", type=int, default=default(TrainSettings, "gradient_accumulation_steps"))
    opt.add_argument("--lr", type=float, default=default(TrainSettings, "learning_rate"))
    opt.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default 5%% of --max-steps)")
    opt.add_argument("--weight-decay", type=float, default=default(TrainSettings, "weight_decay"))
    opt.add_argument("--eval-steps", type=int, help="evaluate every N steps (default: 10 evaluations)")
    opt.add_argument(
        "--save-steps",
        type=int,
        default=default(TrainSettings, "save_steps"),
        help="checkpoint every N steps (0: none)",
    )
    opt.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    opt.add_argument("--seed", type=int, default=default(TrainSettings, "seed"))
    opt.add_argument(
        "--diagnostics-every",
        type=int,
        metavar="N",
        help="every N steps, record the wide stream per block to OUTPUT_DIR/checkpoints/diagnostics.jsonl "
        "(read it with `hires-hf inspect OUTPUT_DIR`)",
    )
    hw = train.add_argument_group("hardware")
    hw.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    hw.add_argument("--tf32", action="store_true", help="TF32 matmuls (Ampere+ GPUs)")
    hw.add_argument("--activation-checkpointing", action="store_true", help="recompute activations in backward")
    hw.add_argument("--fsdp", action="store_true", help="shard with native FSDP2 over the torchrun processes")
    hw.add_argument("--tp", type=int, metavar="T", help="tensor parallelism over T processes (docs/distributed.md)")
    hw.add_argument("--ep", type=int, metavar="E", help="expert parallelism over E processes (MoE; with --fsdp/--tp)")
    hw.add_argument("--threads", type=int, help="torch CPU threads")
    train.add_argument("--output-dir", default="runs/train", help="checkpoints/, model/, train_result.json")
    train.set_defaults(func=run_train)
