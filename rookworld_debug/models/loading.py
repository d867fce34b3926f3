"""Load a policy and its frozen reference the way the GRPO step needs them.

Fixes two bugs of earlier RookWorld trainers (rookworld-trl) at the source: the RookWorld HF export carries
GPT-2's default dropout 0.1 although the model was trained without dropout, and TRL does not switch
models to eval mode — so we zero every dropout probability in the config AND the modules, put both
models in eval mode, and report the original values.
"""
from __future__ import annotations

import copy
import os
import re
import threading
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..errors import ModelLoadError
from . import provenance as prov
from .custom_code import refuse_custom_code
from .tokenizer import GPT2_EOS_ID, GPT2_TOKENIZER_SHA256, GPT2_VOCAB_SIZE, gpt2_tokenizer

TINY_DIR = Path(__file__).resolve().parent / "tiny"  # the bundled model (trained by lab/train_tiny.py)
# Architecture of the random stand-in used while no bundled model exists.
RANDOM_TINY_CONFIG = dict(n_layer=2, n_head=2, n_embd=64, n_positions=1024)
RANDOM_TINY_SEED = 0
HUB_PROBE_TIMEOUT_S = 2.0
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class RandomInitWarning(UserWarning):
    """The loaded model is randomly initialised: completions are noise, numbers only test plumbing."""


class LoadedModels(NamedTuple):
    policy: Any       # PreTrainedModel, eval mode, dropout 0, trainable
    reference: Any    # separate copy, eval mode, dropout 0, requires_grad False
    tokenizer: Any    # pad = EOS when missing, padding_side "left"
    provenance: prov.Provenance


# ------------------------------------------------------------------------------------------ helpers
# below this size device='auto' keeps a model on the CPU: its GPU step is launch overhead, not arithmetic
AUTO_GPU_MIN_PARAMETERS = 20_000_000


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    d = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(d, torch.dtype):
        raise ModelLoadError(f"unknown dtype {dtype!r} (use e.g. torch.float32 or 'bfloat16')")
    return d


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """Read the env at call time (huggingface_hub reads it once at import, too early for notebooks/tests)."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def probe_hub(endpoint: str | None = None, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None if the hub answers within `timeout` seconds (any status below 500 counts), else the reason.

    Runs in a daemon thread with a hard deadline: urllib's timeout does not cover DNS resolution.
    """
    endpoint = endpoint or hub_endpoint()
    outcome: dict[str, str | None] = {}

    def _probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout)
            outcome["reason"] = None
        except urllib.error.HTTPError as e:  # the server answered; 5xx = a gateway/proxy with no route
            outcome["reason"] = None if e.code < 500 else f"HTTP {e.code} from {endpoint}"
        except Exception as e:  # URLError, timeout, DNS failure, refused...
            outcome["reason"] = f"{type(e).__name__}: {getattr(e, 'reason', e)}"

    t = threading.Thread(target=_probe, daemon=True, name="rookworld-hub-probe")
    t.start()
    t.join(timeout)
    return outcome.get("reason", f"no answer from {endpoint} within {timeout:.0f} s")


def dropout_config(config) -> dict[str, float]:
    """Every numeric config field that is a dropout probability (`*_pdrop`, `*dropout*`)."""
    return {k: float(v) for k, v in sorted(config.to_dict().items())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and ("pdrop" in k or "dropout" in k)}


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero dropout in the config (for code that reads it, e.g. SDPA's dropout_p) and in every module."""
    for k in dropout_config(model.config):
        setattr(model.config, k, 0.0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
    model.eval()


def _random_tiny():
    """A seeded random GPT-2 with the real GPT-2 tokenizer (stand-in until models/tiny/ is trained)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=GPT2_VOCAB_SIZE, bos_token_id=GPT2_EOS_ID, eos_token_id=GPT2_EOS_ID,
                     **RANDOM_TINY_CONFIG)  # dropout left at GPT-2's 0.1 on purpose: the loader must zero it
    with torch.random.fork_rng(devices=[]):  # reproducible weights without touching the caller's RNG
        torch.manual_seed(RANDOM_TINY_SEED)
        model = GPT2LMHeadModel(cfg)
    return model, gpt2_tokenizer()


def _from_pretrained(src: str, dtype: torch.dtype, local_only: bool):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=dtype, local_files_only=local_only, trust_remote_code=False)


def _tokenizer_for(src: str, local_only: bool, model, notes: list[str]):
    from transformers import AutoTokenizer

    error: Exception | None = None
    try:
        tok = AutoTokenizer.from_pretrained(src, local_files_only=local_only, trust_remote_code=False)
        if tok.vocab_size > 1:  # transformers 5 returns an EMPTY GPT2Tokenizer for a folder without vocab files
            return tok
    except (OSError, ValueError) as e:
        error = e
    if model.config.vocab_size != GPT2_VOCAB_SIZE:
        raise ModelLoadError(f"{src}: no tokenizer found and vocab_size {model.config.vocab_size} is "
                             f"not GPT-2's {GPT2_VOCAB_SIZE}; save the tokenizer next to the model") from error
    notes.append(f"no tokenizer in {src}; using the stock GPT-2 tokenizer (vocab sizes match)")
    return gpt2_tokenizer()


def _load_hub(model_id: str, dtype: torch.dtype, notes: list[str]):
    """HF id → (model, tokenizer). Fails fast with ModelLoadError when the hub cannot be reached."""
    offline = hub_offline()
    reason = "HF_HUB_OFFLINE is set" if offline else probe_hub()
    try:
        if reason is None:  # the ordinary online path (downloads or revalidates the cache)
            model = _from_pretrained(model_id, dtype, local_only=False)
            return model, _tokenizer_for(model_id, False, model, notes)
        model = _from_pretrained(model_id, dtype, local_only=True)  # maybe it is in the local HF cache
        notes.append(f"hub not used ({reason}); loaded {model_id} from the local HF cache")
        return model, _tokenizer_for(model_id, True, model, notes)
    except ModelLoadError:
        raise
    except Exception as e:  # OSError, EnvironmentError, HTTP errors, bad repo...
        where = (f"the hub is unreachable ({reason}) and {model_id!r} is not in the local HF cache"
                 if reason else f"from_pretrained({model_id!r}) failed: {type(e).__name__}: {e}")
        raise ModelLoadError(f"cannot load {model_id!r}: {where}. Use a local folder or 'tiny' "
                             f"(the bundled model), or go online.") from e


def _tokenizer_provenance(tok) -> dict[str, Any]:
    sha = prov.tokenizer_sha256(tok)
    stock = sha == GPT2_TOKENIZER_SHA256
    return dict(tokenizer_class=type(tok).__name__, tokenizer_source=prov.tokenizer_source(tok),
                tokenizer_sha256=sha, tokenizer_is_stock_gpt2=stock)


def _resolve(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """(source kind, resolved location) without loading anything."""
    s = str(name_or_path)
    if s == "tiny":
        return ("bundled", str(TINY_DIR)) if (TINY_DIR / "config.json").is_file() else ("random", "random:" + ",".join(
            f"{k}={v}" for k, v in RANDOM_TINY_CONFIG.items()))
    p = Path(s).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{p} is a folder but has no config.json (not a saved HF model)")
        return "local", str(p.resolve())
    if p.exists():
        raise ModelLoadError(f"{p} is a file; pass the folder holding config.json")
    if _HF_ID.match(s) and not s.startswith((".", "~")):
        return "hub", s
    raise ModelLoadError(f"{s!r} is neither 'tiny', an existing folder, nor an HF model id")


# ------------------------------------------------------------------------------------------- public
def load_policy_and_reference(name_or_path: str | os.PathLike = "tiny", dtype: torch.dtype | str = torch.float32,
                              device: str | torch.device = "cpu",
                              reference_device: str | torch.device = "same") -> LoadedModels:
    """Load policy + frozen reference + tokenizer + provenance.

    `name_or_path`: "tiny" (the bundled `models/tiny/`; a seeded random GPT-2 with a RandomInitWarning
    while it does not exist), a local folder with `config.json`, or an HF id such as
    `jrahn/RookWorld-LM-124M`. An unreachable hub raises `ModelLoadError` within ~2 s.
    `reference_device`: 'same' (the policy's) or another device for the frozen reference.
    """
    from rookworld_debug.models.devices import check_device
    auto = isinstance(device, str) and device.strip().lower() == "auto"
    dtype, device = _as_dtype(dtype), check_device(device)   # ConfigError, not torch's bare errors
    source, resolved = _resolve(name_or_path)
    notes: list[str] = []
    if source == "random":
        model, tok = _random_tiny()
        msg = ("models/tiny/ has no trained model yet: using a RANDOMLY INITIALISED tiny GPT-2 "
               f"({resolved.removeprefix('random:')}) with the GPT-2 tokenizer. Completions are noise.")
        notes.append(msg)
        warnings.warn(msg, RandomInitWarning, stacklevel=2)
    elif source == "hub":
        model, tok = _load_hub(resolved, dtype, notes)
    else:
        refuse_custom_code(resolved)                 # before transformers could ask whether to run it
        try:
            model = _from_pretrained(resolved, dtype, local_only=True)
        except Exception as e:
            raise ModelLoadError(f"cannot load the model in {resolved}: {type(e).__name__}: {e}") from e
        tok = _tokenizer_for(resolved, True, model, notes)

    original_dropout = dropout_config(model.config)
    disable_dropout(model)
    if auto and device.type != "cpu" and prov.num_parameters(model) < AUTO_GPU_MIN_PARAMETERS:
        notes.append(f"device='auto' chose the CPU over {device.type}: a {prov.num_parameters(model) / 1e6:.1f} M-"
                     "parameter model's step is bound by kernel launches on a GPU (the embedded model's step took "
                     "26 s on an H200 against about 7 s on 2 CPU cores); device='cuda' uses the GPU anyway")
        device = torch.device("cpu")
    ref_device = device if str(reference_device) == "same" else check_device(reference_device, "reference_device")
    policy = model.to(device=device, dtype=dtype)

    pad_was_missing = tok.pad_token is None
    if pad_was_missing:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # decoder-only generation: the last prompt token must sit at the right edge
    for cfg in (policy.config, policy.generation_config):
        cfg.pad_token_id = tok.pad_token_id  # silences "Setting pad_token_id to eos_token_id" at generate time
    if len(tok) > policy.get_input_embeddings().num_embeddings:
        raise ModelLoadError(f"tokenizer has {len(tok)} tokens but the model only "
                             f"{policy.get_input_embeddings().num_embeddings} embedding rows")

    # A separate copy (like TRL's re-created ref model), frozen for good.
    reference = copy.deepcopy(policy).eval().to(ref_device)
    reference.requires_grad_(False)

    sha, dirty = prov.git_state()
    provenance = prov.Provenance(
        model=str(name_or_path), resolved=resolved, source=source, is_random_init=source == "random",
        num_parameters=prov.num_parameters(policy), dtype=str(dtype), device=str(device),
        weights_sha256=prov.weights_sha256(policy), dropout_original=original_dropout,
        dropout_now=dropout_config(policy.config), model_type=str(policy.config.model_type),
        tokenizer_vocab_size=int(tok.vocab_size), tokenizer_len=len(tok),
        embedding_rows=int(policy.get_input_embeddings().num_embeddings),
        pad_token_id=int(tok.pad_token_id), eos_token_id=int(tok.eos_token_id), pad_was_missing=pad_was_missing,
        padding_side=tok.padding_side, versions=prov.package_versions(), git_sha=sha, git_dirty=dirty,
        timestamp=prov.utc_now(), notes=tuple(notes), **_tokenizer_provenance(tok),
    )
    return LoadedModels(policy, reference, tok, provenance)
