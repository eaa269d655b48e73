"""Put a HiRes checkpoint on the Hub (`hires-hf publish`) so that anyone loads it with `trust_remote_code=True`.

The folder the Hub receives is assembled from scratch, never copied: the model is loaded and saved again
(sharded safetensors, `config.json` with `auto_map`, the model's own `configuration_hires.py` and
`modeling_hires.py`, `generation_config.json`), its tokenizer is saved next to it, and a model card is
written as README.md. A training folder's optimizer states, pickles and checkpoints therefore never leak.

Everything that can fail cheaply fails first (repo id, offline mode, token, model folder, results file),
before anything is built or uploaded; the upload itself is one commit, retried on transient errors only,
so the repo either holds the new folder or is left as it was.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub import HfApi, get_token
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.utils import validate_repo_id as hub_validate_repo_id
from safetensors import SafetensorError
from transformers import AutoTokenizer

from .configuration_hires import HUB_AUTO_MAP
from .errors import HiResUserError, first_line
from .io import staged_folder, write_json_atomic
from .loading import load_config
from .model_card import build_model_card
from .modeling_hires import HiResForCausalLM
from .training.tokenizer import save_tokenizer

try:  # huggingface_hub >= 2 talks through httpx2, 1.x through httpx
    from httpx2 import TransportError
except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
    from httpx import TransportError

MODULE_FILES = ("configuration_hires.py", "modeling_hires.py")
FIXED_FILES = ("config.json", "generation_config.json", "README.md", *MODULE_FILES)
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
DEFAULT_SHARD_SIZE = "5GB"

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- checks
def validate_repo_id(repo_id: str) -> str:
    """ORG/NAME as the Hub spells it; the namespace is required so that the card's snippet names the real repo."""
    if repo_id.count("/") != 1:
        raise HiResUserError(f"bad repo id {repo_id!r}: give it as ORG/NAME (or USER/NAME), e.g. my-org/hires-tiny.")
    try:
        hub_validate_repo_id(repo_id)
    except HFValidationError as error:
        raise HiResUserError(f"bad repo id {repo_id!r}: {error}") from error
    return repo_id


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as set now (the env var wins over huggingface_hub's value read at import)."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is None:
        return bool(hub_constants.HF_HUB_OFFLINE)
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def resolve_token(token: str | None) -> str:
    """Fail before any Hub client exists: offline mode, or no token given nor stored."""
    if hub_offline():
        raise HiResUserError(
            "the Hub is in offline mode (HF_HUB_OFFLINE is set); unset it to upload, or use --dry-run OUT."
        )
    token = token or get_token()
    if not token:
        raise HiResUserError("no Hugging Face token; run `hf auth login` or set HF_TOKEN to a token with write access.")
    return token


def check_token(api: HfApi, token: str, retry_delay: float = 2.0) -> None:
    """The Hub knows the token and it may write (a read-only token would fail only at the commit)."""
    try:
        identity = with_retries(lambda: api.whoami(token=token), what="checking the token", delay=retry_delay)
    except HfHubHTTPError as error:
        status = _status(error)
        raise HiResUserError(f"the Hub rejected the token ({status}); set HF_TOKEN to a valid token.") from error
    role = identity.get("auth", {}).get("accessToken", {}).get("role")
    if role == "read":
        raise HiResUserError("the Hugging Face token is read-only; use a token with write access.")


# ---------------------------------------------------------------------------------------------- retries
def is_transient(error: BaseException) -> bool:
    """Worth retrying: the connection failed or the Hub said 'busy / try later'; never 4xx mistakes."""
    if isinstance(error, HfHubHTTPError):
        response = getattr(error, "response", None)
        return response is not None and response.status_code in TRANSIENT_STATUS
    return isinstance(error, (TransportError, ConnectionError, TimeoutError))


def with_retries(call: Callable[[], T], *, what: str, attempts: int = 5, delay: float = 2.0) -> T:
    """`call()`, retried with exponential backoff (delay, 2 delay, ...) while it fails transiently."""
    attempt = 1
    while True:
        try:
            return call()
        except Exception as error:
            if not is_transient(error):
                raise
            if attempt == attempts:
                raise HiResUserError(
                    f"the Hub kept failing while {what} ({_describe(error)}) after {attempts} tries; try again later."
                ) from error
            wait = delay * 2 ** (attempt - 1)
            print(f"hires-hf publish: {what}: {_describe(error)}; retrying in {wait:.0f} s", file=sys.stderr)
            time.sleep(wait)
            attempt += 1


def _status(error: HfHubHTTPError) -> str:
    response = getattr(error, "response", None)
    return f"HTTP {response.status_code}" if response is not None else type(error).__name__


def _describe(error: BaseException) -> str:
    return _status(error) if isinstance(error, HfHubHTTPError) else f"{type(error).__name__}: {error}"


# ---------------------------------------------------------------------------------------------- the folder
def build_hub_folder(
    model: str | Path,
    out: str | Path,
    *,
    repo_id: str,
    revision: str | None = None,
    tokenizer: str | Path | None = None,
    license: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    results: str | Path | None = None,
    max_shard_size: str | int = DEFAULT_SHARD_SIZE,
) -> Path:
    """Write exactly the folder the Hub receives to `out` (built in a sibling temp folder, then renamed)."""
    model_dir, out = Path(model), Path(out)
    if not (model_dir / "config.json").is_file():
        raise HiResUserError(f"{model_dir} is not a model folder (no config.json); pass a saved HiRes checkpoint.")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HiResUserError(f"{out} already exists and is not an empty folder; choose a new --dry-run path.")
    config = load_config(str(model_dir))
    card = build_model_card(
        config,
        repo_id,
        revision=revision,
        license=license,
        base_model=base_model,
        datasets=datasets,
        results=results,
        model=model_dir,
    )
    tokenizer_source = _tokenizer_source(model_dir, tokenizer)
    with staged_folder(out) as staging:  # replaces `out` only if it is an empty folder (checked above)
        _save_model(model_dir, staging, max_shard_size)
        _save_tokenizer(tokenizer_source, staging, config.max_position_embeddings)
        _complete_auto_map(staging / "config.json")
        card.save(staging / "README.md")
        _check_hub_folder(staging)
    return out


def _save_model(model_dir: Path, staging: Path, max_shard_size: str | int) -> None:
    """Load and save again: sharded safetensors, config with auto_map, module files, generation config."""
    try:
        with _no_loading_report():  # its findings become the one-line errors below
            model, loading = HiResForCausalLM.from_pretrained(
                model_dir, dtype="auto", output_loading_info=True, ignore_mismatched_sizes=True
            )
    except (OSError, SafetensorError) as error:  # no weights, or a truncated / corrupt shard
        raise HiResUserError(
            f"cannot load the weights in {model_dir} ({first_line(error)}); publish a folder written by "
            "save_pretrained, with all its safetensors shards."
        ) from error
    if loading["mismatched_keys"]:
        key, saved, expected = sorted(loading["mismatched_keys"])[0]
        raise HiResUserError(
            f"{model_dir}: the weights do not match config.json ({key} is {tuple(saved)} in the file, "
            f"{tuple(expected)} by the config); publish the config.json the weights were saved with."
        )
    if loading["missing_keys"]:
        missing = ", ".join(sorted(loading["missing_keys"])[:4])
        raise HiResUserError(
            f"{model_dir} lacks weights of a HiResForCausalLM ({missing}, ...); publish a causal-LM checkpoint."
        )
    if loading["unexpected_keys"]:
        unused = ", ".join(sorted(loading["unexpected_keys"])[:4])
        raise HiResUserError(
            f"{model_dir} holds weights a HiResForCausalLM with its config.json does not use ({unused}, ...); "
            "publishing would drop them: publish the config.json the weights were saved with."
        )
    model.save_pretrained(staging, max_shard_size=max_shard_size)


@contextmanager
def _no_loading_report() -> Iterator[None]:
    """transformers logs a multi-line load report (missing / unexpected / mismatched weights) before returning;
    publish turns each finding into one line instead, so that report alone is held back while it loads."""
    logger = logging.getLogger("transformers.modeling_utils")
    report = _DropLoadReport()
    logger.addFilter(report)
    try:
        yield
    finally:
        logger.removeFilter(report)


class _DropLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()


def _tokenizer_source(model_dir: Path, tokenizer: str | Path | None) -> Path:
    """The tokenizer travels with the model; it must be local (nothing downloads while publishing)."""
    source = Path(tokenizer) if tokenizer is not None else model_dir
    if not (source / "tokenizer_config.json").is_file():
        where = f"--tokenizer {source}" if tokenizer is not None else str(model_dir)
        raise HiResUserError(
            f"no tokenizer in {where} (tokenizer_config.json missing); save one with tokenizer.save_pretrained "
            "there, or pass --tokenizer DIR."
        )
    return source


def _save_tokenizer(source: Path, staging: Path, model_max_length: int) -> None:
    """Load the tokenizer and save it as the model's own (truncating at its context, no loading flags).

    No custom tokenizer code is run or shipped: the folder promises only the model's two module files.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as error:
        raise HiResUserError(
            f"cannot load the tokenizer in {source} ({first_line(error)}); save a tokenizer there with "
            "tokenizer.save_pretrained (tokenizer.json + tokenizer_config.json), or pass --tokenizer DIR."
        ) from error
    save_tokenizer(tokenizer, staging, model_max_length)


def _complete_auto_map(config_path: Path) -> None:
    """Map every Auto class the module files serve, so AutoModel / classification also load remotely."""
    fields: dict[str, Any] = json.loads(config_path.read_text())
    fields["auto_map"] = {**fields.get("auto_map", {}), **HUB_AUTO_MAP}
    write_json_atomic(config_path, fields, sort_keys=True)


def _check_hub_folder(folder: Path) -> None:
    """Guard the promise 'exactly these files': weights as indexed, only our two module files, no pickles."""
    present = {path.name for path in folder.iterdir()}
    problems = []
    if missing := set(FIXED_FILES) - present:
        problems.append(f"missing {sorted(missing)}")
    if extra_code := {name for name in present if name.endswith(".py")} - set(MODULE_FILES):
        problems.append(f"unexpected module files {sorted(extra_code)} (modeling_hires.py must import only its config)")
    if pickles := {name for name in present if name.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))}:
        problems.append(f"pickled files {sorted(pickles)}")
    index = folder / "model.safetensors.index.json"
    weights = {name for name in present if name.endswith(".safetensors")}
    indexed = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    if weights != indexed:
        problems.append(f"weights {sorted(weights)} do not match the shard index {sorted(indexed)}")
    if problems:
        raise HiResUserError(
            f"the Hub folder built from these inputs is not what publish promises ({'; '.join(problems)}); nothing "
            "was written. Publish a HiRes checkpoint and a tokenizer that needs no code of its own."
        )


# ---------------------------------------------------------------------------------------------- upload
def upload_hub_folder(
    api: HfApi,
    folder: Path,
    repo_id: str,
    *,
    token: str,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    retry_delay: float = 2.0,
) -> str:
    """One commit that makes the repo (branch) hold exactly `folder`; returns the commit URL."""
    with_retries(
        lambda: api.create_repo(repo_id, token=token, private=private, repo_type="model", exist_ok=True),
        what="creating the repo",
        delay=retry_delay,
    )
    if revision:
        with_retries(
            lambda: api.create_branch(repo_id, branch=revision, token=token, repo_type="model", exist_ok=True),
            what=f"creating branch {revision}",
            delay=retry_delay,
        )
    commit = with_retries(
        lambda: api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            repo_type="model",
            revision=revision,
            token=token,
            commit_message=commit_message or "Upload HiRes model with hires-hf publish",
            delete_patterns="*",  # stale shards of an earlier upload go in the same commit (.gitattributes stays)
        ),
        what="uploading",
        delay=retry_delay,
    )
    return commit.commit_url


def publish(
    model: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    dry_run: str | Path | None = None,
    results: str | Path | None = None,
    tokenizer: str | Path | None = None,
    license: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    max_shard_size: str | int = DEFAULT_SHARD_SIZE,
    token: str | None = None,
    api: HfApi | None = None,
    retry_delay: float = 2.0,
) -> str:
    """Publish `model` (a saved HiRes folder) to `repo_id`; with `dry_run=OUT` only write the folder there.

    Returns the commit URL, or the dry-run folder's path. Raises HiResUserError, before anything is built
    or uploaded, for a bad repo id, offline mode, a missing or rejected token.
    """
    validate_repo_id(repo_id)
    folder_options = dict(
        repo_id=repo_id,
        revision=revision,
        tokenizer=tokenizer,
        license=license,
        base_model=base_model,
        datasets=datasets,
        results=results,
        max_shard_size=max_shard_size,
    )
    if dry_run is not None:
        return str(build_hub_folder(model, dry_run, **folder_options))
    token = resolve_token(token)
    api = api or HfApi()
    try:
        check_token(api, token, retry_delay)
        with tempfile.TemporaryDirectory(prefix="hires-publish-") as tmp:
            folder = build_hub_folder(model, Path(tmp) / "hub", **folder_options)
            return upload_hub_folder(
                api,
                folder,
                repo_id,
                token=token,
                private=private,
                revision=revision,
                commit_message=commit_message,
                retry_delay=retry_delay,
            )
    except HfHubHTTPError as error:  # permanent Hub refusals (403 namespace, 404 ...): one line, not a trace
        raise HiResUserError(f"the Hub refused the upload to {repo_id} ({_status(error)}): {error}") from error
    except (TransportError, ConnectionError) as error:
        raise HiResUserError(
            f"cannot reach the Hub ({_describe(error)}); check the network or use --dry-run."
        ) from error


__all__ = [
    "build_hub_folder",
    "check_token",
    "is_transient",
    "publish",
    "resolve_token",
    "upload_hub_folder",
    "validate_repo_id",
    "with_retries",
]
