"""Checks: is every log-prob the step uses the one it should be?

Two families share one symptom (log-probs that disagree) and are told apart by WHICH pair disagrees and HOW:

* the policy differs from the reference before any update (anchor P1): dropout (two forwards of the same
  weights differ), reference weights not the policy's start (deterministic, large), a reference in another
  precision (deterministic, at the size of that precision's rounding);
* the training log-probs are not the sampler's: temperature missing from the training logits (deterministic,
  one sign on the sampler's likely tokens), wrong position ids (only the left-padded rows), padding inside the
  completion mask (the gap sits after EOS), a sampler in another precision (small, both signs).
"""
from __future__ import annotations

import re

import torch

from rookworld_debug.diagnosis import evidence as E
from rookworld_debug.diagnosis.context import current_step
from rookworld_debug.diagnosis.findings import Finding, Fix

# float32 forwards of the same weights on the same tokens agree to ~1e-6 nats (summation order); anything a
# thousand times larger is not rounding
EXACT = 1e-4
# bf16 keeps 8 mantissa bits: a logit of size ~10 is rounded by up to ~0.04, so a bf16-vs-fp32 forward moves
# token log-probs by O(1e-2) on average; a different set of weights moves them by far more
BF16_MEAN_ABS = 0.05
# a rounding gap: no token off by more than 0.1 nats, the average far below; one token off by a nat is weights
ROUNDING_MAX_ABS, ROUNDING_MEAN_ABS = 0.1, 1e-3

_DROPOUT_FLAG = re.compile(r"(\d+) dropout modules active")
_GAP = ("ℓ − ℓ^ref per masked sampled token (policy minus reference log-prob, tempered logits, fp32 softmax)")
_SGAP = ("ℓ^sampler − ℓ^trainer per masked sampled token: the log-prob the sampling loop saw minus the trainer's "
         "recomputed one (both tempered)")
_REPEAT = ("ℓ(update's grad forward) − ℓ(rollout scoring forward) on the first optimizer step's rows: the same "
           "weights scored twice")


def _dropout_evidence(trace):
    """(non-deterministic forwards seen, the evidence); see `_forward_evidence` for what tells dropout apart."""
    nondet, _, out = _forward_evidence(trace)
    return nondet, out


def _live_dropout(trace) -> int:
    """Dropout modules with p > 0 in training mode in the live policy (0 for a saved trace)."""
    pol = getattr(trace.setup, "policy", None) if trace.setup is not None else None
    try:
        return sum(1 for m in pol.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training)
    except (AttributeError, TypeError):
        return 0


def _forward_evidence(trace):
    """(two forwards of the same weights differ, dropout itself was seen active, the evidence). Dropout is seen
    through modules with p > 0 in training mode (setup, sampling flags, the live policy) or TRL's own settings;
    a gap without any of them is a mismatch between two forward paths, not dropout."""
    inv = trace.setup.invariants if trace.setup is not None else None
    rep = E.repeat_forward_gap(trace)
    out, nondet, seen = [], False, False
    if rep is not None:
        st = E.stats(rep)
        out.append(E.ev("repeat_forward_max_abs", st["max_abs"], _REPEAT, where="report: Update"))
        nondet = st["max_abs"] > EXACT
    if inv is not None:
        out.append(E.ev("step0_ratio_dev", inv.max_ratio_dev, "max |exp(ℓ − ℓ_again) − 1| between two identical "
                        "forwards of the dataset completions at setup", "dataset completions", "report: Step-0 invariants"))
        nondet = nondet or inv.max_ratio_dev > EXACT or bool(inv.dropout_active)
        if inv.dropout_active:
            seen = True
            out.append(E.ev("dropout_modules_active", len(inv.dropout_active), "modules with p > 0 in training mode "
                            "at setup", "model", "report: Step-0 invariants"))
    counts = [int(m.group(1)) for f in trace.flags for m in [_DROPOUT_FLAG.search(f)] if m]
    live = _live_dropout(trace)
    if counts or live:
        nondet = seen = True
        out.append(E.ev("dropout_modules_active_in_sampling", max(counts + [live]), "dropout modules with p > 0 in "
                        "train mode while the rollout was sampled and scored", "model", "step log: WARNINGS"))
    return nondet, seen, out


def check_dropout(trace) -> list[Finding]:
    """Dropout active: the same weights scored twice give different log-probs (and the reference, in eval mode,
    disagrees with the policy before any update)."""
    nondet, seen, evs = _forward_evidence(trace)
    gap = E.ref_gap(trace)
    cap = trace.capture
    if not nondet and cap is not None and gap is not None and E.before_any_update(trace, current_step()):
        # a TRL capture holds one forward: TRL's own dropout switch says whether the policy ran in train mode
        cfg = cap.grpo_config or {}
        st = E.stats(gap)
        if cfg.get("disable_dropout") is False and st["mean_abs"] > EXACT:
            nondet = seen = True
            evs.append(E.ev("disable_dropout", 0.0, "GRPOConfig.disable_dropout (False: TRL leaves the policy's "
                            "dropout on in training mode while the reference runs in eval mode)", "config"))
    if not nondet and cap is not None:
        # no reference forward to compare (β = 0): TRL's own settings say whether dropout ran
        p = dropout_on_in_trl(cap)
        if p:
            nondet = seen = True
            evs.append(E.ev("model_dropout", p, "largest *_pdrop the policy was loaded with (GRPOConfig."
                            "model_init_kwargs), left on by disable_dropout=False", "config"))
    if not nondet:
        return []
    if not seen:
        return _forward_mismatch(trace, evs)
    if gap is not None:
        st = E.stats(gap)
        evs.insert(0, E.ev("step0_logp_gap_mean_abs", st["mean_abs"], "mean |" + _GAP + "| at the step's start",
                           where="report: Step-0 invariants / token view"))
        evs.insert(1, E.ev("kl", trace.loss.kl, "TRL `kl`: token mean of the KL estimator (raw, not β-scaled)",
                           where="report: Loss decomposition"))
    return [Finding(
        code="dropout_active", severity="error",
        cause="Dropout is active: the same weights give different log-probs on every forward, so the KL to the "
              "(eval-mode) reference, the PPO ratio and the gradient are noise, not the policy's.",
        evidence=tuple(evs),
        fix=Fix("Put the policy in eval mode / zero its dropout before sampling and scoring (TRL: "
                "disable_dropout=True).", grpo_config={"disable_dropout": True},
                code_change="load the policy with load_policy_and_reference (dropout zeroed) or call "
                            "model.eval() and never model.train() before the step"),
        alternatives=("reference_not_start: a reference from other weights also gives a step-0 gap, but a "
                      "deterministic one",), score=10.5, step=E.step_of(trace, current_step()))]


def _forward_mismatch(trace, evs) -> list[Finding]:
    return [Finding(
        code="forward_mismatch", severity="error",
        cause="Two forwards of the same weights on the same tokens give different log-probs (the update's "
              "gradient forward vs the rollout's scoring forward), and no dropout module was found active: the two "
              "paths do not compute the same function, so the PPO ratio and the gradient describe another policy.",
        evidence=tuple(evs),
        fix=Fix("Score the rollout and compute the gradient with one forward function: same temperature, position "
                "ids, precision/autocast, mask and model mode.",
                code_change="one scoring function for the rollout's log-probs and the update's forward"),
        alternatives=("dropout_active: dropout switched on where the records do not show it",
                      "another precision or autocast in one of the two forwards",
                      "temperature or position ids applied in one path only",
                      "non-deterministic kernels (GPU atomics) — tiny gaps only"),
        score=10.4, step=E.step_of(trace, current_step()))]


def check_reference(trace) -> list[Finding]:
    """Before any update the policy IS the reference: their log-probs must agree exactly. A deterministic gap is
    other weights (large) or another precision (at rounding size)."""
    if not E.before_any_update(trace, current_step()):
        return []
    gap = E.ref_gap(trace)
    if gap is None:
        return []
    st = E.stats(gap)
    if st["max_abs"] <= EXACT:
        return []
    if _trainer_is_odd(trace, st):
        return []                                   # the sampler agrees with the reference: the sampler checks
    nondet, _ = _dropout_evidence(trace)
    if nondet or (trace.capture is not None and (trace.capture.grpo_config or {}).get("disable_dropout") is False):
        return []                                   # dropout explains a step-0 gap (check_dropout)
    evs = (E.ev("step0_logp_gap_mean_abs", st["mean_abs"], "mean |" + _GAP + "| before any update",
                where="report: Step-0 invariants / token view"),
           E.ev("step0_logp_gap_max_abs", st["max_abs"], "max |" + _GAP + "|"),
           E.ev("step0_logp_gap_pos_share", st["pos_share"], "share of tokens with ℓ > ℓ^ref"),
           E.ev("kl", trace.loss.kl, "TRL `kl`: token mean of the KL estimator (raw)", where="report: Loss decomposition"))
    dtypes = _dtypes(trace)
    if dtypes is not None:
        rounding = dtypes[0] != dtypes[1]
        evs = (*evs, E.ev("policy_reference_dtype_differ", float(rounding), f"policy {dtypes[0]} vs reference "
                          f"{dtypes[1]} (the loaded models)", "model"))
    else:       # rounding moves a token's log-prob by O(eps·|logit|): never a whole nat, and ~0 on average
        rounding = st["max_abs"] <= ROUNDING_MAX_ABS and st["mean_abs"] <= ROUNDING_MEAN_ABS
    step = E.step_of(trace, current_step())
    if rounding:
        return [Finding(
            code="reference_precision", severity="error",
            cause="The reference runs in another precision than the policy: before any update their log-probs "
                  "differ by rounding-sized amounts of both signs, so the KL and its gradient start off zero.",
            evidence=evs, fix=Fix("Load the reference in the policy's dtype (float32 on CPU).",
                                  step_config={"dtype": "float32", "autocast": "off"},
                                  grpo_config={"model_init_kwargs": {"dtype": "float32"}},
                                  code_change="create the reference with the same dtype/autocast as the policy"),
            alternatives=("reference_not_start: weights that differ slightly (e.g. one tiny update) give a gap "
                          "of the same size",), score=10.0, step=step)]
    return [Finding(
        code="reference_not_start", severity="error",
        cause="The reference is not the policy's starting weights: before any update the policy's log-probs "
              "differ from the reference's on every token, deterministically, so β·KL pulls toward other weights.",
        evidence=evs, fix=Fix("Load the reference from the same weights as the policy's start.",
                              code_change="build the reference from the policy's own path/state_dict (TRL "
                                          "reloads it from model.config._name_or_path)"),
        alternatives=("reference_precision: a much smaller gap of both signs would be precision",
                      "a policy that was already trained (a later step or a resumed run) is not a fault"),
        score=10.0, step=step)]


def _trainer_is_odd(trace, st) -> bool:
    """True when the sampler's log-probs agree with the reference's far better than the trainer's do: the policy
    and the reference are the same weights, and it is the trainer's forward that computes something else."""
    r = trace.rollout
    s = r.sampling_per_token_logps
    if s is None or r.ref_per_token_logps is None:
        return False
    m = E.mask(trace)
    d = (s.float() - r.ref_per_token_logps.float())[m]
    d = d[~torch.isnan(d)]
    if d.numel() == 0:
        return False
    return float(d.abs().mean()) <= 0.1 * st["mean_abs"] and float(d.abs().max()) < st["max_abs"]


def _dtypes(trace):
    """(policy compute dtype, reference compute dtype): the live models', else what the trace recorded
    (setup provenance "precision"); None when neither is known (an older saved trace)."""
    s = trace.setup
    pol, ref = getattr(s, "policy", None), getattr(s, "reference", None)
    try:
        return str(next(pol.parameters()).dtype), str(next(ref.parameters()).dtype)
    except (AttributeError, StopIteration, TypeError):
        pass
    prec = recorded_precision(trace)
    if prec and "policy" in prec and "reference" in prec:
        return prec["policy"], prec["reference"]
    return None


def recorded_precision(trace) -> dict:
    """{"policy" | "reference" | "sampler": compute dtype} as the trace's setup recorded them ({} if it did not)."""
    prov = getattr(trace.setup, "provenance", None) if trace.setup is not None else None
    prec = prov.get("precision") if isinstance(prov, dict) else None
    if not isinstance(prec, dict):
        return {}
    return {k: str(v.get("compute")) for k, v in prec.items()
            if isinstance(v, dict) and isinstance(v.get("compute"), str)}


def dropout_on_in_trl(cap) -> float:
    """The largest *_pdrop a TRL run loaded its policy with while disable_dropout=False (0.0: dropout off)."""
    cfg = cap.grpo_config or {}
    kw = cfg.get("model_init_kwargs") or {}
    if cfg.get("disable_dropout") is not False or not isinstance(kw, dict):
        return 0.0
    return max([float(v) for k, v in kw.items() if str(k).endswith("pdrop") and isinstance(v, (int, float))] or [0.0])
