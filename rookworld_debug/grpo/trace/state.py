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
# the settings each optimizer's constructor takes (a key of another optimizer would be an unexpected keyword)
SETTINGS_OF = {"AdamW": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
               "Adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
               "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")}
FLAGS = ("nesterov", "amsgrad", "maximize")
REPLAY_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)   # dtypes a replay computes in
# the GPT-2 settings that make the LM's numbers, each of its type; the recorded config's other keys are left out
# (dropout is off in eval mode; initialisation and output settings do not change a forward)
GPT2_SETTINGS = {"vocab_size": (int,), "n_positions": (int,), "n_embd": (int,), "n_layer": (int,), "n_head": (int,),
                 "n_inner": (int, type(None)), "activation_function": (str,), "layer_norm_epsilon": (int, float),
                 "scale_attn_weights": (bool,), "scale_attn_by_inverse_layer_idx": (bool,),
                 "reorder_and_upcast_attn": (bool,), "tie_word_embeddings": (bool,)}


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
    optimizer_settings: dict            # OPTIMIZER_KEYS of the first parameter group
    trainable: tuple                    # names of the parameters the optimizer steps
    tokenizer_dir: Optional[Path]
    sampler: Optional[dict] = None      # the weights that sampled the rollout (None: not recorded)
    tokenizer: object = None            # the tokenizer object of a state kept in memory (not yet written)
    optimizer_groups: tuple = ()        # ((names, settings), ...): the later parameter groups whose settings differ
                                        # from the first's (no weight decay on biases and norms, another rate)


def snapshot(model: torch.nn.Module) -> dict:
    """{name: detached CPU fp32-or-own-dtype copy} of every parameter."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


def gradient_of(model: torch.nn.Module) -> dict:
    """{name: copy of .grad} (zeros where a parameter got none: the optimizer saw no gradient there)."""
    return {n: (p.grad.detach().to("cpu", copy=True) if p.grad is not None else torch.zeros_like(p, device="cpu"))
            for n, p in model.named_parameters() if p.requires_grad}


def optimizer_snapshot(model: torch.nn.Module, optimizer) -> tuple[str, dict, dict, tuple, tuple]:
    """(kind, settings of its first group, {param name: {state key: tensor}}, trainable names, the later groups
    whose settings differ as ((names, settings), ...)) of `optimizer`."""
    names = {id(p): n for n, p in model.named_parameters()}
    kind = type(optimizer).__name__
    group = optimizer.param_groups[0]
    settings = {k: _plain(group[k]) for k in OPTIMIZER_KEYS if k in group}
    others = tuple((tuple(names[id(p)] for p in g["params"] if id(p) in names), own)
                   for g in optimizer.param_groups[1:]
                   if (own := {k: _plain(g[k]) for k in OPTIMIZER_KEYS if k in g}) != settings)
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
    return kind, settings, state, tuple(trainable), tuple((n, o) for n, o in others if n)


def _plain(v):
    if isinstance(v, (tuple, list)):
        return [float(x) for x in v]
    if torch.is_tensor(v):
        return float(v)
    return v


def write_state(folder: Path, *, model_config: dict, tokenizer=None, before=None, after=None, gradient=None,
                reference=None, optimizer: str = "", optimizer_settings=None, optimizer_state=None,
                trainable=(), sampler=None, optimizer_groups=()) -> Path:
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
        "optimizer_groups": [{"params": list(n), "settings": o} for n, o in optimizer_groups],
        "tokenizer": tokenizer is not None})
    return folder


def write_recorded(folder: Path, st: RecordedState) -> Path:
    """`st` (a state kept in memory by a step that ran) written as `write_state` writes a recorded step's."""
    return write_state(folder, model_config=st.model_config, tokenizer=st.tokenizer, before=st.before,
                       after=st.after, gradient=st.gradient, reference=st.reference, optimizer=st.optimizer,
                       optimizer_settings=st.optimizer_settings, optimizer_state=st.optimizer_state,
                       trainable=st.trainable, sampler=st.sampler, optimizer_groups=st.optimizer_groups)


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
    if folder.is_symlink() or path.is_symlink() or not path.resolve().is_relative_to(folder.resolve()):
        raise TraceError(f"{path} is a link (or lies in one); a recorded step's weights are plain files inside "
                         "its folder")
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


def _number(v) -> bool:
    """A finite int or float (not a bool; an int past the float range is not finite)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _names(d: dict, key: str, where: str) -> list:
    v = _field(d, key, list, where)
    if not all(isinstance(x, str) for x in v):
        raise TraceError(f"{where}: {key} must be a list of names")
    return v


def _manifest(d: dict, where: str) -> dict:
    """{file: sha256 hex}; absent in a save older than the manifest (then nothing is checked)."""
    m = d.get("sha256", {})
    if not isinstance(m, dict) or not all(isinstance(v, str) for v in m.values()):
        raise TraceError(f"{where}: sha256 must map file names to hex digests")
    return m


def _groups(d: dict, optimizer: str, trainable: tuple, where: str) -> tuple:
    """((names, settings), ...) of the later parameter groups (absent in a save older than them: none)."""
    raw = d.get("optimizer_groups", [])
    if not isinstance(raw, list):
        raise TraceError(f"{where}: optimizer_groups must be a list")
    out, seen = [], set()
    for i, g in enumerate(raw):
        if not isinstance(g, dict) or set(g) != {"params", "settings"}:
            raise TraceError(f"{where}: optimizer_groups[{i}] must hold exactly params and settings")
        names = _names(g, "params", f"{where}: optimizer_groups[{i}]")
        if not set(names) <= set(trainable) or seen & set(names):
            raise TraceError(f"{where}: optimizer_groups[{i}] names parameters the optimizer does not step, or "
                             "another group's")
        seen |= set(names)
        out.append((tuple(names), _settings({"optimizer_settings": g["settings"]}, optimizer,
                                            f"{where}: optimizer_groups[{i}]")))
    return tuple(out)


def _settings(d: dict, optimizer: str, where: str) -> dict:
    """The recorded group's settings its optimizer takes, each a finite number, a pair of them (betas) or a flag
    (an optimizer a replay does not re-run keeps its OPTIMIZER_KEYS as recorded: its own may be None)."""
    settings = _field(d, "optimizer_settings", dict, where)
    if optimizer not in SETTINGS_OF:
        return {k: v for k, v in settings.items() if k in OPTIMIZER_KEYS}
    out = {}
    for k, v in settings.items():
        if k not in SETTINGS_OF[optimizer]:
            continue
        ok = isinstance(v, bool) if k in FLAGS else \
            isinstance(v, list) and len(v) == 2 and all(map(_number, v)) if k == "betas" else _number(v)
        if not ok:
            raise TraceError(f"{where}: optimizer_settings {k} = {v!r:.80} is not a finite number, a pair of them "
                             "(betas) or a flag")
        out[k] = v
    return out


def _optimizer_state(flat: dict, before: Optional[dict], optimizer: str, settings: dict, where: str) -> dict:
    """{param: {state key: tensor}}: every moment of its parameter's shape and dtype, every step one number, and
    an Adam's state whole (torch's step reads each moment of a parameter that has any state)."""
    opt: dict = {}
    for key, v in flat.items():
        k, _, n = key.partition("/")
        if k not in STATE_KEYS + ("step",):
            raise TraceError(f"{where}: optimizer state key {k!r} is not one this package reads")
        ref = (before or {}).get(n)
        if before is not None and ref is None:
            raise TraceError(f"{where}: optimizer state {key!r} is of no parameter the weights before hold")
        if k == "step" and (v.numel() != 1 or v.dtype == torch.bool or v.is_complex()):
            raise TraceError(f"{where}: optimizer state {key!r} is {tuple(v.shape)} {v.dtype}, not one step count")
        if k != "step" and ref is not None and (v.shape != ref.shape or v.dtype != ref.dtype):
            raise TraceError(f"{where}: optimizer state {key!r} is {tuple(v.shape)} {v.dtype}, the parameter is "
                             f"{tuple(ref.shape)} {ref.dtype}")
        opt.setdefault(n, {})[k] = v.reshape(()) if k == "step" else v
    need = {"step", "exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if settings.get("amsgrad") else ())} \
        if optimizer in ("Adam", "AdamW") else set()
    for n, st in opt.items():
        if need - set(st):
            raise TraceError(f"{where}: the {optimizer} state of {n!r} lacks {sorted(need - set(st))}")
    return opt


def _tokenizer_dir(folder: Path, d: dict) -> Optional[Path]:
    """state/tokenizer when the state says it was saved: a folder of plain files inside the state folder, none of
    which asks for custom code (refused here, before transformers could ask whether to run it)."""
    from rookworld_debug.models.custom_code import refuse_custom_code
    tok = folder / "tokenizer"
    if d.get("tokenizer") is not True or not tok.is_dir():
        return None
    if tok.is_symlink() or any(p.is_symlink() for p in tok.iterdir()):
        raise TraceError(f"{tok} is or holds a link; a recorded step's tokenizer is plain files inside its folder")
    refuse_custom_code(tok, TraceError)
    return tok


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
    if not isinstance(d, dict) or type(d.get("format")) is not int or d["format"] != STATE_FORMAT:
        raise TraceError(f"{where}: not a recorded state of format {STATE_FORMAT}")
    files = _names(d, "files", where)
    if not set(files) <= set(FILES):
        raise TraceError(f"{where}: files {sorted(set(files) - set(FILES))} are not recorded-state files")
    optimizer = _field(d, "optimizer", str, where)
    if optimizer and optimizer not in OPTIMIZERS:
        optimizer = ""                   # kept as not replayable; the replay says so
    settings = _settings(d, optimizer, where)
    manifest = _manifest(d, where)
    loaded = {}
    for name in files:
        path = _checked_file(folder, name, manifest, where)
        try:
            loaded[name] = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as err:
            raise TraceError(f"{path} is unreadable ({err})") from None
    _same_shapes(loaded, where)
    before = loaded.get("before")
    opt = _optimizer_state(loaded["optimizer"], before, optimizer, settings, where) if "optimizer" in loaded else None
    trainable = tuple(_names(d, "trainable", where))
    if before is not None and not set(trainable) <= set(before):
        raise TraceError(f"{where}: trainable names {sorted(set(trainable) - set(before))[:3]} are not parameters "
                         "the weights before hold")
    return RecordedState(model_type=str(d.get("model_type")), model_config=_field(d, "model_config", dict, where),
                         before=before, after=loaded.get("after"), gradient=loaded.get("gradient"),
                         reference=loaded.get("reference"), optimizer_state=opt, optimizer=optimizer,
                         optimizer_settings=settings, trainable=trainable, tokenizer_dir=_tokenizer_dir(folder, d),
                         sampler=loaded.get("sampler"), optimizer_groups=_groups(d, optimizer, trainable, where))


def build_model(state: RecordedState, weights: dict):
    """A model of the recorded architecture holding `weights` (eval mode, fp32 unless the weights say otherwise):
    the plain-torch GPT-2 of models.gpt2_torch where it computes this config exactly as transformers does (no
    transformers import), else transformers' own class."""
    from rookworld_debug.models import gpt2_torch
    if state.model_type not in MODEL_TYPES:
        raise TraceError(f"recorded model_type {state.model_type!r}: a replay rebuilds {MODEL_TYPES} only")
    kw = _gpt2_config(state.model_config)
    _config_fits(kw, weights)              # before allocating: a config that is not these weights' is refused
    kw.update(_token_ids(state.model_config, weights["transformer.wte.weight"].shape[0]))
    dtypes = {t.dtype for t in weights.values()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in REPLAY_DTYPES:
        raise TraceError(f"recorded weights hold {sorted(map(str, dtypes))}: a replay rebuilds a model of one of "
                         f"{[str(t) for t in REPLAY_DTYPES]}")
    build = _build_transformers if gpt2_torch.supports({**state.model_config, **kw}) else _build_plain
    return build(state, kw, weights)


def _build_plain(state: RecordedState, kw: dict, weights: dict):
    from rookworld_debug.models import gpt2_torch
    try:
        return gpt2_torch.build(kw, weights)
    except (RuntimeError, KeyError) as err:
        raise TraceError(f"recorded weights do not fit the recorded architecture: {str(err)[:300]}") from None


def _build_transformers(state: RecordedState, kw: dict, weights: dict):
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(MODEL_TYPES[MODEL_TYPES.index(state.model_type)], **kw)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
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


def _gpt2_config(config: dict) -> dict:
    """The recorded config's GPT2_SETTINGS, each of its type, numbers finite, the activation one transformers has
    (TraceError naming the first that is not): transformers' own refusals are of many types, some after allocating."""
    kw = {k: config[k] for k in GPT2_SETTINGS if k in config}
    for k, v in kw.items():
        kinds = GPT2_SETTINGS[k]
        if not isinstance(v, kinds) or isinstance(v, bool) and bool not in kinds or \
                float in kinds and not _number(v):
            raise TraceError(f"recorded state.json: model_config {k} = {v!r:.80} is not "
                             f"{' or '.join('a finite ' + t.__name__ if t is float else t.__name__ for t in kinds)}")
    if not _known_activation(kw.get("activation_function", "gelu_new")):
        raise TraceError(f"recorded state.json: activation_function {kw['activation_function']!r:.80} is not one "
                         "transformers knows")
    eps = kw.get("layer_norm_epsilon", 1e-5)
    if not eps > 0:
        raise TraceError(f"recorded state.json: layer_norm_epsilon {eps!r} is not positive")
    return {**kw, "layer_norm_epsilon": float(eps)}          # transformers' field takes a float only


def _known_activation(name) -> bool:
    """An activation transformers knows (GPT-2's own answered without importing it)."""
    from rookworld_debug.models.gpt2_torch import ACTIVATIONS
    if name in ACTIVATIONS:
        return True
    from transformers.activations import ACT2FN
    return isinstance(name, str) and name in ACT2FN


def _token_ids(config: dict, vocab: int) -> dict:
    """The recorded special token ids that are ids of the vocabulary, others None: they change no forward, and
    transformers' default (GPT-2's 50256) would only make it warn about a smaller vocabulary."""
    ids = {k: config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return {k: v if type(v) is int and 0 <= v < vocab else None for k, v in ids.items()}


def _config_fits(config: dict, weights: dict) -> None:
    """A GPT-2 config against its weights' shapes (vocabulary, width, positions, layers, heads, MLP width), checked
    before a model of it is allocated: a tampered `n_embd` or `n_inner` is a named error, not an allocation of
    gigabytes."""
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
    heads = config.get("n_head", 12)
    if not 1 <= heads <= wte.shape[1] or wte.shape[1] % heads:
        raise TraceError(f"recorded state.json: n_head = {heads}, which does not divide n_embd = {wte.shape[1]}")
    fc = weights.get("transformer.h.0.mlp.c_fc.weight")
    inner = 4 * wte.shape[1] if config.get("n_inner") is None else config["n_inner"]
    if layers and (fc is None or fc.ndim != 2 or fc.shape[1] != inner):
        raise TraceError(f"recorded state.json: n_inner = {inner}, but the recorded MLP weight is "
                         f"{tuple(fc.shape) if fc is not None else 'missing'}")


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
