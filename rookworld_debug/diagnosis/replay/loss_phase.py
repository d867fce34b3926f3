"""The loss phase of a replay, recomputed without weights: the declared objective's loss from the recorded log-probs,
π_old, reference and advantages over the loop's micro-batches, and the loss computed otherwise (one known mistake
at a time) for the fit of a disagreement.

Shape legend: N rows (B groups of G), T completion tokens.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from rookworld_debug.grpo.families import families
from rookworld_debug.grpo.objective.aggregation import fixed_length
from rookworld_debug.grpo.objective.loss import compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.objective.terms import clipped_surrogate
from rookworld_debug.grpo.phases.generation import loss_mask

from .compare import DISAGREE, VALUE_TOL, scalar, skipped
from .records import PhaseCheck, fmt


def loss_value(trace) -> tuple[float, str]:
    """(the loss the step reported, whose)."""
    if trace.recorded is not None:
        return float(trace.recorded.loss), "the loop's backpropagated loss"
    if trace.capture is not None:
        return float(trace.capture.trl_loss), "TRL's loss (Σ of its micro-batch losses)"
    # a run_step trace: its loss record (the update's own forward is compared with it by the loss-path check)
    return float(trace.loss.loss), "the loss record"


def accumulation(trace) -> int:
    """g, the count each micro-batch's loss is divided by: the declared gradient_accumulation_steps (TRL divides by
    it whatever the rows' split), 1 for a trace that was not recorded by a loop."""
    if trace.capture is not None:                 # TRL divides each micro-batch's loss by its accumulation steps
        return max(1, int(trace.capture.gradient_accumulation_steps))
    return max(1, int(trace.recorded.gradient_accumulation_steps)) if trace.recorded is not None else 1


def micro_batches(trace) -> list:
    """The rows of each micro-batch the recorded loss was summed over: `gradient_accumulation_steps` contiguous,
    equal chunks (torch.chunk) — the layout a recorder declares; TRL scales each one's loss by its own count."""
    n = trace.rollout.completion_ids.shape[0]
    if trace.capture is not None and trace.capture.micro_batch_rows:     # TRL's own (shuffled) micro-batches
        return [torch.tensor(rows, dtype=torch.long) for rows in trace.capture.micro_batch_rows]
    ga = trace.recorded.gradient_accumulation_steps if trace.recorded is not None else 1
    return list(torch.arange(n).chunk(max(1, min(int(ga), n))))


def loss_total(trace, objective, logps, old, ref, adv, weights=None):
    """Σ over the micro-batches of the declared loss (a 0-dim tensor, differentiable through `logps`), each
    micro-batch's loss times its weight (`micro_batch_weights` unless given)."""
    parts = loss_parts(trace, objective, logps, old, ref, adv)
    weights = micro_batch_weights(trace, objective) if weights is None else weights
    total = 0.0
    for b, w in zip(parts, weights):
        total = total + (b.loss if w == 1.0 else b.loss * w)
    return total


def loss_rule(loss_type: str):
    """The loss type's row of its family's loss table (grpo.registry.LossRule), None for an unknown one."""
    return next((f.rules[loss_type] for f in families() if loss_type in f.rules), None)


def row_normalised(loss_type: str) -> bool:
    """The loss divides each micro-batch's loss by its own row count (its family's micro-batch weighting "rows":
    a per-row mean, dr_grpo's N·L_max)."""
    rule = loss_rule(loss_type)
    return rule is not None and rule.weighting == "rows"


def micro_batch_weights(trace, objective) -> list:
    """Each micro-batch's weight on its loss as computed per micro-batch (÷ its own rows, ÷ k): 1 where the
    micro-batches hold equal rows (the declared objective exactly) or for TRL (its micro-batches are equal by
    construction); for a loop's micro-batches of unequal size under a row-normalised loss, n_j·k / N, so that every
    row of the batch weighs alike, as the declared objective over the batch does."""
    chunks = micro_batches(trace)
    sizes = [len(rows) for rows in chunks]
    if trace.recorded is None or not row_normalised(objective.loss_type) or len(set(sizes)) < 2:
        return [1.0] * len(chunks)
    return [n_j * len(chunks) / sum(sizes) for n_j in sizes]


def loss_parts(trace, objective, logps, old, ref, adv) -> list:
    """Each micro-batch's LossBreakdown of the declared loss, in the loop's order."""
    r = trace.rollout
    mask = loss_mask(r, trace.config)
    entropy = recorded_entropy(trace)

    def pick(x, rows):
        return None if x is None else x[rows]
    return [compute_loss(pick(logps, rows), pick(old, rows), pick(ref, rows), adv[rows], mask[rows], objective,
                         LossBatch(entropy=pick(entropy, rows), num_items_in_batch=_num_items(trace, mask),
                                   gradient_accumulation_steps=accumulation(trace), num_generations=None))
            for rows in micro_batches(trace)]


def recorded_old(trace):
    """(N, T) π_old's log-probs as the step recorded them (a loop's record, or TRL's kept on a later pass), None on a
    first pass that kept none."""
    if trace.recorded is not None:
        return trace.recorded.old_per_token_logps
    return getattr(trace.capture, "old_per_token_logps", None) if trace.capture is not None else None


def _num_items(trace, mask):
    """The token count a token-normalised loss divides by: TRL's recorded count for a capture, else Σ mask."""
    if trace.capture is not None and math.isfinite(trace.capture.num_items_in_batch):
        return torch.tensor(float(trace.capture.num_items_in_batch))
    return mask.sum()


def recorded_entropy(trace):
    """(N, T) the per-token entropy the step kept (a run_step trace's), None when it has none (a loop's record)."""
    ent = trace.rollout.per_token_entropy
    m = trace.rollout.completion_mask.bool()
    return ent if ent is not None and bool(torch.isfinite(ent[m]).all()) else None


def loss_check(trace) -> PhaseCheck:
    """The declared objective's loss from the recorded log-probs, π_old, reference and advantages."""
    recorded, whose = loss_value(trace)
    q = f"loss: {whose} against the declared objective ({trace.config.loss_type}, β = {trace.config.beta:g})"
    if not math.isfinite(recorded):
        if trace.recorded is not None and "loss" in trace.recorded.recorded:
            return PhaseCheck("loss", q, DISAGREE, math.inf, VALUE_TOL, "the step's total", fmt(recorded), "finite",
                              "loss_not_finite", "the loss the loop backpropagated is not a finite number",
                              measure="|recorded − recomputed|")
        return skipped("loss", q, "the loss was not recorded")
    if trace.capture is not None:          # TRL scales per micro-batch: the capture recomputed it that way
        check = scalar("loss", q, recorded, float(trace.capture.recomputed_loss), VALUE_TOL)
        # the variants (and the generic recomputation they rest on) only where the loss disagrees
        return check if check.status != DISAGREE else scalar("loss", q, recorded, float(trace.capture.recomputed_loss),
                                                             VALUE_TOL, variants=_capture_variants(trace))
    if trace.config.beta and trace.rollout.ref_per_token_logps is None:
        return skipped("loss", q, f"β = {trace.config.beta:g} needs the reference's log-probs, which were not "
                                  "recorded (StepRecorder.logprobs(ref=...))")
    if trace.config.entropy_coef and recorded_entropy(trace) is None:
        return skipped("loss", q, f"entropy_coef = {trace.config.entropy_coef:g} needs the per-token entropy, which "
                                  "the step did not keep (its gradient is replayed from the weights)")
    r, adv = trace.rollout, trace.advantages.advantages
    old = recorded_old(trace)
    ob = Objective.from_config(trace.config)
    value = float(loss_total(trace, ob, r.per_token_logps, old, r.ref_per_token_logps, adv))
    return scalar("loss", q, recorded, value, VALUE_TOL, variants=_safe(loss_variants(trace, ob, old, value)))


def _capture_variants(trace) -> dict:
    """A TRL capture's loss variants, where the declared loss over the capture's micro-batches reproduces the
    capture's own recomputation (then each variant is that same computation with one thing changed); else none."""
    value = _reproduced_capture_loss(trace)
    if value is None:
        return {}
    return _safe(loss_variants(trace, Objective.from_config(trace.config), recorded_old(trace), value))


def _reproduced_capture_loss(trace) -> Optional[float]:
    """The declared loss over a capture's micro-batches where it reproduces the capture's own recomputation (the
    generic path holds for this capture's shape), else None."""
    value = _generic_loss(trace)
    if value is None or not abs(value - float(trace.capture.recomputed_loss)) <= VALUE_TOL * max(1.0, abs(value)):
        return None
    return value


def _generic_loss(trace) -> Optional[float]:
    """The declared loss of `trace` over its micro-batches (None where the step lacks an input it needs)."""
    r = trace.rollout
    old = recorded_old(trace)
    if r.per_token_logps is None or (trace.config.beta and r.ref_per_token_logps is None):
        return None
    try:
        return float(loss_total(trace, Objective.from_config(trace.config), r.per_token_logps, old,
                                r.ref_per_token_logps, trace.advantages.advantages))
    except Exception:  # noqa: BLE001 - a capture shape the generic path cannot take
        return None


def recaptured(trace, other):
    """`other` (a TRL capture's trace under another declaration) with the capture's recomputed loss taken under
    that declaration, where the declared loss over the capture's micro-batches reproduces the capture's own
    recomputation under its config; else `other` as it is (its loss then cannot agree under the neighbour)."""
    if _reproduced_capture_loss(trace) is None:
        return other
    there = _generic_loss(other)
    return other if there is None else dataclasses.replace(other, capture=dataclasses.replace(
        other.capture, recomputed_loss=there))


def loss_variants(trace, ob, old, value: float) -> dict:
    """{code: (the loss total computed otherwise, the sentence)}: the declared loss (`value`) with one known
    mistake in it (a sign, a missing or reversed KL, a clip bound, the ratio, another aggregation, an input wired in
    another's place)."""
    r, adv = trace.rollout, trace.advantages.advantages
    ref, lp = r.ref_per_token_logps, r.per_token_logps

    def v(objective=ob, a=adv, reference=ref, logps=lp, old_=old):
        return lambda: float(loss_total(trace, objective, logps, old_, reference, a))
    no_kl = v(objective=ob.replace(beta=0.0))
    variants = {"loss_advantage_sign": (v(a=-adv), "the loss uses −A: it pushes down the better completions"),
                # the loss is linear in β: L(−β) = 2·L(0) − L(β)
                "kl_sign_flipped": ((lambda: 2 * no_kl() - value) if ob.beta else None,
                                    "the KL term enters with −β: it pushes the policy away from the reference"),
                "kl_not_applied": (no_kl if ob.beta else None, "the loss leaves out the β·KL term"),
                # k3 of d = ℓ − ℓ_ref is k3 of the declared d = ℓ_ref − ℓ with the reference 2ℓ − ℓ_ref
                "kl_direction_reversed": (v(reference=2 * lp - ref) if ob.beta and ref is not None and
                                          ob.kl_estimator == "k3" else None,
                                          "the KL term is k3 of d = ℓ − ℓ_ref, not of d = ℓ_ref − ℓ: exp(ℓ − ℓ_ref) − "
                                          "(ℓ − ℓ_ref) − 1, the estimator of the other direction (the log-ratio's "
                                          "sign swapped inside k3)"),
                "clip_bound_reversed": (clip_bound_reversed(trace, ob, lp, old, ref, adv),
                                        "the clipped surrogate takes the optimistic bound −max(r·A, clip(r)·A), not "
                                        "the pessimistic −min(r·A, clip(r)·A): where the ratio left the clip range "
                                        "on the side the advantage favours, the update is not clipped"),
                **ratio_variants(trace, ob, lp, old, ref, adv)}
    for lt in sorted({lt for fam in families() for lt in fam.rules} - {ob.loss_type}):
        variants[f"loss_aggregation/{lt}"] = (v(objective=ob.replace(loss_type=lt)),
                                              f"the loss equals loss_type={lt!r}'s aggregation, not the declared "
                                              f"{ob.loss_type!r}'s")
    for name, (kw, sentence) in wiring(trace, old).items():
        variants[f"loss_wiring/{name}"] = (v(**kw), sentence)
    variants.update(micro_batch_normaliser(trace, ob, v))
    variants.update(row_normalisers(trace, ob, lp, old, ref, adv))
    weights = micro_batch_weights(trace, ob)
    if any(w != 1.0 for w in weights):
        sizes = ", ".join(str(len(rows)) for rows in micro_batches(trace))
        variants["micro_batches_weighted_equally"] = (
            lambda: float(loss_total(trace, ob, lp, old, ref, adv, weights=[1.0] * len(weights))),
            f"each micro-batch's loss is its own rows' mean ÷ k = {len(weights)}, over micro-batches of {sizes} rows: "
            "the micro-batches weigh alike, so a row of a smaller micro-batch weighs more than a row of a larger one "
            f"(the declared objective weighs every row 1/{sum(len(r) for r in micro_batches(trace))}); divide each "
            "micro-batch's row sum by the batch's rows instead")
    return variants


def gradient_confirms(trace, cause: str, fit: Optional[dict]) -> bool:
    """Whether a gradient's fit (`fit`: its micro-batch weights, or one scale) is what the loss variant `cause`
    predicts, within 1 %: each micro-batch's loss divided by its own tokens weighs micro-batch j by W / W_j (W the
    window's tokens) against the declared 1; micro-batches weighed alike weigh j by 1 / w_j (w_j its declared
    weight, `micro_batch_weights`)."""
    if not fit:
        return False
    if cause == "loss_normalised_per_micro_batch":
        mask = loss_mask(trace.rollout, trace.config)
        tokens = [float(mask[rows].sum()) for rows in micro_batches(trace)]
        want = [sum(tokens) / max(t, 1.0) for t in tokens]
    elif cause == "micro_batches_weighted_equally":
        want = [1.0 / w for w in micro_batch_weights(trace, Objective.from_config(trace.config))]
    else:
        return False
    if fit.get("kind") == "scaled":
        got = [float(fit["params"]["scale"])] * len(want)
    elif fit.get("kind") == "micro_batches":
        got = [float(x["fitted"]) for x in fit["params"].values()]
    else:
        return False
    return len(got) == len(want) and all(abs(g - x) <= 0.01 * x for g, x in zip(got, want))


def scaled_gradient_mechanism(trace, k: float) -> Optional[tuple]:
    """(code, sentence) of a gradient that is k × the declared loss's, where k is what a row-normalised loss summed
    over its rows gives (each micro-batch's row count, all equal, within 1 %): the loss value can agree (Σ A = 0 on a
    first pass) while its gradient shows the missing ÷ N; else None."""
    sizes = [len(rows) for rows in micro_batches(trace)]
    if not row_normalised(trace.config.loss_type) or len(set(sizes)) != 1 or sizes[0] < 2 or \
            not abs(k - sizes[0]) <= 0.01 * sizes[0] or abs(k - accumulation(trace)) <= 0.01 * k:
        return None         # (a k that is also the accumulation steps: the losses not divided by k, as likely)
    return "loss_summed_over_rows", (
        f"the recorded gradient is {k:.4g} × the loss's gradient, {k:.4g} = {sizes[0]} rows per micro-batch: each "
        f"micro-batch's loss sums its rows' terms instead of averaging them ({trace.config.loss_type}'s ÷ N missing), "
        "so the learning rate and β act that many times stronger (its value can still agree: Σ A = 0 in a group)")


def row_normalisers(trace, ob, lp, old, ref, adv) -> dict:
    """A row-normalised loss (a per-row mean, dr_grpo's N·L_max) with the rows summed instead of averaged (each
    micro-batch's loss × its n_j rows), and dr_grpo's constant L_max replaced by the batch's padded width T."""
    if not row_normalised(ob.loss_type):
        return {}
    sizes = [len(rows) for rows in micro_batches(trace)]
    weights = micro_batch_weights(trace, ob)
    out = {"loss_summed_over_rows": (
        lambda: float(loss_total(trace, ob, lp, old, ref, adv, weights=[n * w for n, w in zip(sizes, weights)])),
        f"each micro-batch's loss sums its rows' terms instead of averaging them ({ob.loss_type}'s ÷ N missing): "
        f"the loss and its gradient are the micro-batch's row count ({', '.join(map(str, sizes[:6]))}) times too "
        "large, so the learning rate and β act that many times stronger")}
    width = int(trace.rollout.completion_ids.shape[1])
    if loss_rule(ob.loss_type).aggregation is fixed_length and width != ob.max_completion_length:
        out["dr_grpo_normaliser_not_constant"] = (
            lambda: float(loss_total(trace, ob.replace(max_completion_length=width), lp, old, ref, adv)),
            f"dr_grpo's normaliser is N × the batch's padded completion width ({width}), not N × "
            f"max_completion_length ({ob.max_completion_length}): it changes with the longest completion of each "
            "batch, so the loss's scale is no longer constant (Dr. GRPO's point); divide by max_completion_length")
    return out


def micro_batch_normaliser(trace, ob, v) -> dict:
    """The token-normalised loss (dapo: Σ m·ℓ ÷ the accumulation window's tokens) with each micro-batch's loss
    divided by its OWN tokens instead and not by the k accumulation steps: Σ_j Σ_{t∈j} m·ℓ / Σ_{t∈j} m, which is k
    × bnpo's aggregation (bnpo divides each micro-batch's token mean by k). `v`: loss_variants' evaluator."""
    mbs, k = micro_batches(trace), accumulation(trace)
    rule = loss_rule(ob.loss_type)      # dapo: a global token normaliser over the clipped surrogate
    if rule is None or rule.weighting != "global" or rule.objective is not clipped_surrogate or len(mbs) < 2:
        return {}
    mask = loss_mask(trace.rollout, trace.config)
    tokens = ", ".join(str(int(mask[rows].sum())) for rows in mbs[:6]) + (", …" if len(mbs) > 6 else "")
    bnpo = v(objective=ob.replace(loss_type="bnpo"))
    return {"loss_normalised_per_micro_batch": (
        lambda: k * bnpo(),
        f"each of the {len(mbs)} micro-batches' losses is divided by its own token count ({tokens}), not by the "
        f"accumulation window's {int(sum(mask[rows].sum() for rows in mbs))} tokens, and the k = {k} losses are "
        "summed undivided: the gradient-accumulation normaliser bug (a micro-batch's tokens weigh by the inverse of "
        "its size); pass the window's token count (num_items_in_batch) to every micro-batch's loss")}


# the token-level clipped families whose loss sums masked per-token terms with fixed weights (linear in them)
LINEAR_CLIP_TYPES = ("grpo", "dapo", "bnpo", "dr_grpo")


def _per_token_clipped(ob) -> bool:
    """The loss sums masked per-token clipped terms with fixed weights: a linear family, token-level ratios, no
    two-sided δ bound."""
    return ob.loss_type in LINEAR_CLIP_TYPES and ob.importance_sampling_level == "token" and ob.delta is None


def clip_bound_reversed(trace, ob, lp, old, ref, adv):
    """The loss with −max(r·A, clip(r)·A) per token for the declared −min (a callable), or None where the loss is
    not a sum of per-token clipped terms or the step has no π_old (on the first pass r = 1: the bounds agree). Per
    token −max(a, b) = −a − b + min(a, b), so L_max = L_free(ℓ) + L_free(ℓ_c) − L_min(ℓ) on the policy terms alone
    (β = c_H = 0), plus the declared loss's other terms once: L_free clips nothing, ℓ_c is π_old plus the log-ratio
    clamped to the clip range (its ratio is clip(r))."""
    if old is None or not _per_token_clipped(ob):
        return None
    pg = ob.replace(beta=0.0, entropy_coef=0.0)
    free = pg.replace(epsilon_low=1.0 - 1e-12, epsilon_high=1e12)          # a clip range no ratio leaves
    clipped = old + (lp - old).clamp(math.log(1.0 - ob.epsilon_low), math.log(1.0 + ob.epsilon_high))

    def total():
        def f(o, logps):
            return float(loss_total(trace, o, logps, old, ref, adv))
        return f(free, lp) + f(free, clipped) - 2 * f(pg, lp) + f(ob, lp)
    return total


# the dual clip's constant c of −max(min(r·A, clip(r)·A), c·A) for A < 0 (verl's clip_ratio_c, its default)
DUAL_CLIP_C = 3.0


def ratio_variants(trace, ob, lp, old, ref, adv) -> dict:
    """{code: (the loss total, the sentence)} of the importance ratio computed otherwise than declared: in bfloat16
    or float16, clipped in log space or at ε below (not 1 − ε), or cut by a dual clip applied to every advantage's
    sign. Only for the
    token-level clipped families (the ratio's precision and its clip range only with a recorded π_old: on a first
    pass r = 1)."""
    if not _per_token_clipped(ob):
        return {}
    out = {"dual_clip_positive_advantages": (
        lambda: _dual_clip_every_sign(trace, ob, lp, old, ref, adv),
        f"the dual clip min(PG, −c·A) with c = {DUAL_CLIP_C:g} is applied to every token, not only where A < 0: at a "
        "ratio near 1 a positive advantage's term becomes the constant −c·A, and those completions get no gradient")}
    if old is None:
        return out

    def low_precision(dtype):
        # the ratio exp(ℓ − ℓ_old) in `dtype` wherever it enters (the surrogate, a bias-corrected KL's weight): ℓ'
        # = ℓ_old + log r', with the reference moved alike so that the KL's d = ℓ_ref − ℓ is unchanged
        def total():
            moved = old + torch.exp((lp - old).to(dtype)).float().log()
            return float(loss_total(trace, ob, moved, old, None if ref is None else ref + (moved - lp), adv))
        return total
    def summed():
        # one ratio per row, exp(Σ_t m·(ℓ − ℓ_old)): the product of its token ratios, not their geometric mean
        m = loss_mask(trace.rollout, trace.config).to(lp.dtype)                                   # (N, T)
        moved = old + ((lp - old) * m).sum(1, keepdim=True).expand_as(lp)
        return float(loss_total(trace, ob, moved, old, None if ref is None else ref + (moved - lp), adv))
    out["sequence_ratio_not_length_normalised"] = (
        summed, "each row's importance ratio is exp(Σ_t (ℓ − ℓ_old)), its summed log-ratio, applied to every token: "
                "the product of the token ratios, not their length-normalised mean (GSPO divides by the length), so "
                "a long completion's ratio leaves the clip range at the smallest drift")
    lo, hi = ob.epsilon_low, ob.epsilon_high
    log_range = ob.replace(epsilon_low=1.0 - math.exp(-lo), epsilon_high=math.exp(hi) - 1.0)
    out.update({f"ratio_low_precision/{name}": (low_precision(dt), f"the importance ratio exp(ℓ − ℓ_old) is computed "
                                                                   f"in {name} (the log-ratio cast down before the "
                                                                   "exponential): its rounding moves the clipped "
                                                                   "surrogate; take the ratio in float32")
                for dt, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"))})
    out["clip_range_log_scale"] = (
        lambda: float(loss_total(trace, log_range, lp, old, ref, adv)),
        f"the ratio is clipped in log space, exp(clamp(ℓ − ℓ_old, −ε, ε)): the range [e^−ε, e^ε] = "
        f"[{math.exp(-lo):.4g}, {math.exp(hi):.4g}] where the declared [1 − ε, 1 + ε] = [{1 - lo:.4g}, {1 + hi:.4g}]")
    unclipped = {"clip_not_applied": (dict(epsilon_low=1.0 - 1e-12, epsilon_high=1e12), "neither bound"),
                 "clip_upper_not_applied": (dict(epsilon_high=1e12), f"no upper bound (the declared 1 + ε_high = "
                                                                    f"{1 + hi:.4g})"),
                 "clip_lower_not_applied": (dict(epsilon_low=1.0 - 1e-12), f"no lower bound (the declared 1 − ε = "
                                                                          f"{1 - lo:.4g})")}
    for code, (eps, which) in unclipped.items():
        out[code] = ((lambda eps=eps: float(loss_total(trace, ob.replace(**eps), lp, old, ref, adv))),
                     f"the surrogate clips the ratio with {which}: a ratio that left the clip range keeps its full "
                     "gradient, so a later pass over the rollout moves the policy past the trust region")
    if 0.0 < lo < 0.5:                          # ε and 1 − ε apart: the two lower bounds clip different ratios
        out["clip_range_lower_bound"] = (
            lambda: float(loss_total(trace, ob.replace(epsilon_low=1.0 - lo), lp, old, ref, adv)),
            f"the ratio's lower clip bound is ε = {lo:g}, not 1 − ε = {1 - lo:g}: clamp(r, ε, 1 + ε), so a ratio that "
            f"fell below {1 - lo:g} (a token the update already made less likely) is not clipped")
    return out


def _dual_clip_every_sign(trace, ob, lp, old, ref, adv) -> float:
    """The declared loss with each token's policy term PG replaced by min(PG, −c·A) for every sign of A: the linear
    families weigh each row's tokens alike, so the change is Σ_i w_i·Σ_t (min(PG, −c·A) − PG)_it with w_i the row's
    weight in the aggregate (its per-row PG over its tokens' PG)."""
    pg = ob.replace(beta=0.0, entropy_coef=0.0)
    total = float(loss_total(trace, ob, lp, old, ref, adv))
    for b in loss_parts(trace, pg, lp, old, ref, adv):
        per_row = b.per_token_pg.sum(-1)                                                       # (n,)
        w = torch.where(per_row != 0, b.per_seq_pg / per_row.where(per_row != 0, torch.ones_like(per_row)),
                        torch.zeros_like(per_row))                                             # (n,)
        cut = torch.minimum(b.per_token_pg, -DUAL_CLIP_C * b.advantages[:, None]) - b.per_token_pg   # (n, T)
        total += float((w[:, None] * cut * b.completion_mask).sum())
    return total


def beta_from_total(trace) -> float | None:
    """The β under which the declared objective's loss equals the recorded total (the loss is affine in β:
    L(β) = L(0) + β·(L(1) − L(0))); None where the step has no reference log-probs, no recorded loss, or no KL.
    One number fits one β: a candidate only, which the loss phase's gradient must confirm."""
    r = trace.rollout
    recorded, _ = loss_value(trace)
    if r.ref_per_token_logps is None or not math.isfinite(recorded):
        return None
    old = recorded_old(trace)
    ob = Objective.from_config(trace.config)
    adv = trace.advantages.advantages
    l0, l1 = (float(loss_total(trace, ob.replace(beta=b), r.per_token_logps, old, r.ref_per_token_logps, adv))
              for b in (0.0, 1.0))
    if not abs(l1 - l0) > 1e-12:
        return None
    b = (recorded - l0) / (l1 - l0)
    return b if b > 0 and math.isfinite(b) else None


def wiring(trace, old) -> dict:
    """{name: (the loss's inputs with one recorded tensor in another's place, the sentence)}: the loss wired to the
    wrong input of the same shape (π_old, the reference, the rewards)."""
    r = trace.rollout
    ref, out = r.ref_per_token_logps, {}
    if ref is not None:
        out["old=ref"] = (dict(old_=ref), "the policy ratio is taken against the reference's log-probs, not π_old's "
                                          "(the tensor for the reference is passed where π_old belongs)")
        if old is not None:
            out["ref=old"] = (dict(reference=old), "the KL term is taken against π_old's log-probs, not the "
                                                   "reference's (π_old's tensor is passed where the reference belongs)")
            out["swapped"] = (dict(old_=ref, reference=old), "π_old's and the reference's log-probs are swapped in "
                                                             "the loss")
    out["adv=rewards"] = (dict(a=trace.rewards.rewards.to(trace.advantages.advantages.dtype)),
                          "the loss uses the rewards where the advantages belong (no group baseline reaches the loss)")
    return out


def _safe(variants: dict) -> dict:
    """Variants whose evaluation raises (a loss type refusing this batch's settings) are left out, not fatal."""
    out = {}
    for code, (fn, sentence) in variants.items():
        if fn is None:
            continue

        def call(fn=fn):
            try:
                return fn()
            except Exception:  # noqa: BLE001 - a variant that cannot run explains nothing
                return None
        out[code] = (call, sentence)
    return out
