"""Provenance: what exactly was loaded, so every number in a trace can be traced back to weights."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
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
    tokenizer_class: str = ""           # e.g. "GPT2TokenizerFast"
    tokenizer_source: str = ""          # folder / HF id the tokenizer was loaded from, and its files
    tokenizer_sha256: str = ""          # over vocab + merges + added tokens (tokenizer_sha256), not padding
    tokenizer_is_stock_gpt2: bool | None = None  # same hash as OpenAI's GPT-2 vocab.json/merges.txt

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


def tokenizer_sha256(tok) -> str:
    """sha256 of what maps text to ids, in one canonical form for fast and slow tokenizers: the vocabulary
    in id order, the BPE merges as "a b" lines, the added tokens (id, content, special). Padding side and
    pad token are left out: the loader changes those, the vocabulary stays."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        d = json.loads(backend.to_str())
        model = d.get("model") or {}
        vocab, merges = model.get("vocab") or {}, model.get("merges") or []
        added = [(a["id"], a["content"], bool(a.get("special"))) for a in d.get("added_tokens") or ()]
    else:
        vocab = tok.get_vocab()
        ranks = getattr(tok, "bpe_ranks", None) or {}
        merges = [k for k, _ in sorted(ranks.items(), key=lambda kv: kv[1])]
        added = [(int(i), str(a), bool(getattr(a, "special", False)))
                 for i, a in (getattr(tok, "added_tokens_decoder", None) or {}).items()]
    if isinstance(vocab, list):                       # Unigram: [[piece, score], ...] in id order
        vocab = {str(p[0]): i for i, p in enumerate(vocab)}
    core = {"vocab": [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])],
            "merges": [m if isinstance(m, str) else " ".join(m) for m in merges],
            "added_tokens": sorted(added)}
    return hashlib.sha256(json.dumps(core, ensure_ascii=False).encode()).hexdigest()


def tokenizer_source(tok) -> str:
    """Where the tokenizer came from: its folder (with the files that define it) or HF id."""
    where = str(getattr(tok, "name_or_path", "") or "")
    p = Path(where)
    if where and p.is_dir():
        files = [f for f in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json") if (p / f).is_file()]
        return f"{p.resolve()} ({', '.join(files) or 'no tokenizer files'})"
    return where or "(in memory)"


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # .parameters() already de-duplicates tied weights


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    import transformers

    __version__ = _version("rookworld-debug")    # the installed distribution (not the package: no import upward)

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
