"""HiRes in an unmodified vLLM (its CPU build, the transformers backend, the folder's own Hub code).

vLLM's greedy tokens equal transformers' for a dense and a MoE HiRes and for the Llama twin (the comparison's own
control), in float32 and bfloat16; the OpenAI-compatible server answers a completion and a chat request with the
same greedy text; bad input is one line. The models are tiny random-init folders made here (no download).
Runs where vLLM is installed (CI's .venv-vllm: README, "Serving with vLLM"); skipped everywhere else.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed here (CI runs this module in .venv-vllm)", allow_module_level=True)

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf.stdlib_corpus import read_utf8, stdlib_sources
from hires_hf.training.tokenizer import build_tokenizer
from hires_hf.twins import vanilla_config
from scripts.vllm_smoke import PROMPTS, OpenAIServer, engine_environment, transformers_greedy

SMOKE = Path(__file__).parents[1] / "scripts" / "vllm_smoke.py"
MAX_TOKENS = 16
# A minimal chat template (the tokenizer is trained here; chat requests need one in the folder).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# head_dim 32: the smallest vLLM's CPU attention serves (the `tiny` preset's 16 it does not).
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    residual_size=128,
    layers_per_block=2,
    max_position_embeddings=256,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, qk_norm="full")
# Random-init models predict almost uniformly: their greedy steps are near-ties (measured: a top-2 gap of 0.004
# where bfloat16 resolves 0.016), and a tie's winner is rounding, not the model. So each model first memorises the
# prompts' continuations (a few seconds of AdamW), as a trained model has preferences, and the fixture checks that
# every greedy step it is tested on is a clear choice (MIN_MARGIN) before vLLM is compared with it.
CONTINUATIONS = (
    "\n        return self._parse_tokens(text.strip().split(), strict=True)\n",
    " jumps over the lazy dog while the cat sleeps in the warm sun all day\n",
    "import json\nimport time\nfrom pathlib import Path\nfrom typing import Any\n",
)
CHAT = (
    [{"role": "user", "content": "Name a prime number."}],
    "Seven is a prime number, and so are two, three and five.",
)
MEMORISE_STEPS = 200
MIN_MARGIN = 0.1  # nats between the greedy token and the runner-up, at every tested step (float32)
FOLDERS = ("dense", "moe", "llama")
DTYPES = ("float32", "bfloat16")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def env(work: Path) -> dict[str, str]:
    return engine_environment(work / "cache")


@pytest.fixture(scope="module")
def folders(work: Path) -> dict[str, Path]:
    """Dense and MoE HiRes and the dense one's Llama twin, each with a byte-level BPE tokenizer and a chat template."""
    texts = [text for path in list(stdlib_sources().values())[:40] if (text := read_utf8(path))]
    tokenizer = build_tokenizer(texts, vocab_size=384, sample_chars=200_000)
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    ids["bos_token_id"] = tokenizer.bos_token_id
    torch.manual_seed(0)
    models = {
        "dense": HiResForCausalLM(HiResConfig(**SHAPE, **ids)),
        "moe": HiResForCausalLM(HiResConfig(**SHAPE, **MOE, **ids)),
        "llama": AutoModelForCausalLM.from_config(vanilla_config(HiResConfig(**SHAPE, **ids))),
    }
    sequences = memorised_sequences(tokenizer)
    paths = {}
    for name, model in models.items():
        memorise(model, sequences)
        margin = min_greedy_margin(model, [ids[:length] for ids, length in sequences])
        assert margin > MIN_MARGIN, f"{name}: a greedy step is a near-tie ({margin:.3f} nats); memorise longer"
        paths[name] = work / name
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    return paths


def memorised_sequences(tokenizer) -> list[tuple[list[int], int]]:
    """(prompt + continuation ids, prompt length) for the smoke script's prompts and the server's chat request."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    pairs = [(encode(prompt), encode(continuation)) for prompt, continuation in zip(PROMPTS, CONTINUATIONS)]
    chat = tokenizer.apply_chat_template(CHAT[0], add_generation_prompt=True, tokenize=True)
    pairs.append((list(chat if isinstance(chat, list) else chat["input_ids"]), encode(CHAT[1])))
    assert all(len(continuation) > MAX_TOKENS for _, continuation in pairs)
    return [(prompt + continuation, len(prompt)) for prompt, continuation in pairs]


def memorise(model: torch.nn.Module, sequences: list[tuple[list[int], int]]) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(MEMORISE_STEPS):
        loss = sum(model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss for ids, _ in sequences)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@torch.no_grad()
def min_greedy_margin(model: torch.nn.Module, prompts: list[list[int]]) -> float:
    """The smallest top-1 minus top-2 logit over the MAX_TOKENS greedy steps of every prompt."""
    margin = float("inf")
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(MAX_TOKENS):
            top = model(torch.tensor([ids])).logits[0, -1].float().topk(2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return margin


def run_smoke(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SMOKE), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def offline(folders: dict[str, Path], env: dict[str, str], work: Path) -> dict[tuple[str, str], dict]:
    """One run of scripts/vllm_smoke.py over every folder and dtype (a fresh process each: vLLM 0.32 builds one
    engine per process), which imports vLLM and transformers, never hires_hf: vLLM loads the Hub code."""
    out = work / "offline.json"
    folder_args = [str(folders["dense"]), str(folders["moe"]), "--control", str(folders["llama"])]
    result = run_smoke(*folder_args, "--dtype", *DTYPES, "--max-tokens", str(MAX_TOKENS), "--json", str(out), env=env)
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    names = {str(path): name for name, path in folders.items()}
    return {(names[report["folder"]], report["dtype"]): report for report in json.loads(out.read_text())}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FOLDERS)
def test_vllm_greedy_tokens_equal_transformers(offline: dict, name: str, dtype: str) -> None:
    """3 prompts x 16 tokens: vLLM (KV cache, its CPU attention) against transformers' full forwards."""
    report = offline[(name, dtype)]
    assert report["total"] == 3 * MAX_TOKENS
    assert report["vllm"] == report["transformers"], report
    assert report["max_logprob_diff"] < (1e-4 if dtype == "float32" else 5e-2)


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_the_hub_code_generates_with_its_cache_at_vllms_transformers_pin(folders: dict[str, Path], name: str) -> None:
    """On the transformers vLLM installs (before 5.24's `cache` rename), `generate` with the KV cache (passed as
    `past_key_values`, returned in that field) gives the tokens full forward passes give (modeling_hires.py, the
    file the folder carries; here the installed package's copy, which transformers prefers)."""
    folder = folders[name]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    prompt = AutoTokenizer.from_pretrained(folder)(PROMPTS[0], add_special_tokens=False)["input_ids"]
    expected, _ = transformers_greedy(folder, [prompt], MAX_TOKENS, "float32")
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, min_new_tokens=0)
    assert out[0, len(prompt) :].tolist() == expected[0]


def _token_ids(tokens: list[str]) -> list[int]:
    """vLLM's `return_tokens_as_token_ids` spells each token 'token_id:N'."""
    return [int(token.removeprefix("token_id:")) for token in tokens]


@pytest.mark.slow
def test_openai_server_answers_a_completion_and_a_chat_with_the_greedy_text(
    folders: dict[str, Path], env: dict[str, str], work: Path
) -> None:
    import openai

    folder = folders["dense"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt, messages = PROMPTS[0], CHAT[0]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    chat_ids = list(chat_ids if isinstance(chat_ids, list) else chat_ids["input_ids"])
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected, _ = transformers_greedy(folder, [prompt_ids, chat_ids], MAX_TOKENS, "float32")
    greedy = dict(temperature=0.0, max_tokens=MAX_TOKENS)
    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}

    server = OpenAIServer(folder, work / "server.log", dtype="float32", env=env)
    with server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        completion = client.completions.create(
            model=str(folder), prompt=prompt, logprobs=1, extra_body=extra, **greedy
        ).choices[0]
        chat = client.chat.completions.create(
            model=str(folder), messages=messages, logprobs=True, extra_body=extra, **greedy
        ).choices[0]
    assert server.process.returncode is not None  # stopped, by its pid
    with pytest.raises(ProcessLookupError):
        os.kill(server.process.pid, 0)

    assert _token_ids(completion.logprobs.tokens) == expected[0]
    assert completion.text == tokenizer.decode(expected[0], skip_special_tokens=True)
    assert _token_ids([entry.token for entry in chat.logprobs.content]) == expected[1]
    assert chat.message.content == tokenizer.decode(expected[1], skip_special_tokens=True)


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("missing", "does not exist"),
        ("not-a-model", "is not a model folder (no config.json)"),
        ("not-hires", "is not a HiRes folder (model_type='llama')"),
    ],
)
def test_bad_input_is_one_line(case: str, fragment: str, folders: dict[str, Path], env, tmp_path: Path) -> None:
    folder = {"missing": tmp_path / "nothing", "not-a-model": tmp_path, "not-hires": folders["llama"]}[case]
    (tmp_path / "README.md").write_text("not a model\n")
    result = run_smoke(str(folder), env=env, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and fragment in result.stderr, result.stderr
