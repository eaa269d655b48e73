"""Training HiRes: data (embedded stdlib corpus, local files), tokenizers, HF Trainer wiring, the training loop.

The Python API other parts reuse (e.g. the experiments in `hires_hf.experiments`: the demo, compare, the ladder):

    corpus = load_default_corpus(max_chars=2_000_000)
    tokenizer = build_tokenizer(corpus.train, vocab_size=512)
    train = PackedDataset(pack(encode_documents(tokenizer, corpus.train), 128, tokenizer.eos_token_id))
    result = train_model(config, tokenizer, train, eval_data, TrainSettings(max_steps=200), output_dir="runs/x")
    result.final_eval_loss, result.flops, result.eval_curve()
"""

from ..accounting import train_flops_per_token
from .data import (
    Corpus,
    PackedDataset,
    load_default_corpus,
    load_hub_dataset,
    load_python_sources,
    load_text_files,
    pack,
)
from .loop import LoopResult, LoopSettings, pick_device, time_train_step, train_loop
from .tokenizer import (
    build_tokenizer,
    check_vocab,
    encode_documents,
    load_tokenizer,
    save_tokenizer,
    special_token_ids,
)
from .trainer import HiResTrainer, TrainResult, TrainSettings, train_model

__all__ = [
    "Corpus",
    "HiResTrainer",
    "LoopResult",
    "LoopSettings",
    "PackedDataset",
    "TrainResult",
    "TrainSettings",
    "build_tokenizer",
    "check_vocab",
    "encode_documents",
    "load_default_corpus",
    "load_hub_dataset",
    "load_python_sources",
    "load_text_files",
    "load_tokenizer",
    "pack",
    "pick_device",
    "save_tokenizer",
    "special_token_ids",
    "time_train_step",
    "train_flops_per_token",
    "train_loop",
    "train_model",
]
