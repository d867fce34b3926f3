"""Provenance: what exactly was loaded, so every number in a trace can be traced back to weights."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

SOURCE_KINDS = ("bundled", "local", "hub", "random")


@dataclass(frozen=True)
class Provenance:
    """Identity of a loaded policy/reference pair (both share weights at load time)."""

    model: str                          # what the user asked for: "tiny", a folder, or an HF id
    resolved: str                       # absolute folder, HF id (+ revision if known), or "random:<config>"
    source: str                         # one of SOURCE_KINDS
    is_random_init: bool                # True = NOT a trained model; every number is about noise
    num_parameters: int                 # unique parameters (tied embeddings counted once)
    dtype: str                          # e.g. "torch.float32"
    device: str
    weights_sha256: str                 # over (name, dtype, shape, bytes) of the state dict, sorted by name
    dropout_original: dict[str, float]  # config dropout values as loaded (GPT-2 default 0.1), before zeroing
    dropout_now: dict[str, float]       # after zeroing (all 0.0)
    model_type: str                     # config.model_type, e.g. "gpt2"
    tokenizer_vocab_size: int           # tokenizer.vocab_size (base vocab, no added tokens)
    tokenizer_len: int                  # len(tokenizer) (with added tokens); should equal the embedding rows
    embedding_rows: int                 # model input-embedding rows
    pad_token_id: int
    eos_token_id: int
    pad_was_missing: bool               # True = pad was set to EOS by the loader
    padding_side: str
    versions: dict[str, str | None]     # torch, transformers, chess, rookworld_debug, python
    git_sha: str | None                 # of the rookworld_debug checkout, None outside a git repo
    git_dirty: bool | None
    timestamp: str                      # ISO-8601 UTC, load time
    notes: tuple[str, ...] = ()         # human-readable caveats (random init, tokenizer fallback, ...)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["notes"] = list(self.notes)
        return d


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over the state dict, sorted by name; a tied tensor is hashed once and later named as an alias.

    Fast enough for 124M params (~0.5 GB, about a second): hashlib works on the raw bytes, no copies on CPU.
    """
    h = hashlib.sha256()
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, t in sorted(model.state_dict().items()):
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if key in seen:  # tied weights (wte / lm_head): same bytes, hash the alias only
            h.update(f"alias:{seen[key]}".encode())
            continue
        seen[key] = name
        flat = t.cpu().contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")
    return h.hexdigest()


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # .parameters() already de-duplicates tied weights


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    import transformers

    from .. import __version__

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "chess": _version("chess"),
        "trl": _version("trl"),
        "rookworld_debug": __version__,
        "python": platform.python_version(),
    }


def git_state(path: Path | None = None) -> tuple[str | None, bool | None]:
    """(HEAD sha, dirty?) of the git checkout holding this package; (None, None) if not a checkout."""
    cwd = str(path or Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip() != ""
        return sha or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
