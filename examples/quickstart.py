"""A first look at HiRes: build the tiny preset, run it, generate, save and reload it with the Auto classes."""

import tempfile

import torch
from transformers import AutoModelForCausalLM

import hires_hf  # registers the "hires" model type with the Auto classes
from hires_hf.accounting import cost_table


def main() -> None:
    torch.manual_seed(0)
    config = hires_hf.HiResConfig.from_preset("tiny")
    model = AutoModelForCausalLM.from_config(config).eval()
    print(model)
    print(cost_table(config, seq_len=128))

    ids = torch.randint(0, config.vocab_size, (1, 8))
    out = model(ids, labels=ids)
    print(f"\nloss of an untrained model on random ids: {out.loss.item():.3f} (ln V = {torch.tensor(512.0).log():.3f})")
    generated = model.generate(ids, max_new_tokens=8, do_sample=False)
    print("greedy continuation:", generated[0, 8:].tolist())

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            same = torch.equal(model(ids).logits, reloaded(ids).logits)
        print(f"saved to a Hub-ready folder and reloaded: identical logits = {same}")


if __name__ == "__main__":
    main()
