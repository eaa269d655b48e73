"""Stability: does HiRes leave the unigram plateau at the learning rates where its vanilla twin learns?

research harness (to be cleaned)
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from hires_hf import HiResConfig
from hires_hf.training import build_tokenizer, encode_documents, load_default_corpus, pack, special_token_ids
from hires_hf.training.trainer import train_flops_per_token
from hires_hf.twins import vanilla_config

CACHE = Path("/tmp/stab_tokens")


def tokens(vocab: int, block: int, max_chars: int = 12_000_000):
    path = CACHE / f"v{vocab}_b{block}_c{max_chars}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    corpus = load_default_corpus(validation_fraction=0.02, max_chars=max_chars)
    tok = build_tokenizer(corpus.train, vocab_size=vocab, sample_chars=2_000_000)
    eos = tok.eos_token_id
    train = pack(encode_documents(tok, corpus.train), block + 1, eos)
    valid = pack(encode_documents(tok, corpus.validation), block + 1, eos)
    out = {"train": train, "valid": valid, "special": special_token_ids(tok)}
    CACHE.mkdir(exist_ok=True)
    torch.save(out, path)
    return out


def shape(d, layers, k, vocab, block, special, **over):
    return HiResConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=int(8 * d / 3 / 8 + 1) * 8 if d != 512 else 1408,
        num_hidden_layers=layers,
        num_attention_heads=max(1, d // 64),
        max_position_embeddings=block * 2,
        residual_size=2 * d,
        layers_per_block=k,
        **special,
        **over,
    )


@dataclass
class Run:
    arch: str
    lr: float
    steps: int
    losses: list
    evals: list
    diag: list


def lr_at(step, steps, peak, warm=0.05, floor=0.1):
    w = max(1, int(warm * steps))
    if step < w:
        return peak * (step + 1) / w
    p = (step - w) / max(1, steps - w)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def evaluate(model, valid, batch):
    model.eval()
    tot = 0.0
    n = 0
    for i in range(0, valid.shape[0], batch):
        x = valid[i : i + batch]
        tot += model(input_ids=x[:, :-1], labels=x[:, :-1]).loss.item() * x.shape[0]
        n += x.shape[0]
    model.train()
    return tot / n


def apply_tweaks(model, tw):
    base = model.model
    blocks = getattr(base, "blocks", [])
    with torch.no_grad():
        if "embed_std" in tw:
            base.embed_tokens.weight.normal_(0, tw["embed_std"])
        for blk in blocks:
            if "write_std" in tw:
                blk.write_proj.weight.normal_(0, tw["write_std"]) if tw["write_std"] else blk.write_proj.weight.zero_()
            if "read_std" in tw:
                blk.read_proj.weight.normal_(0, tw["read_std"])
            if "outer_gain" in tw and blk.outer_norm is not None:
                blk.outer_norm.weight.fill_(tw["outer_gain"])
        if "read_out_std" in tw:
            base.read_out.weight.normal_(0, tw["read_out_std"])
    if "embed_mult" in tw:
        emb = base.embed_tokens
        mult = tw["embed_mult"]
        with torch.no_grad():
            emb.weight.mul_(tw.get("embed_mult_init", 1.0))
        def efwd(ids, emb=emb, mult=mult):
            return torch.nn.functional.embedding(ids, emb.weight) * mult
        emb.forward = efwd
    if tw.get("write_norm"):
        for blk in blocks:
            lin = blk.write_proj
            def fwd(x, lin=lin):
                x = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
                return torch.nn.functional.linear(x, lin.weight)
            lin.forward = fwd


def lr_mult(name, tw):
    for key in ("embed", "read_proj", "write_proj", "read_out", "outer_norm", "lm_head"):
        if key in name and f"lr_{key}" in tw:
            return tw[f"lr_{key}"]
    return 1.0


def train(config, data, lr, steps, batch, seed=0, eval_every=25, diag_fn=None, diag_every=10, log=True, tweaks=None):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    tw = tweaks or {}
    apply_tweaks(model, tw)
    groups = {}
    for n, p in model.named_parameters():
        key = (p.ndim >= 2, lr_mult(n, tw))
        groups.setdefault(key, []).append(p)
    opt = torch.optim.AdamW(
        [{"params": ps, "weight_decay": 0.1 if dec else 0.0, "mult": m} for (dec, m), ps in groups.items()],
        lr=lr,
        betas=(0.9, 0.95),
    )
    train_blocks = data["train"]
    valid = data["valid"][:64]
    g = torch.Generator().manual_seed(1234)
    losses, evals, diag = [], [], []
    t0 = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr) * group["mult"]
        idx = torch.randint(0, train_blocks.shape[0], (batch,), generator=g)
        x = train_blocks[idx]
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        if diag_fn is not None and (step % diag_every == 0 or step == steps - 1):
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        if diag_fn is not None and (step % diag_every == 0 or step == steps - 1):
            diag.append({"step": step, **diag_fn(model, x, before)})
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % eval_every == 0 or step == steps - 1:
            evals.append((step + 1, evaluate(model, valid, batch)))
            if log:
                print(f"  step {step + 1} loss {loss.item():.3f} val {evals[-1][1]:.3f} gn {gn:.2f} {time.time() - t0:.0f}s", flush=True)
    return model, Run("", lr, steps, losses, evals, diag)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=192)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lrs", type=float, nargs="+", default=[3e-3])
    ap.add_argument("--archs", nargs="+", default=["vanilla", "hires"])
    ap.add_argument("--over", nargs="*", default=[])
    ap.add_argument("--tweaks", default="{}")
    ap.add_argument("--out", default="/tmp/stab_runs.jsonl")
    ap.add_argument("--tag", default="")
    ap.add_argument("--diag", action="store_true")
    ap.add_argument("--diag-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    data = tokens(a.vocab, a.block)
    over = {}
    for item in a.over:
        k, v = item.split("=")
        over[k] = json.loads(v) if v[0] in "0123456789[{tf-" else v
    hires = shape(a.d, a.layers, a.k, a.vocab, a.block, data["special"], **over)
    vf = train_flops_per_token(vanilla_config(hires), a.block)
    for lr in a.lrs:
        for arch in a.archs:
            cfg = hires if arch == "hires" else vanilla_config(hires)
            steps = int(a.steps * vf / train_flops_per_token(cfg, a.block))
            print(f"{arch} lr {lr} steps {steps} {over}", flush=True)
            diag = None
            if a.diag:
                import sys; sys.path.insert(0, "/tmp"); from diag import diag_fn as diag
            _, run = train(cfg, data, lr, steps, a.batch, diag_fn=diag, diag_every=a.diag_every, seed=a.seed,
                           tweaks=json.loads(a.tweaks) if arch == "hires" else {})
            with open(a.out, "a") as f:
                f.write(json.dumps({"tag": a.tag, "arch": arch, "lr": lr, "over": over, "d": a.d, "layers": a.layers,
                                    "k": a.k, "steps": steps, "evals": run.evals, "losses": run.losses, "diag": run.diag, "seed": a.seed, "tweaks": a.tweaks, "batch": a.batch}) + "\n")


if __name__ == "__main__":
    main()
