"""The run record and the run store: every trained run carries the settings that made it, and is found by them.

A run's *spec* is everything that decides its result: the arm, every field of the model's config after
derivation (HiRes, or the Llama twin; the control's embedding scale beside it), the recipe (the loop's settings and the
optimiser / schedule constants), the budget, the data (`Data.spec`, down to a hash of the tokens), the precision,
whether the forward was compiled, a fingerprint of the code that builds and trains the model, and the
torch / transformers versions. The fingerprint covers what the rest of the spec cannot see: the source of the
loop's functions, of the model builders and, for a HiRes arm, of the modeling file (for the twins transformers'
version stands for their modeling code). Configs, FLOP counts and data enter through their results (the
resolved config, the steps, the token hash), so an edit elsewhere in the package keeps the store valid.

Its *key* is a hash of the spec: a stored run is reused only when every one of
those is the same, so a changed default, shape rule or data set can never pass an old cell off as new. The git
commit is recorded beside the spec (not in the key, so that a commit that touches no training code keeps the
store valid).

`RunStore(folder)` keeps one JSON file per finished run (`<arm>-lr<lr>-s<seed>-<key>.json`, written whole) and,
while a run trains, its checkpoint under `checkpoints/`: a stopped sweep or ladder picks up where it was. When a run
is stored, the per-step training losses its last checkpoint carried are kept under `traces/` (`RunStore.trace`): eight
evaluations cannot tell a loss spike from a plateau, a step-by-step trace can. Beside a checkpoint,
`checkpoints/<key>.machines.json` notes each machine that (re)started the run and from which step; a run finished by
another machine than the one that began it carries that list in its record (`machine["segments"]`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import platform
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import torch
import transformers

from ..errors import HiResUserError
from ..io import write_json_atomic
from ..training.bf16_emulation import NATIVE, bf16_kernels
from ..training.checkpoint import read_progress
from ..training.loop import bf16_matmul_hardware

PACKAGE = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    """One trained arm at one peak learning rate and seed, with the spec that made it and its key."""

    arm: str
    lr: float
    seed: int
    steps: int
    flops_per_token: float
    final_loss: float
    curve: list[tuple[float, float]]  # (counted training FLOPs, validation loss)
    seconds: float
    tokens_per_second: float
    diverged: bool
    key: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    commit: str | None = None
    machine: dict[str, Any] | None = None  # what it trained on (not in the key): stamped by `RunStore.put`
    stalled: dict[str, Any] | None = None  # ended early, stuck far above its rung's baseline (`experiments.stalls`)

    @property
    def tokens(self) -> float:
        """Training tokens seen: counted FLOPs at the end of the run over FLOPs per token."""
        return self.curve[-1][0] / self.flops_per_token if self.curve else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Run:
        known = {name: row[name] for name in cls.__dataclass_fields__ if name in row}
        known["curve"] = [tuple(point) for point in known.get("curve", [])]
        return cls(**known)


def resolved_config(config: transformers.PreTrainedConfig) -> dict[str, Any]:
    """Every field of `config` with its derived values filled in (a HiRes `to_dict` writes them as None)."""
    values = config.to_dict()
    for name in getattr(config, "_derived_fields", ()):
        values[name] = getattr(config, name)
    values.pop("transformers_version", None)  # in the spec's versions
    return values


@cache
def code_fingerprint(functions: tuple[Callable[..., Any], ...], hires: bool, extra: tuple[str, ...] = ()) -> str:
    """sha256 over the source of `functions` (the loop and the model builders), of modeling_hires.py when the arm
    is HiRes, and of `extra` files (a benchmark's own arm): a change to any of them makes a new run."""
    digest = hashlib.sha256()
    for function in functions:
        digest.update(inspect.getsource(function).encode())
    files = [*([PACKAGE / "modeling_hires.py"] if hires else []), *(Path(name) for name in extra)]
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def arm_source(arm: object) -> tuple[str, ...]:
    """The file defining an arm's class when it is not the harness's own (a benchmark's peer arm)."""
    path = inspect.getsourcefile(type(arm))
    return () if path is None or Path(path).resolve().parent.parent == PACKAGE else (str(Path(path).resolve()),)


_KEYED_AS: list[dict[str, str]] = []  # versions that `keyed_as` puts in place of this machine's


def versions() -> dict[str, str]:
    """The libraries a run trains with (part of its key); those given to `keyed_as` while it is open."""
    if _KEYED_AS:
        return dict(_KEYED_AS[-1])
    return {"torch": torch.__version__, "transformers": transformers.__version__}


@contextmanager
def keyed_as(library_versions: dict[str, str]) -> Iterator[None]:
    """Key runs with another machine's library versions: for reading a folder trained there (a GPU image's torch),
    never for training here."""
    _KEYED_AS.append(dict(library_versions))
    try:
        yield
    finally:
        _KEYED_AS.pop()


def stored_versions(folder: Path) -> dict[str, str]:
    """The library versions most of a run folder's runs were trained with."""
    counts = Counter(json.dumps(run.spec["versions"], sort_keys=True) for run in RunStore(folder).runs())
    if not counts:
        raise HiResUserError(f"{folder} holds no runs to read.")
    return json.loads(counts.most_common(1)[0][0])


def spec_key(spec: dict[str, Any]) -> str:
    """The hash a run is stored and found under."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def machine(spec: dict[str, Any]) -> dict[str, Any]:
    """The processor a run of `spec` trained on and, for a bf16 run, its matrix products' kernels: not part of the
    key (kernels that round alike make the same run), but a reader of its speed or its last digits wants to know."""
    record: dict[str, Any] = {"cpu": cpu_name(), "cpu_bf16_matrix_units": bf16_matmul_hardware("cpu")}
    device = spec.get("device", "cpu")
    if device == "cuda" and torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name()
    if spec.get("recipe", {}).get("precision") == "bf16":
        record["bf16_kernels"] = bf16_kernels() if device == "cpu" else NATIVE
    return record


@cache
def cpu_name() -> str:
    """The CPU's model name as Linux reports it (else what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@cache
def git_commit() -> str | None:
    """The checkout's commit (with "-dirty" when files differ from it), or None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PACKAGE, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=PACKAGE, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty.stdout.strip() else "")


class RunStore:
    """Finished runs as one JSON file each under `folder`, found by key; checkpoints of unfinished ones beside."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._index: dict[str, Path] | None = None

    def _files(self) -> dict[str, Path]:
        if self._index is None:
            self._index = {path.stem.rsplit("-", 1)[-1]: path for path in self.folder.glob("*.json")}
        return self._index

    def refresh(self) -> None:
        """Forget the folder listing: other workers may have added runs since."""
        self._index = None

    def get(self, key: str) -> Run | None:
        """The stored run of this key, or None (as of the last listing of the folder; `refresh` re-lists it)."""
        path = self._files().get(key)
        return Run.from_json(json.loads(path.read_text(encoding="utf-8"))) if path else None

    def put(self, run: Run) -> Path:
        """Store a finished run (stamped with the machine it trained on and, where more than one trained it, which
        trained which steps: `machine["segments"]`), keep its checkpoint's training losses and drop the checkpoint."""
        if run.machine is None:
            run = replace(run, machine=machine(run.spec))
        segments = self.segments(run.key)
        if len({json.dumps(segment["machine"], sort_keys=True) for segment in segments}) > 1:
            run = replace(run, machine={**run.machine, "segments": segments})
        path = self.folder / f"{run.arm}-lr{run.lr:.4g}-s{run.seed}-{run.key}.json"
        write_json_atomic(path, run.to_json())
        self._keep_trace(run.key)
        self.checkpoint(run.key).unlink(missing_ok=True)
        self._machines(run.key).unlink(missing_ok=True)
        self._index = None
        return path

    def started(self, key: str, spec: dict[str, Any]) -> None:
        """Note that the run of `key` (re)starts on this machine at its checkpoint's step, beside the checkpoint: a
        run that spans sessions may be finished by another processor (other kernels, another speed), and its record
        should say which machine trained which steps. A checkpoint begun before this was kept counts as this
        machine's from its first step."""
        progress = read_progress(self.checkpoint(key))
        segments = self.segments(key) if progress else []  # no checkpoint: whoever began it kept no step
        here = machine(spec)
        if not segments or segments[-1]["machine"] != here:
            segments.append({"step": progress["step"] if segments else 0, "machine": here})
            write_json_atomic(self._machines(key), segments)

    def segments(self, key: str) -> list[dict[str, Any]]:
        """The machines that have trained the unfinished run of `key` so far, each from the step it took over at."""
        path = self._machines(key)
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []

    def _machines(self, key: str) -> Path:
        return self.folder / "checkpoints" / f"{key}.machines.json"

    def runs(self) -> list[Run]:
        """Every stored run, in file-name order."""
        return [Run.from_json(json.loads(p.read_text(encoding="utf-8"))) for p in sorted(self._files().values())]

    def checkpoint(self, key: str) -> Path:
        return self.folder / "checkpoints" / f"{key}.safetensors"

    def _keep_trace(self, key: str) -> None:
        """The training loss of every step up to the run's last checkpoint (saved every few minutes, so all but the
        run's last minutes), as `traces/<key>.json`; nothing for a run that never checkpointed."""
        losses = (read_progress(self.checkpoint(key)) or {}).get("train_losses")
        if losses:
            trace = {"key": key, "first_step": int(losses[0][0]), "loss": [round(x, 4) for _, x in losses]}
            write_json_atomic(self.folder / "traces" / f"{key}.json", trace, indent=None)

    def trace(self, key: str) -> list[tuple[int, float]] | None:
        """A stored run's training loss by step (as far as its last checkpoint), or None where none was kept."""
        path = self.folder / "traces" / f"{key}.json"
        if not path.is_file():
            return None
        trace = json.loads(path.read_text(encoding="utf-8"))
        return [(trace["first_step"] + i, loss) for i, loss in enumerate(trace["loss"])]


__all__ = [
    "Run",
    "RunStore",
    "code_fingerprint",
    "git_commit",
    "keyed_as",
    "resolved_config",
    "spec_key",
    "stored_versions",
]
