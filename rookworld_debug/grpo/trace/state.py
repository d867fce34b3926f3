"""The weights a recorded step keeps beside its trace (`<trace>/state/`), written and read over a closed schema.

    state/state.json              the schema below (no names that are imported or called)
    state/before.safetensors      the policy's parameters before the update      {name: tensor}
    state/after.safetensors       after it
    state/gradient.safetensors    the gradient the optimizer was handed (before any clipping)
    state/reference.safetensors   the reference model's parameters (absent: no reference recorded)
    state/sampler.safetensors     the weights that sampled the rollout, when they are not the weights before
                                  (a later optimizer pass over one rollout, or a separate sampler copy)
    state/optimizer.safetensors   per-parameter optimizer state, keys "<state key>/<param name>"
    state/tokenizer/              the tokenizer's own JSON files (tokenizer.json: parsed, never executed)

The model is rebuilt from `model_config` with transformers' config class of an allowed `model_type` (a name
looked up in a table written here), then the safetensors weights are loaded into it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from rookworld_debug.errors import TraceError

STATE_FORMAT = 1
MODEL_TYPES = ("gpt2",)                         # architectures a replay rebuilds (the embedded model and RookWorld-LM)
OPTIMIZERS = ("AdamW", "Adam", "SGD")           # optimizers a replay re-runs (torch.optim, by this table only)
OPTIMIZER_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad", "maximize")
STATE_KEYS = ("exp_avg", "exp_avg_sq", "momentum_buffer", "max_exp_avg_sq")
FILES = ("before", "after", "gradient", "reference", "optimizer", "sampler")


@dataclass(frozen=True)
class RecordedState:
    """The weights of one recorded step, read back (tensors on the CPU; None: not recorded)."""
    model_type: str
    model_config: dict                  # the model's config.to_dict(), checked keys only
    before: Optional[dict]              # {name: tensor}
    after: Optional[dict]
    gradient: Optional[dict]
    reference: Optional[dict]
    optimizer_state: Optional[dict]     # {name: {state key: tensor}} ("step" as a 0-dim tensor)
    optimizer: str                      # one of OPTIMIZERS, "" when not recorded
    optimizer_settings: dict            # OPTIMIZER_KEYS of the parameter group
    trainable: tuple                    # names of the parameters the optimizer steps
    tokenizer_dir: Optional[Path]
    sampler: Optional[dict] = None      # the weights that sampled the rollout (None: not recorded)
    tokenizer: object = None            # the tokenizer object of a state kept in memory (not yet written)


def snapshot(model: torch.nn.Module) -> dict:
    """{name: detached CPU fp32-or-own-dtype copy} of every parameter."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


def gradient_of(model: torch.nn.Module) -> dict:
    """{name: copy of .grad} (zeros where a parameter got none: the optimizer saw no gradient there)."""
    return {n: (p.grad.detach().to("cpu", copy=True) if p.grad is not None else torch.zeros_like(p, device="cpu"))
            for n, p in model.named_parameters() if p.requires_grad}


def optimizer_snapshot(model: torch.nn.Module, optimizer) -> tuple[str, dict, dict, tuple]:
    """(kind, settings of its first group, {param name: {state key: tensor}}, trainable names) of `optimizer`."""
    names = {id(p): n for n, p in model.named_parameters()}
    kind = type(optimizer).__name__
    group = optimizer.param_groups[0]
    settings = {k: _plain(group[k]) for k in OPTIMIZER_KEYS if k in group}
    state, trainable = {}, []
    for g in optimizer.param_groups:
        for p in g["params"]:
            name = names.get(id(p))
            if name is None:
                continue
            trainable.append(name)
            st = optimizer.state.get(p, {})
            state[name] = {k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else torch.tensor(float(v)))
                           for k, v in st.items() if k in STATE_KEYS + ("step",)}
    return kind, settings, state, tuple(trainable)


def _plain(v):
    if isinstance(v, (tuple, list)):
        return [float(x) for x in v]
    if torch.is_tensor(v):
        return float(v)
    return v


def write_state(folder: Path, *, model_config: dict, tokenizer=None, before=None, after=None, gradient=None,
                reference=None, optimizer: str = "", optimizer_settings=None, optimizer_state=None,
                trainable=(), sampler=None) -> Path:
    from safetensors.torch import save_file
    from rookworld_debug.safeio import atomic_write_json
    folder = Path(folder) / "state"
    folder.mkdir(parents=True, exist_ok=True)
    flat_opt = {f"{k}/{n}": v.reshape(-1) if v.ndim == 0 else v for n, st in (optimizer_state or {}).items()
                for k, v in st.items()}
    written = []
    for name in FILES:              # a folder reused for another step keeps none of the earlier step's weights
        (folder / f"{name}.safetensors").unlink(missing_ok=True)
    for name, tensors in (("before", before), ("after", after), ("gradient", gradient), ("reference", reference),
                          ("optimizer", flat_opt if optimizer_state is not None else None), ("sampler", sampler)):
        if tensors is not None:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / f"{name}.safetensors"))
            written.append(name)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder / "tokenizer"))
    model_type = str(model_config.get("model_type", ""))
    atomic_write_json(folder / "state.json", {          # last: the manifest of what was written, with hashes
        "format": STATE_FORMAT, "model_type": model_type, "model_config": model_config, "files": written,
        "sha256": {name: _sha256(folder / f"{name}.safetensors") for name in written},
        "optimizer": optimizer, "optimizer_settings": optimizer_settings or {}, "trainable": list(trainable),
        "tokenizer": tokenizer is not None})
    return folder


def write_recorded(folder: Path, st: RecordedState) -> Path:
    """`st` (a state kept in memory by a step that ran) written as `write_state` writes a recorded step's."""
    return write_state(folder, model_config=st.model_config, tokenizer=st.tokenizer, before=st.before,
                       after=st.after, gradient=st.gradient, reference=st.reference, optimizer=st.optimizer,
                       optimizer_settings=st.optimizer_settings, optimizer_state=st.optimizer_state,
                       trainable=st.trainable, sampler=st.sampler)


def state_bytes(st: RecordedState) -> int:
    """Bytes of the tensors `st` holds (what state/ takes on disk, less the tokenizer's files)."""
    parts = (st.before, st.after, st.gradient, st.reference, st.sampler,
             *((st.optimizer_state or {}).values()))
    return sum(t.numel() * t.element_size() for d in parts if d for t in d.values())


def _sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _checked_file(folder: Path, name: str, manifest: dict, where: str) -> Path:
    """state/<name>.safetensors: a plain file inside the folder whose hash is the manifest's (when it has one)."""
    path = folder / f"{name}.safetensors"
    if path.is_symlink() or not path.resolve().is_relative_to(folder.resolve()):
        raise TraceError(f"{path} is a link; a recorded step's weights are plain files inside its folder")
    if not path.is_file():
        raise TraceError(f"incomplete save: {where} lists {name}.safetensors, which is missing")
    want = manifest.get(name)
    if want is not None and _sha256(path) != want:
        raise TraceError(f"incomplete or altered save: {path} does not match the hash {where} recorded")
    return path


def _same_shapes(loaded: dict, where: str) -> None:
    """Every recorded tensor of a parameter has that parameter's shape and dtype (the weights before are the
    reference); a tensor of a name the weights before do not have is refused."""
    before = loaded.get("before") or {}
    for part in ("after", "gradient", "sampler", "reference"):
        for name, t in (loaded.get(part) or {}).items():
            ref = before.get(name)
            if ref is None and part != "reference":
                raise TraceError(f"{where}: {part}.safetensors holds {name!r}, which the weights before do not")
            if ref is not None and (tuple(t.shape) != tuple(ref.shape) or t.dtype != ref.dtype):
                raise TraceError(f"{where}: {part}.safetensors {name!r} is {tuple(t.shape)} {t.dtype}, the "
                                 f"parameter is {tuple(ref.shape)} {ref.dtype}")


def _field(d: dict, key: str, kind, where: str):
    v = d.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise TraceError(f"{where}: {key} must be {getattr(kind, '__name__', kind)}, found {type(v).__name__}")
    return v


def read_state(trace_dir) -> Optional[RecordedState]:
    """The recorded weights beside a trace (None when it has no state/ folder); TraceError names what is wrong."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    folder = Path(trace_dir) / "state"
    where = str(folder / "state.json")
    if not (folder / "state.json").is_file():
        return None
    try:
        d = json.loads((folder / "state.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise TraceError(f"{where} is not valid JSON ({err})") from None
    if not isinstance(d, dict) or d.get("format") != STATE_FORMAT:
        raise TraceError(f"{where}: not a recorded state of format {STATE_FORMAT}")
    files = _field(d, "files", list, where)
    if not set(files) <= set(FILES):
        raise TraceError(f"{where}: files {sorted(set(files) - set(FILES))} are not recorded-state files")
    optimizer = _field(d, "optimizer", str, where)
    if optimizer and optimizer not in OPTIMIZERS:
        optimizer = ""                   # kept as not replayable; the replay says so
    settings = {k: v for k, v in _field(d, "optimizer_settings", dict, where).items() if k in OPTIMIZER_KEYS}
    manifest = d.get("sha256") if isinstance(d.get("sha256"), dict) else {}
    loaded = {}
    for name in files:
        path = _checked_file(folder, name, manifest, where)
        try:
            loaded[name] = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as err:
            raise TraceError(f"{path} is unreadable ({err})") from None
    _same_shapes(loaded, where)
    opt = None
    if "optimizer" in loaded:
        opt = {}
        for key, v in loaded["optimizer"].items():
            k, _, n = key.partition("/")
            if k not in STATE_KEYS + ("step",):
                raise TraceError(f"{where}: optimizer state key {k!r} is not one this package reads")
            opt.setdefault(n, {})[k] = v.reshape(()) if k == "step" else v
    trainable = tuple(str(x) for x in _field(d, "trainable", list, where))
    tok = folder / "tokenizer" if d.get("tokenizer") is True and (folder / "tokenizer").is_dir() else None
    return RecordedState(model_type=str(d.get("model_type")), model_config=_field(d, "model_config", dict, where),
                         before=loaded.get("before"), after=loaded.get("after"), gradient=loaded.get("gradient"),
                         reference=loaded.get("reference"), optimizer_state=opt, optimizer=optimizer,
                         optimizer_settings=settings, trainable=trainable, tokenizer_dir=tok,
                         sampler=loaded.get("sampler"))


def build_model(state: RecordedState, weights: dict):
    """A model of the recorded architecture holding `weights` (eval mode, fp32 unless the weights say otherwise)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    if state.model_type not in MODEL_TYPES:
        raise TraceError(f"recorded model_type {state.model_type!r}: a replay rebuilds {MODEL_TYPES} only")
    kw = {k: v for k, v in state.model_config.items() if isinstance(k, str) and not k.startswith("_")
          and isinstance(v, (int, float, str, bool, type(None))) and k not in ("model_type", "architectures",
                                                                                 "auto_map", "torch_dtype", "dtype")}
    _config_fits(kw, weights)              # before allocating: a config that is not these weights' is refused
    config = AutoConfig.for_model(MODEL_TYPES[MODEL_TYPES.index(state.model_type)], **kw)
    model = AutoModelForCausalLM.from_config(config)
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        raise TraceError(f"recorded weights do not fit the recorded architecture: {str(err)[:300]}") from None
    missing = [m for m in missing if not _tied(model, m)]
    if missing or unexpected:
        raise TraceError(f"recorded weights do not fit the recorded architecture (missing {missing[:3]}, "
                         f"unexpected {list(unexpected)[:3]})")
    dtype = next(iter(weights.values())).dtype
    return model.to(dtype).eval()


def _config_fits(config: dict, weights: dict) -> None:
    """A GPT-2 config against its weights' shapes (vocabulary, width, positions, layers), checked before a model
    of it is allocated: a tampered `n_embd` or `n_layer` is a named error, not an allocation of gigabytes."""
    wte, wpe = weights.get("transformer.wte.weight"), weights.get("transformer.wpe.weight")
    if wte is None or wpe is None or wte.ndim != 2 or wpe.ndim != 2:
        raise TraceError("recorded weights: transformer.wte.weight and transformer.wpe.weight (2-D) are required")
    layers = {int(k.split(".")[2]) for k in weights if k.startswith("transformer.h.") and k.split(".")[2].isdigit()}
    want = {"vocab_size": wte.shape[0], "n_embd": wte.shape[1], "n_positions": wpe.shape[0],
            "n_layer": len(layers)}
    for key, value in want.items():
        got = config.get(key, value)
        if isinstance(got, bool) or not isinstance(got, int) or got != value:
            raise TraceError(f"recorded state.json: {key} = {got!r}, but the recorded weights have {value}")
    if layers != set(range(len(layers))):
        raise TraceError(f"recorded weights: layers {sorted(layers)[:8]} are not 0 … {len(layers) - 1}")


def _tied(model, name: str) -> bool:
    """A parameter the model ties to another (GPT-2's lm_head to wte): not stored twice."""
    return name.endswith("lm_head.weight") and bool(getattr(model.config, "tie_word_embeddings", True))


def relative_error(a: dict, b: dict, names) -> tuple[float, str, float]:
    """(‖a − b‖ / ‖b‖ over `names`, the name with the largest relative error, that error)."""
    num = den = 0.0
    worst, worst_err = "", 0.0
    for n in names:
        d = float((a[n].double() - b[n].double()).norm()) ** 2
        s = float(b[n].double().norm()) ** 2
        num, den = num + d, den + s
        err = math.sqrt(d / s) if s > 0 else (math.inf if d > 0 else 0.0)
        if err > worst_err:
            worst, worst_err = n, err
    return (math.sqrt(num / den) if den > 0 else (math.inf if num > 0 else 0.0)), worst, worst_err
