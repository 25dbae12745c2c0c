"""Where a run keeps its checkpoints, in the layout a Ray Train run writes
(``<storage>/<run name>/checkpoint_epoch_NNNN/state.pt``), ``LocalRun``: the checkpoints and reports of a run
in Train's local mode, which keeps none itself, the state file itself (``save_state``, ``load_state``), and the
weights a run starts from (``load_pretrained``: a fine-tuning's, or a subnet's inherited ones). No
Ray import here (trainers.ray_train.loop holds them); torch is imported where a state file is read or written.
"""
from __future__ import annotations

import io
import logging
import os
import re
from typing import TYPE_CHECKING

from qkvsearch.spaces.errors import reason
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.storage import read_bytes, write_bytes
from qkvsearch.trainers.training.errors import CheckpointError

if TYPE_CHECKING:
    import torch

__all__ = ["STATE_FILE", "STATE_FORMAT", "LocalRun", "checkpoint_dir_name", "epoch_checkpoint", "load_pretrained",
           "load_state", "read_weights", "save_state"]
log = logging.getLogger(__name__)
STATE_FILE = "state.pt"
STATE_FORMAT = 1


def checkpoint_dir_name(epoch: float) -> str:
    return f"checkpoint_epoch_{int(epoch):04d}"


def _checkpoint_dir(run_dir: str, epoch: float) -> str:
    """Where a run (run_dir: <storage>/<run name>, a path or a URI) keeps its checkpoint of `epoch`."""
    return f"{run_dir.rstrip('/')}/{checkpoint_dir_name(epoch)}"


_CHECKPOINT_DIR = re.compile(r"^checkpoint_epoch_(\d+)$")


def epoch_checkpoint(run_dir: str, epoch: float) -> str | None:
    """This run's checkpoint folder of `epoch` where it holds a state file, else None (run_dir:
    <storage>/<run name>, a path or a URI). A resumed run reports its restored epoch again without a
    checkpoint, though the checkpoint it resumed from is that epoch's."""
    from qkvsearch.storage import exists

    path = _checkpoint_dir(run_dir, epoch)
    return path if exists(f"{path}/{STATE_FILE}") else None


class LocalRun:
    """Checkpoints and reports of a run in Train's local mode. There ray.train.report keeps the last metrics
    in memory only (no checkpoint persisted, no callback run, get_checkpoint() None at start), and inside a
    Tune trial ray.train.report, get_context and get_checkpoint raise (use ray.tune's): so none is called.

    Checkpoints go to <run_dir>/checkpoint_epoch_NNNN/state.pt, the folders a TorchTrainer run writes, the
    newest num_to_keep kept; restore() reads the newest. on_report(metrics, checkpoint_path | None) gets
    every epoch (Tune's report, inside a trial).
    """

    def __init__(self, run_dir: str, num_to_keep: int | None, on_report=None):
        self.run_dir, self.num_to_keep, self.on_report = run_dir.rstrip("/"), num_to_keep, on_report

    def _checkpoints(self) -> list[tuple[int, str]]:
        """(epoch, path inside the filesystem) of every checkpoint folder holding a state file, oldest first."""
        import pyarrow.fs as pafs

        from qkvsearch.storage import open_location

        fs, root = open_location(self.run_dir)
        found = []
        for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            m = _CHECKPOINT_DIR.match(info.base_name)
            if m and info.type == pafs.FileType.Directory and \
                    fs.get_file_info(f"{info.path}/{STATE_FILE}").type == pafs.FileType.File:
                found.append((int(m.group(1)), info.path))
        return sorted(found)

    def restore(self) -> dict | None:
        found = self._checkpoints()
        if not found:
            return None
        return load_state(f"{self.run_dir}/{found[-1][1].rsplit('/', 1)[-1]}")

    def report(self, metrics: dict, state_fn) -> None:
        path = None
        if state_fn is not None:
            path = _checkpoint_dir(self.run_dir, metrics[EPOCH])
            save_state(state_fn(), path)
            self._prune()
        if self.on_report is not None:
            self.on_report(metrics, path)

    def _prune(self) -> None:
        if not self.num_to_keep:
            return
        from qkvsearch.storage import open_location

        fs, _ = open_location(self.run_dir)
        for _, old in self._checkpoints()[:-self.num_to_keep]:
            fs.delete_dir(old)


def save_state(state: dict, directory: str) -> str:
    """Write <directory>/state.pt whole (storage.write_bytes: never a partial file); returns the path."""
    import torch

    path = os.path.join(directory, STATE_FILE)
    buf = io.BytesIO()
    torch.save(state, buf)
    write_bytes(path, buf.getbuffer())
    return path


def load_state(directory: str) -> dict:
    """Read <directory>/state.pt (a local folder or a URI, as save_state writes) onto the CPU with
    weights_only=True (tensors and plain types)."""
    import torch

    path = f"{directory.rstrip('/')}/{STATE_FILE}" if "://" in directory else os.path.join(directory, STATE_FILE)
    try:
        data = read_bytes(path)
    except OSError as err:  # FileNotFoundError, or the storage cannot be read
        raise CheckpointError(f"checkpoint {path}: missing or unreadable ({err}); the trial cannot resume from "
                              f"it (remove its folder to resume from the one before)") from err
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (a damaged file fails in many ways inside torch.load)
        raise CheckpointError(f"checkpoint {path}: damaged, torch.load failed ({reason(err)}); remove its "
                              f"folder to resume from the one before") from err
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        given = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {path}: expected checkpoint format {STATE_FORMAT}, given {given!r}")
    return state


def read_weights(path: str) -> dict:
    """The model weights of a checkpoint: a checkpoint folder (its state.pt) or a weights file (.pt, as
    search.campaign.retention keeps them); both hold {"model": state dict, ...}."""
    import torch

    file = path if path.endswith(".pt") else f"{path.rstrip('/')}/{STATE_FILE}"
    state = torch.load(io.BytesIO(read_bytes(file)), map_location="cpu", weights_only=True)
    return state["model"]


def classifier_prefix(model: torch.nn.Module) -> str:
    """The classifier's parameter prefix (timm's pretrained_cfg "classifier", e.g. "head")."""
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    return cfg.get("classifier", "head")


def load_pretrained(model: torch.nn.Module, path: str, keep_head: bool = False) -> list[str]:
    """Load the pretrained weights at ``path`` into ``model`` but its classifier (a new head, as built), or
    with it (``keep_head``: the same task, e.g. a subnet trained on from the weights it inherits). Returns the
    keys left as built: the classifier's, and any whose shape differs (e.g. a position table of another
    input size), which are logged."""
    weights = read_weights(path)
    own = model.state_dict()
    head = classifier_prefix(model) + "."
    keep = {k: v for k, v in weights.items()
            if (keep_head or not k.startswith(head)) and k in own and own[k].shape == v.shape}
    fresh = sorted(k for k in own if k not in keep)
    odd = [k for k in fresh if not k.startswith(head)]
    if odd:
        log.warning("fine-tuning from %s: %d weight(s) of another shape or absent start afresh: %s", path, len(odd),
                    ", ".join(odd[:5]))
    model.load_state_dict(keep, strict=False)
    return fresh
