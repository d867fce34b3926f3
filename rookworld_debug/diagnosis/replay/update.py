"""The update phase: the recorded optimizer's step re-run from θ_before, the recorded gradient and state, against
θ_after; on a disagreement, what the update was fitted to be.

In order of simplicity: no move at all; a fresh optimizer state; the unclipped gradient; Δθ_recorded ≈
a·Δθ_optimizer + c·θ_before by least squares (a: the learning-rate factor actually applied, c: a component along the
weights, a decay the recorded settings do not hold); an element-wise clamp of the step; a gradient clamped
element-wise before the step (its bound fitted). Each holds to the tolerance of the recorded precision, plus the
rounding of θ_after − θ_before in the weights' own dtype (a small step on a large weight loses digits).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .compare import REL_TOL, parameter_samples, tol_for
from .optimizers import CLASSES as OPTIMIZERS, RecordedOptimizer
from .records import AGREE, DISAGREE, SUSPECT, PhaseCheck, fmt
from .terms import dot as _dot


def rerun_update(before: dict, grad: dict, trainable, kind: str, settings: dict, opt_state: Optional[dict],
                 max_grad_norm: Optional[float], *, clip: bool = True, fresh_state: bool = False,
                 grad_clamp: Optional[float] = None, groups: tuple = (), per_tensor: bool = False) -> dict:
    """{name: θ after one step of the recorded optimizer} from θ_before, the recorded gradient and state
    (`grad_clamp`: the gradient also clamped element-wise to ±it after the norm clip; `per_tensor`: the norm clip
    applied to each tensor on its own, not to the whole gradient)."""
    names = [n for n in trainable if n in grad and n in before]
    # in the recorded dtype: a bf16 model's optimizer steps in bf16, and its rounding is part of what it did
    params = [torch.nn.Parameter(before[n].detach().clone()) for n in names]
    for p, n in zip(params, names):
        p.grad = grad[n].detach().clone().to(p.dtype)
    for group in ([[p] for p in params] if per_tensor else [params]) if clip and max_grad_norm else ():
        torch.nn.utils.clip_grad_norm_(group, float(max_grad_norm))
    if grad_clamp is not None:
        torch.nn.utils.clip_grad_value_(params, grad_clamp)
    opt = recorded_optimizer(kind, params, names, settings, None if fresh_state else opt_state, groups)
    opt.step()
    return {n: p.detach() for n, p in zip(names, params)}


def recorded_optimizer(kind: str, params: list, names: list, settings: dict, opt_state: Optional[dict],
                       groups: tuple = ()) -> RecordedOptimizer:
    """The recorded optimizer over `params` (named `names`) holding its recorded state, with its later parameter
    groups' own settings (`groups`: ((names, settings), ...)); TraceError when torch refuses the recorded
    settings. torch's own step without a torch.optim object (replay.optimizers says why)."""
    from rookworld_debug.errors import TraceError

    def kw(d: dict) -> dict:
        return {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
    by_name, grouped = dict(zip(names, params)), {n for g, _ in groups for n in g}
    parts = [[n for n in names if n not in grouped]] + [[n for n in g if n in by_name] for g, _ in groups]
    param_groups = [{"params": [by_name[n] for n in part], **kw(own)}
                    for part, own in zip(parts, ({}, *(o for _, o in groups))) if part]
    try:
        opt = RecordedOptimizer(kind, param_groups, **kw(settings))
    except ValueError as err:                   # torch's own range checks: a negative lr, a β outside [0, 1)
        raise TraceError(f"the recorded {kind} settings are refused by torch: {err}") from None
    if opt_state:
        opt.load({by_name[n]: opt_state[n] for part in parts for n in part if opt_state.get(n)})
    return opt


def load_recorded_state(opt, names: list, opt_state: dict) -> None:
    """The recorded per-parameter state ({name: {state key: tensor}}) into `opt`, whose parameters are `names` in
    order (torch moves each tensor to its parameter's device)."""
    sd = opt.state_dict()
    sd["state"] = {i: {k: (v.clone() if k != "step" else v.clone().float().reshape(()))
                       for k, v in opt_state.get(n, {}).items()} for i, n in enumerate(names) if opt_state.get(n)}
    opt.load_state_dict(sd)


class _Update:
    """The recorded update and what the optimizer gives, with the bound a fit is held to."""

    def __init__(self, state, max_grad_norm, dtype: str):
        self.state, self.max_grad_norm = state, max_grad_norm
        s = state
        self.names = [n for n in s.trainable if n in s.gradient and n in s.before and n in s.after]
        self.tol = tol_for(REL_TOL, dtype)
        self.d_rec = {n: s.after[n].double() - s.before[n].double() for n in self.names}
        self.norm_rec = math.sqrt(_dot(self.d_rec, self.d_rec, self.names))
        # θ_after − θ_before carries the rounding of θ_after in its dtype: half a unit in its last place
        eps = torch.finfo(next(iter(s.after.values())).dtype).eps if s.after else 2.0 ** -23
        self.noise = math.sqrt(sum(float((s.after[n].double().abs() * eps / 2).pow(2).sum()) for n in self.names))
        self.bound = self.tol * self.norm_rec + self.noise

    def step(self, max_grad_norm=False, **kw) -> dict:
        s = self.state
        clip = self.max_grad_norm if max_grad_norm is False else max_grad_norm
        o = rerun_update(s.before, s.gradient, self.names, s.optimizer, s.optimizer_settings, s.optimizer_state,
                         clip, groups=s.optimizer_groups, **kw)
        return {n: o[n].double() - s.before[n].double() for n in self.names}

    def resid(self, fitted: dict) -> float:
        return math.sqrt(sum(float((self.d_rec[n] - fitted[n]).pow(2).sum()) for n in self.names))


def update_check(state, max_grad_norm, dtype: str) -> PhaseCheck:
    from rookworld_debug.grpo.trace.state import relative_error
    q = f"update: θ_after from θ_before, the recorded gradient and {state.optimizer or 'its optimizer'}'s state"
    u = _Update(state, max_grad_norm, dtype)
    d_ref = u.step()
    err, worst, worst_err = relative_error(u.d_rec, d_ref, u.names)
    if err <= u.tol:
        return PhaseCheck("update", q, AGREE, err, u.tol, measure="‖Δθ_recorded − Δθ‖ / ‖Δθ‖")
    cause, why, fitted = "", "", None
    # a NaN or inf step, recorded or re-run: no fit (an infinite bound would let every one hold)
    finite = math.isfinite(u.norm_rec) and math.isfinite(_dot(d_ref, d_ref, u.names))
    if u.norm_rec == 0:
        cause, why = "optimizer_no_op", "the weights did not move: the optimizer applied nothing"
    elif not finite:
        why = "the recorded or re-run step holds NaN or ±inf"
    else:
        for code, kw, sentence in (
                ("optimizer_state_reset", dict(fresh_state=True),
                 "the update is a first step's: the optimizer's moments were reset (a new optimizer each step?)"),
                ("grad_clip_not_applied", dict(clip=False),
                 f"the update used the unclipped gradient: max_grad_norm {max_grad_norm} was not applied"),
                ("update_clip_per_parameter", dict(per_tensor=True),
                 f"each parameter tensor's gradient was clipped to norm {max_grad_norm} on its own (clip_grad_norm_ "
                 "called per tensor), not the whole gradient by its global norm: the update's direction changed")):
            if (max_grad_norm or "clip" not in kw and "per_tensor" not in kw) and u.resid(u.step(**kw)) <= u.bound:
                cause, why = code, sentence
                break
    if not cause and u.norm_rec > 0 and finite and max_grad_norm:
        cause, why, fitted = _clip_mechanisms(u)
    if not cause and u.norm_rec > 0 and finite:
        cause, why, fitted = _linear_fit(u, d_ref)
        if not cause:
            cause, why, fitted = _clamp_fits(u, d_ref, fitted)
        if not cause:
            cause, why, fitted = _clip_fit(u, fitted)
    return PhaseCheck("update", q, DISAGREE, err, u.tol, f"worst parameter {worst} (relative error {worst_err:.3g})",
                      f"‖Δθ‖ = {fmt(u.norm_rec)}", f"‖Δθ‖ = {fmt(math.sqrt(_dot(d_ref, d_ref, u.names)))}", cause,
                      why, measure="‖Δθ_recorded − Δθ‖ / ‖Δθ‖", fit=fitted,
                      samples=parameter_samples(u.d_rec, d_ref, worst, u.tol))


def untrained_check(state) -> Optional[PhaseCheck]:
    """A disagreement when parameters with a non-zero recorded gradient are in no parameter group of the recorded
    optimizer and did not move (they never train), else None. A parameter the loop froze has no gradient; one that
    another optimizer steps moves. Where the idle ones are every bias and norm weight (1-D) and nothing else, a
    no-weight-decay filter dropped them: an error; any other set may be a freeze done by leaving modules out of the
    optimizer (with their gradients still computed): a warning (suspect)."""
    names = [n for n in state.gradient if n not in set(state.trainable) and n in state.before and n in state.after]
    idle = [n for n in names if bool(torch.isfinite(state.gradient[n]).all())
            and float(state.gradient[n].abs().max()) > 0 and torch.equal(state.before[n], state.after[n])]
    if not idle:
        return None
    g_idle = math.sqrt(sum(float(state.gradient[n].double().pow(2).sum()) for n in idle))
    g_all = math.sqrt(sum(float(state.gradient[n].double().pow(2).sum()) for n in state.gradient
                          if bool(torch.isfinite(state.gradient[n]).all())))
    size = sum(state.gradient[n].numel() for n in idle)
    vectors = set(idle) == {n for n in state.gradient if n in state.before and state.before[n].ndim <= 1}
    why = (f"{len(idle)} parameters ({size:,} weights) have a non-zero gradient (‖g‖ = {g_idle:.4g} of the whole "
           f"gradient's {g_all:.4g}) but are in no parameter group of the recorded {state.optimizer or 'optimizer'}, "
           f"and did not move: {', '.join(idle[:4])}{', …' if len(idle) > 4 else ''}. They never train" +
           (": every one is a bias or a norm's weight (1-D), the parameters a no-weight-decay filter picks: give "
            "them a group with weight_decay = 0 instead of leaving them out" if vectors else
            ": pass every trainable parameter to the optimizer, or set requires_grad = False on those meant frozen "
            "(their gradients are computed for nothing)"))
    return PhaseCheck("update", "the parameters with a gradient that the optimizer steps",
                      DISAGREE if vectors else SUSPECT, len(idle) / len(state.gradient), 0.0,
                      f"{len(idle)} of {len(state.gradient)} parameters", f"{len(idle)} with a gradient, unmoved",
                      "every parameter with a gradient in the optimizer", "parameters_not_in_optimizer", why,
                      measure="share of the gradient's parameters left out of the optimizer")


# (input embedding, output head) names of a tied pair: GPT-2's, Llama-style and BERT-style checkpoints
TIED_PAIRS = (("transformer.wte.weight", "lm_head.weight"), ("model.embed_tokens.weight", "lm_head.weight"))


def untied_check(state) -> Optional[PhaseCheck]:
    """A disagreement when the recorded model's config ties its output head to its input embedding and the loop's
    trainable parameters hold the two as separate tensors: each gets only its own half of the shared gradient and
    its own optimizer step, so the two drift apart (a copy made when the head was re-created, or weights loaded into
    it); else None."""
    config = state.model_config if isinstance(getattr(state, "model_config", None), dict) else {}
    if config.get("tie_word_embeddings", True) is False:
        return None
    trainable = set(state.trainable)
    pair = next(((a, b) for a, b in TIED_PAIRS if a in trainable and b in trainable), None)
    if pair is None:
        return None
    a, b = pair
    grad = state.gradient or {}
    norms = {n: math.sqrt(float(grad[n].double().pow(2).sum())) if n in grad else math.nan for n in pair}
    apart = state.before is not None and a in state.before and b in state.before and \
        not torch.equal(state.before[a], state.before[b])
    why = (f"the model's config ties {b} to {a} (tie_word_embeddings), but the loop trains them as two parameters "
           f"(‖g‖ = {norms[a]:.4g} and {norms[b]:.4g}): each gets only its own half of the shared gradient and its "
           f"own optimizer step" + (", and their weights already differ" if apart else "") + ". The head was given "
           "its own copy of the matrix (re-created or loaded after the model was built): tie them again "
           "(model.tie_weights()) before the optimizer is built")
    return PhaseCheck("gradient", "the tied input embedding and output head: one parameter", DISAGREE, 1.0, 0.0,
                      f"{a} and {b}", "two parameters", "one tied parameter", "tied_weights_untied", why,
                      measure="separate tensors for one tied weight")


def duplicated_check(state) -> Optional[PhaseCheck]:
    """A disagreement when the optimizer's parameter list holds one tensor more than once (a tied weight listed
    under both its names: named_parameters(remove_duplicate=False), or the head's and the embedding's groups both
    holding it): torch steps it once per listing, so it moves by two updates with its moments advanced twice; else
    None."""
    from collections import Counter
    twice = {n: k for n, k in Counter(state.trainable).items() if k > 1}
    if not twice:
        return None
    listed = ", ".join(f"{n} ×{k}" for n, k in list(twice.items())[:4])
    why = (f"the optimizer's parameter list holds {len(twice)} tensor(s) more than once ({listed}, of "
           f"{len(state.trainable)} listed): torch steps a parameter once per listing, so each moves by that many "
           "updates per step, its moments and step count advanced as often (a tied embedding and output head listed "
           "under both names: named_parameters(remove_duplicate=False)); build the optimizer over "
           "model.parameters(), which lists a shared tensor once")
    return PhaseCheck("update", "the optimizer's parameters: each tensor listed once", DISAGREE, float(len(twice)),
                      0.0, listed, "listed more than once", "each once", "tied_weight_stepped_twice", why,
                      measure="tensors listed more than once")


def coupled_decay_check(state, declared_adamw: bool) -> Optional[PhaseCheck]:
    """Adam (not AdamW) with weight_decay > 0: its decay is an L2 term λ·θ added to the gradient, which then goes
    through the moments, so each weight's decay is divided by its own √v̂ (weights with large gradients barely
    decay), where AdamW decays every weight by lr·λ·θ. A disagreement where the step declares AdamW (the package's
    own step and TRL's trainer build AdamW); a suspicion for a loop of its own, which may mean L2 on purpose."""
    wd = float((state.optimizer_settings or {}).get("weight_decay", 0.0) or 0.0)
    if state.optimizer != "Adam" or wd <= 0:
        return None
    why = (f"the optimizer is Adam with weight_decay = {wd:g}: an L2 term λ·θ added to the gradient and divided by "
           "each weight's own √v̂ with it, so weights with large gradients barely decay; AdamW decays every weight "
           f"by lr·λ·θ, decoupled from the moments" + (" — the step declares AdamW" if declared_adamw else "") +
           ". Build torch.optim.AdamW (or keep Adam with weight_decay = 0)")
    return PhaseCheck("update", "the optimizer's weight decay: decoupled (AdamW)", DISAGREE if declared_adamw else
                      SUSPECT, wd, 0.0, "every parameter group", "Adam, L2 through the moments",
                      "AdamW, decoupled", "weight_decay_not_decoupled", why, measure="weight_decay")


def decay_groups_check(state) -> Optional[PhaseCheck]:
    """A disagreement when the recorded optimizer keeps a weight-decay-free group for the biases while norm weights
    (the other 1-D parameters) are in a group with weight decay: a no-decay filter that matched biases but missed the
    norms (names such as ln_1, ln_2, ln_f that its list did not hold); else None."""
    groups = _decay_by_name(state)
    if not groups:
        return None
    vectors = [n for n in groups if n in state.before and state.before[n].ndim == 1]
    biases = [n for n in vectors if n.endswith("bias")]
    norms = [n for n in vectors if not n.endswith("bias")]
    decayed = [n for n in norms if groups[n] > 0]
    if not biases or not decayed or any(groups[n] > 0 for n in biases):
        return None
    wd = max(groups[n] for n in decayed)
    why = (f"the biases are in a group with weight_decay = 0 but {len(decayed)} norm weights are decayed with "
           f"weight_decay = {wd:g}: {', '.join(decayed[:4])}{', …' if len(decayed) > 4 else ''}. A no-decay filter "
           "matched the biases by name and missed the norms (its list names LayerNorm.weight or layer_norm, this "
           "model's are named otherwise), so every update pulls their scales toward 0. Select the no-decay "
           "parameters by shape (ndim < 2) or by module type")
    return PhaseCheck("update", "weight decay: the optimizer's groups leave biases and norm weights undecayed",
                      DISAGREE, len(decayed) / len(norms), 0.0, f"{len(decayed)} of {len(norms)} norm weights",
                      f"weight_decay = {wd:g}", "weight_decay = 0 (as the biases)", "weight_decay_on_norm_weights",
                      why, measure="share of the norm weights in a decayed group")


def _decay_by_name(state) -> dict:
    """{parameter: its group's weight_decay} over the recorded optimizer's groups ({} when it keeps one group)."""
    later = tuple(getattr(state, "optimizer_groups", ()) or ())
    if not later or not state.optimizer_settings:
        return {}
    out = {n: float(state.optimizer_settings.get("weight_decay", 0.0) or 0.0) for n in state.trainable}
    for names, settings in later:
        for n in names:
            out[n] = float((settings or {}).get("weight_decay", 0.0) or 0.0)
    return out


def _linear_fit(u: _Update, d_ref: dict):
    """(code, sentence, fit) of Δθ_recorded ≈ a·Δθ_optimizer (+ c·θ_before); ("", "", fit with its residual)."""
    names, d_rec = u.names, u.d_rec
    th = {n: u.state.before[n].double() for n in names}
    gram = torch.tensor([[_dot(d_ref, d_ref, names), _dot(d_ref, th, names)],
                         [_dot(th, d_ref, names), _dot(th, th, names)]], dtype=torch.float64)
    rhs = torch.tensor([_dot(d_ref, d_rec, names), _dot(th, d_rec, names)], dtype=torch.float64)
    a, c = (float(v) for v in torch.linalg.lstsq(gram, rhs[:, None]).solution.squeeze(1))
    k = _dot(d_rec, d_ref, names) / max(_dot(d_ref, d_ref, names), 1e-300)
    only_a = u.resid({n: k * d_ref[n] for n in names})
    both = u.resid({n: a * d_ref[n] + c * th[n] for n in names})
    lr = u.state.optimizer_settings.get("lr")
    fit = {"kind": "update", "params": {"lr_factor": k, "along_theta": 0.0}, "residual": only_a / u.norm_rec,
           "sentence": ""}
    if only_a <= u.bound and abs(k - 1) > u.tol:
        why = (f"the weights moved {k:.4g} × the recorded optimizer's step: the learning rate applied was "
               f"{k:.4g} × the optimizer's" + (f" ({k * lr:.4g} instead of {lr:.4g}: another step's schedule, or a "
                                               "changed group lr)" if isinstance(lr, (int, float)) else ""))
        return "update_scaled", why, {**fit, "sentence": why}
    if both <= u.bound and abs(c) > 0:
        decay = f" = −lr·λ with λ = {-c / lr:.4g} beyond the recorded weight_decay at lr {lr:.4g}" \
            if isinstance(lr, (int, float)) and lr > 0 else ""
        why = (f"the weights moved {a:.4g} × the optimizer's step plus {c:.4g} × θ{decay}: a component along the "
               "weights that the optimizer's recorded settings do not hold (a changed weight_decay, or an L2 term)")
        return "update_along_weights", why, {**fit, "params": {"lr_factor": a, "along_theta": c},
                                             "residual": both / u.norm_rec, "sentence": why}
    return "", "", fit


def _clamp_fits(u: _Update, d_ref: dict, fit):
    """(code, sentence, fit) of the optimizer's step clamped element-wise (its bound: the largest recorded move), or
    of a gradient clamped element-wise before the step (its bound fitted by a golden-section search)."""
    names = u.names
    m = max(float(u.d_rec[n].abs().max()) for n in names)
    if any(float(d_ref[n].abs().max()) > m * (1 + u.tol) for n in names):
        r = u.resid({n: d_ref[n].clamp(-m, m) for n in names})
        if r <= u.bound:
            why = f"the weights moved by the optimizer's step clamped element-wise to ±{m:.4g}"
            return "update_clamped", why, {"kind": "clamped", "params": {"bound": m}, "residual": r / u.norm_rec,
                                           "sentence": why}
    g = [u.state.gradient[n].double().abs() for n in names]
    top = max(float(x.max()) for x in g)
    if top == 0:
        return "", "", fit
    v = math.exp(golden_min(lambda x: u.resid(u.step(grad_clamp=math.exp(x))), math.log(top) - math.log(1e4),
                            math.log(top), steps=24))
    r = u.resid(u.step(grad_clamp=v))
    if r <= u.bound:
        why = (f"the optimizer stepped on the gradient clamped element-wise to ±{v:.4g} (after the norm clip): a "
               "clip_grad_value_ the declaration does not have")
        return "update_grad_clamped", why, {"kind": "grad_clamped", "params": {"bound": v},
                                            "residual": r / u.norm_rec, "sentence": why}
    return "", "", fit


def _clip_fit(u: _Update, fit):
    """(code, sentence, fit) of the update as the step of the gradient clipped at another global norm c than the
    recorded max_grad_norm (none, or another number): c by a golden-section search of log c below ‖g‖ (where a
    clip binds); ("", "", fit) when no c reproduces it."""
    g = math.sqrt(sum(float(u.state.gradient[n].double().pow(2).sum()) for n in u.names))
    if not (math.isfinite(g) and g > 0):
        return "", "", fit
    log_c = golden_min(lambda x: u.resid(u.step(max_grad_norm=math.exp(x))), math.log(g * 1e-4), math.log(g), 40)
    c = math.exp(log_c)
    r = u.resid(u.step(max_grad_norm=c))
    if r > u.bound or c >= g * (1 - 1e-3):
        return "", "", fit
    shard = _shard_clip(u, g, c) if u.max_grad_norm else None
    if shard is not None:
        return shard
    had = f"the recorded {u.max_grad_norm:g}" if u.max_grad_norm else "none recorded"
    why = (f"the update is the optimizer's step on the gradient clipped to global norm {c:.4g} (‖g‖ = {g:.4g}), "
           f"not at max_grad_norm = {had}: the loop clips at {c:.4g}")
    return "update_clip_norm", why, {"kind": "clip", "params": {"max_grad_norm": c}, "residual": r / u.norm_rec,
                                     "sentence": why}


# a loss scaler's scales: GradScaler starts at 2^16 and halves or doubles from there
LOSS_SCALES = tuple(2.0 ** k for k in (16, 15, 17, 14, 18, 13, 19, 12, 20, 11, 21, 10, 22, 23, 24))
# the names a weight shared by the input embedding and the output head goes by (GPT-2's wte, a tied lm_head)
TIED = ("wte", "embed", "lm_head", "word_embeddings")


def _clip_mechanisms(u: _Update):
    """(code, sentence, fit) of a clip at the recorded max_grad_norm m that divided by another norm than ‖g‖:
    the gradient still multiplied by a loss scaler's scale S (clip before unscale: m / S in effect), or a norm that
    counts a tied weight's gradient twice (√(‖g‖² + ‖g_tied‖²)). Each is one re-run at the threshold it implies; a
    loss scale counts only where S/2 and 2S do not also reproduce the update (else the step cannot tell S)."""
    m = float(u.max_grad_norm)
    sq = {n: float(u.state.gradient[n].double().pow(2).sum()) for n in u.names}
    g = math.sqrt(sum(sq.values()))
    if not (math.isfinite(g) and g > 0):
        return "", "", None

    def holds(threshold: float) -> bool:
        return u.resid(u.step(max_grad_norm=threshold)) <= u.bound
    for scale in LOSS_SCALES:
        if m / scale < g and holds(m / scale) and not holds(m / scale * 2) and not holds(m / scale / 2):
            why = (f"the clip divided by {scale:.0f} × ‖g‖ (= {scale * g:.4g}): clip_grad_norm_ ran on the gradient "
                   f"still multiplied by the loss scaler's scale {scale:.0f} (before scaler.unscale_(optimizer)), so "
                   f"max_grad_norm = {m:g} acted as {m / scale:.3g} on the real gradient (‖g‖ = {g:.4g})")
            return "clip_before_unscale", why, {"kind": "clip_scaled", "params": {"loss_scale": scale},
                                                "residual": None, "sentence": why}
    for n in (n for n in u.names if any(t in n for t in TIED)):
        twice = math.sqrt(g * g + sq[n])
        if m < twice and holds(m * g / twice):
            why = (f"the clip divided by √(‖g‖² + ‖g_{n}‖²) = {twice:.4g}, not ‖g‖ = {g:.4g}: the norm counts "
                   f"{n}'s gradient twice (a weight tied between the input embedding and the output head, listed "
                   "once per name), so every clipped step is smaller than max_grad_norm allows")
            return "grad_norm_counts_shared_twice", why, {"kind": "clip_norm_counts_twice", "params": {
                "parameter": n, "norm_used": twice, "grad_norm": g}, "residual": None, "sentence": why}
    return "", "", None


# the shards a parameter list is cut into (ranks of FSDP / ZeRO): contiguous runs of the parameters, in their order
SHARDS = (2, 4, 8)
# the implied norm must be a shard's to this relative precision (the clip fit's search finds c to ~1e-6): among the
# 28 shard norms tried a chance match is then below 1 in 1,000
SHARD_RTOL = 1e-5


def _shard_clip(u: _Update, g: float, c: float):
    """(code, sentence, fit) when the clip at the recorded max_grad_norm m took its norm over one contiguous shard of
    the parameters (k equal runs of tensors, or of weights), not over them all: the coefficient m / ‖g_shard‖ the
    loop applied equals the fitted c / ‖g‖, and the re-run with it reproduces the update; else None."""
    m = float(u.max_grad_norm)
    names = list(u.names)
    sq = {n: float(u.state.gradient[n].double().pow(2).sum()) for n in names}
    sizes = [u.state.gradient[n].numel() for n in names]
    implied = m * (g + 1e-6) / c - 1e-6                     # the norm the loop divided by
    for k in SHARDS:
        for how, bounds in (("tensors", _cuts([1] * len(names), k)), ("weights", _cuts(sizes, k))):
            for j, (a, b) in enumerate(bounds):
                norm = math.sqrt(sum(sq[n] for n in names[a:b]))
                if not (0 < norm < g and abs(norm - implied) <= SHARD_RTOL * implied):
                    continue
                r = u.resid(u.step(max_grad_norm=m * (g + 1e-6) / (norm + 1e-6)))
                if r > u.bound:
                    continue
                why = (f"the clip's coefficient is max_grad_norm / ‖g‖ over parameters {a + 1}–{b} of {len(names)} "
                       f"(shard {j + 1} of {k}, cut by {how}: ‖g_shard‖ = {norm:.4g}, the whole gradient's ‖g‖ = "
                       f"{g:.4g}): {m:g} / {norm:.4g} where {m:g} / {g:.4g} was due, so the update is "
                       f"{min(1.0, m / norm) / min(1.0, m / g):.3g}× the clipped step. The norm of one rank's shard, "
                       "never reduced over the ranks: clip with the global norm (FSDP's model.clip_grad_norm_, or an "
                       "all-reduce of the squared norms)")
                return "grad_norm_of_shard", why, {"kind": "shard_clip", "params": {
                    "shards": k, "shard": j + 1, "cut_by": how, "shard_norm": norm, "grad_norm": g},
                    "residual": r / u.norm_rec, "sentence": why}
    return None


def _cuts(sizes: list, k: int) -> list:
    """(start, end) of k contiguous runs of items whose sizes are as equal as cutting at item boundaries allows."""
    total, out, start, acc = sum(sizes), [], 0, 0
    for i, s in enumerate(sizes):
        acc += s
        if len(out) < k - 1 and acc >= total * (len(out) + 1) / k:
            out.append((start, i + 1))
            start = i + 1
    out.append((start, len(sizes)))
    return [(a, b) for a, b in out if b > a]


def golden_min(f, lo: float, hi: float, steps: int) -> float:
    """The argmin of a unimodal f on [lo, hi] by golden-section search (one evaluation per step)."""
    phi = (math.sqrt(5) - 1) / 2
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(steps):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2
