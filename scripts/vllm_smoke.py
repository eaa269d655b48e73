"""Run a HiRes folder in vLLM's transformers backend and compare its greedy tokens with transformers'.

    python scripts/vllm_smoke.py                 # builds a tiny random HiRes folder first
    python scripts/vllm_smoke.py path/to/folder  # a saved HiRes folder (config.json with auto_map)

vLLM needs CUDA; where CUDA or vLLM is missing the script says so and exits 0, so it can sit in any CI.
Exit 1 means vLLM could not load or run the model, or its next-token choices disagree with transformers'.

vLLM builds its own embedding from `config.embedding_size` (else `hidden_size`); the HiRes embedding is
`residual_size` wide. Until the config names that width itself, the script runs a copy of the folder whose
config.json adds `embedding_size` (pass --no-patch to see the unpatched behaviour).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

PROMPTS = ["def parse(self, text):", "The quick brown fox", "import os\nimport sys\n"]


def why_not_runnable() -> str | None:
    """None when vLLM and a CUDA device are present, else the reason in one line."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install vllm)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def build_tiny_folder(folder: Path) -> Path:
    """A tiny random HiRes model with a byte-level BPE tokenizer trained on this script's own text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from hires_hf import HiResConfig, HiResForCausalLM

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([Path(__file__).read_text(), *PROMPTS], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    config = HiResConfig.from_preset("tiny", vocab_size=len(fast), pad_token_id=0)
    HiResForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def with_embedding_size(folder: Path, work: Path) -> Path:
    """A copy of `folder` whose config.json tells vLLM the embedding width (residual_size)."""
    from transformers import AutoConfig

    config = json.loads((folder / "config.json").read_text())
    # residual_size may be null in the file (derived: 2 * hidden_size); the config class derives it
    wide = AutoConfig.from_pretrained(folder, trust_remote_code=True).residual_size
    if config.get("embedding_size") == wide:
        return folder
    patched = work / "patched"
    shutil.copytree(folder, patched)
    config["embedding_size"] = wide
    tmp = patched / "config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2))
    tmp.replace(patched / "config.json")
    return patched


def transformers_next_tokens(folder: Path, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """Greedy continuations from transformers itself (remote code, as vLLM loads it), in bfloat16 on the GPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16).cuda().eval()
    continuations = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.cuda()
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        continuations.append(out[0, ids.shape[1] :].tolist())
    return continuations


def vllm_outputs(folder: Path, prompts: list[str], max_tokens: int, enforce_eager: bool) -> list:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        model_impl="transformers",
        trust_remote_code=True,
        dtype="bfloat16",
        max_model_len=256,
        gpu_memory_utilization=0.3,
        enforce_eager=enforce_eager,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=5, ignore_eos=True)
    return llm.generate(prompts, params)


def compare(reference: list[list[int]], outputs: list) -> bool:
    """First token: transformers' greedy choice must be among vLLM's top 5 (bf16 ties allowed); the rest is reported."""
    ok = True
    for expected, output in zip(reference, outputs):
        completion = output.outputs[0]
        first_top5 = set(completion.logprobs[0]) if completion.logprobs else set()
        agree = sum(a == b for a, b in zip(expected, completion.token_ids))
        first_ok = expected[0] in first_top5
        ok &= first_ok
        print(
            f"prompt {output.prompt!r}: first token {'ok' if first_ok else 'MISMATCH'}, "
            f"{agree}/{len(expected)} greedy tokens equal to transformers'"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, help="a saved HiRes folder (default: build a tiny one)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--enforce-eager", action="store_true", help="skip vLLM's torch.compile and CUDA graphs")
    parser.add_argument("--no-patch", action="store_true", help="run the folder as is (no embedding_size added)")
    args = parser.parse_args(argv)

    reason = why_not_runnable()
    if reason is not None:
        print(f"vllm_smoke: skipped: {reason}.")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = args.folder or build_tiny_folder(work / "tiny")
        if not args.no_patch:
            folder = with_embedding_size(folder, work)
        reference = transformers_next_tokens(folder, PROMPTS, args.max_tokens)
        try:
            outputs = vllm_outputs(folder, PROMPTS, args.max_tokens, args.enforce_eager)
        except Exception as error:  # report any vLLM failure as the smoke test's result, not a traceback
            print(f"vllm_smoke: FAILED: vLLM could not load or run {folder}: {type(error).__name__}: {error}")
            return 1
        ok = compare(reference, outputs)
    print("vllm_smoke: ok" if ok else "vllm_smoke: FAILED: vLLM's next tokens disagree with transformers'")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
