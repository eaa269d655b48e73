"""The measurement loop (`hires_hf.training.loop`): the package's recipe, reproducible batches, honest timings."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from transformers import AutoModelForCausalLM

from hires_hf import HiResConfig
from hires_hf.training import (
    PackedDataset,
    TrainSettings,
    build_tokenizer,
    encode_documents,
    load_default_corpus,
    pack,
    special_token_ids,
    train_model,
)
from hires_hf.training.loop import (
    MIN_LR_RATE,
    LoopSettings,
    batch_order,
    build_optimizer,
    evaluate,
    time_train_step,
    train_loop,
    warmup_steps,
)

VOCAB = 300


@pytest.fixture(scope="module")
def blocks():
    corpus = load_default_corpus(max_chars=120_000)
    tokenizer = build_tokenizer(corpus.train, vocab_size=VOCAB, sample_chars=60_000)
    train = pack(encode_documents(tokenizer, corpus.train), 32, tokenizer.eos_token_id)
    valid = pack(encode_documents(tokenizer, corpus.validation), 32, tokenizer.eos_token_id)[:8]
    return train, valid, special_token_ids(tokenizer)


def tiny(special, **fields) -> HiResConfig:
    return HiResConfig.from_preset("tiny", vocab_size=VOCAB, **special, **fields)


def _learning_rates_applied(run) -> list[float]:
    """The learning rate of every optimizer step `run()` takes, read where AdamW applies it."""
    seen: list[float] = []
    hook = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(optimizer.param_groups[0]["lr"])
    )
    try:
        run()
    finally:
        hook.remove()
    return seen


def test_the_loop_and_the_trainer_follow_one_learning_rate_curve(blocks, tmp_path):
    train, valid, special = blocks
    steps, peak = 40, 3e-3
    model = AutoModelForCausalLM.from_config(tiny(special))
    loop = LoopSettings(steps=steps, batch_size=2, learning_rate=peak, evaluations=1, eval_batch_size=8)
    from_loop = _learning_rates_applied(lambda: train_loop(model, train, valid[:2], loop))
    tokenizer = build_tokenizer(["def f(x):\n    return x\n"] * 50, vocab_size=VOCAB, sample_chars=10_000)
    settings = TrainSettings(max_steps=steps, batch_size=2, learning_rate=peak, save_model=False, progress=False)
    from_trainer = _learning_rates_applied(
        lambda: train_model(
            tiny(special), tokenizer, PackedDataset(train), PackedDataset(valid[:2]), settings, output_dir=tmp_path
        )
    )
    assert len(from_loop) == len(from_trainer) == steps
    assert from_loop == pytest.approx(from_trainer, rel=1e-9, abs=1e-12)
    assert from_loop[0] == 0.0 and max(from_loop) == pytest.approx(peak)  # warmup from zero to the peak
    assert from_loop[-1] == pytest.approx(peak * MIN_LR_RATE, rel=0.02)  # cosine down to its floor
    assert all(a >= b for a, b in itertools.pairwise(from_loop[warmup_steps(steps) :]))


def test_batch_order_is_fixed_by_the_seed_and_a_shorter_run_sees_a_prefix():
    long, short = batch_order(50, 20, 8, seed=3), batch_order(50, 5, 8, seed=3)
    assert torch.equal(long[:5], short)
    assert not torch.equal(batch_order(50, 5, 8, seed=4), short)
    first_epoch = long.flatten()[:50]
    assert sorted(first_epoch.tolist()) == list(range(50))  # epochs: every block once before any repeats


def test_optimizer_decays_matrices_and_embeddings_not_norms():
    model = AutoModelForCausalLM.from_config(HiResConfig.from_preset("tiny"))
    decayed, plain = build_optimizer(model, LoopSettings(steps=1, batch_size=1, learning_rate=1e-3)).param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {p.ndim for p in decayed["params"]} == {2} and {p.ndim for p in plain["params"]} == {1}
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_loop_lowers_validation_loss_and_reports_what_it_did(blocks):
    train, valid, special = blocks
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(special))
    settings = LoopSettings(steps=30, batch_size=8, learning_rate=3e-3, evaluations=3)
    seen = []
    result = train_loop(model, train, valid, settings, on_step=seen.append)
    assert seen == list(range(30))
    assert [step for step, _ in result.curve] == [0, 10, 20, 30]
    assert result.curve[-1][1] < result.curve[0][1] - 0.5
    assert result.final_loss == pytest.approx(evaluate(model, valid, 16))
    assert result.tokens == 30 * 8 * 32 and len(result.train_losses) == 30


def test_evaluation_scores_an_moe_model_on_its_language_modelling_loss_alone(blocks):
    _, valid, special = blocks
    model = AutoModelForCausalLM.from_config(
        HiResConfig.from_preset("tiny-moe", vocab_size=VOCAB, output_router_logits=True, **special)
    )
    with torch.no_grad():
        with_router = model(input_ids=valid, labels=valid).loss.item()  # LM + coef * (aux + z)
        lm_only = model(input_ids=valid, labels=valid, output_router_logits=False).loss.item()
    assert with_router > lm_only
    assert evaluate(model, valid, batch_size=len(valid)) == pytest.approx(lm_only, rel=1e-5)


def test_step_timing_is_seconds_per_step_after_the_warm_up(monkeypatch):
    """A clock that ticks one second per optimizer step: the warm-up step must not count, and the window divides
    by the timed steps (wall-clock comparisons between sizes belong to the benchmarks, not here)."""
    from hires_hf.training import loop

    clock = [0.0]
    real_build = loop.build_optimizer

    def ticking_optimizer(model, settings):
        optimizer = real_build(model, settings)
        real_step = optimizer.step

        def step(*args, **kwargs):
            clock[0] += 1.0
            return real_step(*args, **kwargs)

        optimizer.step = step
        return optimizer

    monkeypatch.setattr(loop, "build_optimizer", ticking_optimizer)
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    assert time_train_step(HiResConfig.from_preset("tiny"), 2, 16, steps=3) == pytest.approx(1.0)
    assert clock[0] == 4.0  # one warm-up step and three timed ones


KILLED_RUN = """
import os, signal, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
from hires_hf import HiResConfig
from hires_hf.training.loop import LoopSettings, train_loop
torch.set_num_threads(1)
train, valid = torch.load(sys.argv[1], weights_only=True).values()
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(HiResConfig.from_preset("tiny", vocab_size=300, pad_token_id=0))
settings = LoopSettings(steps=12, batch_size=4, learning_rate=3e-3, evaluations=4, precision="fp32")
def kill(step):
    if step == 6:  # after the checkpoint of step 7: SIGKILL, no clean-up of any kind
        os.kill(os.getpid(), signal.SIGKILL)
train_loop(model, train, valid, settings, on_step=kill, checkpoint=Path(sys.argv[2]), checkpoint_seconds=0)
"""


def test_a_killed_run_resumes_to_the_uninterrupted_result(blocks, tmp_path):
    """SIGKILL half-way through, then the same call again: the same curve, losses and weights as one run."""
    import subprocess
    import sys

    train, valid, _ = blocks
    data = tmp_path / "blocks.pt"
    torch.save({"train": train, "valid": valid[:4]}, data)
    checkpoint = tmp_path / "run" / "checkpoint.safetensors"
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, str(data), str(checkpoint)], check=False)
    assert killed.returncode == -9 and checkpoint.exists()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the killed process: the same kernels, the same sums
    settings = LoopSettings(steps=12, batch_size=4, learning_rate=3e-3, evaluations=4, precision="fp32")
    results, weights = [], []
    try:
        for path in (checkpoint, None):  # resumed from step 7, then uninterrupted
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(HiResConfig.from_preset("tiny", vocab_size=300, pad_token_id=0))
            results.append(train_loop(model, train, valid[:4], settings, checkpoint=path, checkpoint_seconds=1e9))
            weights.append(model.state_dict())
    finally:
        torch.set_num_threads(threads)
    resumed, uninterrupted = results
    assert resumed.curve == uninterrupted.curve and len(resumed.curve) == 5
    assert resumed.train_losses == uninterrupted.train_losses and len(resumed.train_losses) == 12
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[1])


def test_precision_auto_is_bf16_exactly_where_bf16_matmuls_are_native():
    from hires_hf.training.loop import bf16_matmul_hardware, resolve_precision, should_compile

    cpu = torch.device("cpu")
    assert resolve_precision(cpu, "auto") == ("bf16" if bf16_matmul_hardware("cpu") else "fp32")
    assert resolve_precision(cpu, "fp32") == "fp32" and resolve_precision(cpu, "bf16") == "bf16"
    with pytest.raises(ValueError, match="precision"):
        resolve_precision(cpu, "fp16")
    assert not should_compile(1e12, cpu) and should_compile(1e15, cpu)
    assert should_compile(1.0, cpu, "on") and not should_compile(1e18, cpu, "off")


def test_a_compiled_run_trains_the_forward_its_model_has_after_another_model_in_the_process(blocks):
    # the control's embedding scale is a forward hook; a compiled plain twin trained first must not lend it its graph
    from hires_hf.twins import scale_twin_embedding, vanilla_config

    train, valid, special = blocks
    config = vanilla_config(tiny(special))
    settings = LoopSettings(steps=1, batch_size=4, learning_rate=1e-3, precision="fp32", compile=True)
    torch.manual_seed(0)
    train_loop(AutoModelForCausalLM.from_config(config), train, valid, settings)
    torch.manual_seed(0)
    control = AutoModelForCausalLM.from_config(config)
    scale_twin_embedding(control, 50.0)
    batch = train[batch_order(train.shape[0], 1, 4, settings.seed)[0]]
    with torch.no_grad():
        eager = control(input_ids=batch, labels=batch).loss.item()
    trained = train_loop(control, train, valid, settings).train_losses[0][1]
    assert trained == pytest.approx(eager, abs=1e-4)
