"""The loss's terms, fitted: the recorded gradient regressed on the gradients of the declared loss's terms and of
their neighbours, from ONE forward of the policy.

Every objective here is a function of the per-token log-probs ℓ (and entropies H): its gradient is Jᵀu with J the
Jacobian of (ℓ, H) in θ and u = ∂L/∂(ℓ, H), an (N, T) tensor computed from the loss alone, without the model. So the
forward runs once with its graph kept (`TokenJacobian`), each term costs one backward, and the regression

    g_recorded ≈ a·∇PG + b·∇KL + b'·∇(KL·r) + c·∇H + d·∇ℓ̄

gives the coefficients the loop actually applied: (1, β, β·[bias correction], c_H, 0) declared. ∇PG is the policy
term's (β = 0), ∇KL the KL estimator's per unit β, ∇(KL·r) the importance ratio's part of a bias-corrected KL, ∇H
the entropy bonus per unit c_H and ∇ℓ̄ a mean log-likelihood term's (an SFT-like term no GRPO loss has).

Shape legend: N rows, T completion tokens.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from rookworld_debug.grpo.objective.loss import compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.phases.generation import loss_mask
from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy

from .head_screen import HeadScreen


# the L2 norm below which a term's gradient is float noise (as the gradient check's absolute floor)
TERM_ATOL = 1e-6


# Jᵀ is linear: a u within this many of its dtype's epsilons (relative; at most 1e-5) of a combination of earlier
# ones, its own rounding, takes that combination of their gradients instead of a backward
SPAN_EPS = 64
# ... unless the combination cancels: Σ|a_i|·‖u_i‖ above this many ‖u‖ would amplify the earlier gradients' rounding
SPAN_MAX_GAIN = 4.0


# discounts an RL trainer's cumulative-return pass is left at where GRPO's outcome advantage wants γ = 1
DISCOUNTS = (0.99, 0.995, 0.999, 0.95, 0.9)


class TokenJacobian:
    """The policy's (ℓ, H) over the recorded rows with their graph: `gradient(u)` = Jᵀu by one backward, or by
    linearity from the gradients already taken (`backwards` counts the backwards run)."""

    def __init__(self, trace, policy, trainable):
        r = trace.rollout
        names = set(trainable)
        self.params = [(n, p) for n, p in policy.named_parameters() if n in names]
        for n, p in policy.named_parameters():
            p.requires_grad_(n in names)
        hidden = []                                 # the head's inputs, chunk by chunk: the screen's values
        hook = policy.get_output_embeddings().register_forward_hook(
            lambda m, args, out: hidden.append(None if torch.is_autocast_enabled(args[0].device.type)
                                               else args[0].detach()))
        try:
            self.logps, self.entropy = per_token_logps_and_entropy(
                policy, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.temperatures,
                with_grad=True, entropy_grad=True)                                              # (N, T) each
        finally:
            hook.remove()
        # (N, T, d) the head's inputs: an autocast forward's are left out (the screen's closed form is float32)
        self.hidden = torch.cat(hidden) if hidden and all(h is not None for h in hidden) else None
        self.screen = HeadScreen.of(policy, self.hidden, r, names)
        self._us: list[torch.Tensor] = []           # the u of each backward, flattened, float64   (2·N·T,)
        self._grads: list[dict] = []                # its gradient
        self.backwards = 0

    def gradient(self, u_logps: torch.Tensor, u_entropy: torch.Tensor) -> dict:
        u = torch.cat([u_logps.detach().flatten(), u_entropy.detach().flatten()]).double()           # (2·N·T,)
        known = self._from_span(u, min(SPAN_EPS * torch.finfo(u_logps.dtype).eps, 1e-5))
        if known is not None:
            return known
        # Jᵀu as the gradient of Σ u·(ℓ, H): torch's grad with explicit grad_outputs imports its symbolic-shapes
        # machinery (sympy: 0.4 s, and more at exit), for the same vector
        # a channel whose weights are all 0 is left out: autograd would carry its zeros through the whole head
        parts = [(x * w.to(x.dtype)).sum() for x, w in ((self.logps, u_logps), (self.entropy, u_entropy))
                 if bool(w.ne(0).any())]
        total = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        grads = torch.autograd.grad(total, [p for _, p in self.params], retain_graph=True, allow_unused=True)
        out = {n: (g if g is not None else torch.zeros_like(p)).detach() for (n, p), g in zip(self.params, grads)}
        self.backwards += 1
        self._us.append(u)
        self._grads.append(out)
        return out

    def rules_out(self, recorded: dict, names, u_logps, u_entropy, bound: float, scale: tuple = (1.0, 1.0)
                  ) -> bool:
        """Whether Jᵀu (times any s in [scale]) cannot be within `bound` of `recorded` over `names`, by the head
        screen alone (head_screen.py): its backward can be skipped. False where this model has no screen."""
        gap = self.screen_gap(recorded, names, u_logps, u_entropy, scale)
        return gap is not None and math.isfinite(bound) and gap > bound

    def screen_gap(self, recorded: dict, names, u_logps, u_entropy, scale: tuple = (1.0, 1.0)) -> Optional[float]:
        """A lower bound of min over s in [scale] of ‖recorded − s·Jᵀu‖ over `names`, without a backward (the head
        screen's), or None where this model has none."""
        return None if self.screen is None else self.screen.gap(recorded, names, u_logps, u_entropy, scale)

    def _from_span(self, u: torch.Tensor, rtol: float) -> Optional[dict]:
        """Σ a_i·g_i where u = Σ a_i·u_i over the earlier backwards' u (to `rtol`, without cancellation), else None.
        The same u gives the same tensors; u = 0 gives zeros."""
        norm = float(u.norm())
        if norm == 0.0:
            return {n: torch.zeros_like(p) for n, p in self.params}
        for v, g in zip(self._us, self._grads):
            if torch.equal(u, v):
                return dict(g)
        if not self._us:
            return None
        basis = torch.stack(self._us, 1)                                                           # (2·N·T, K)
        scale = basis.norm(dim=0).clamp(min=1e-300)
        a = torch.linalg.lstsq(basis / scale, u[:, None]).solution.squeeze(1) / scale              # (K,)
        if not bool(torch.isfinite(a).all()):
            return None
        resid = float((basis @ a - u).norm())
        if resid > rtol * norm or float((a.abs() * scale).sum()) > SPAN_MAX_GAIN * norm:
            return None
        return {n: sum((float(c) * g[n].double() for c, g in zip(a, self._grads)),
                       torch.zeros(p.shape, dtype=torch.float64, device=p.device)).to(p.dtype) for n, p in self.params}


def token_weights(trace, objective, jac: TokenJacobian, extra=None, advantages=None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """u = (∂L/∂ℓ, ∂L/∂H), each (N, T): the loss composition (micro-batches as the loop normalised them) of
    `objective` (with `advantages` in place of the recorded ones, if given), plus `extra(ℓ, H, mask)`,
    differentiated at the values of `jac`'s forward alone."""
    from rookworld_debug.diagnosis.replay.loss_phase import accumulation, micro_batch_weights, micro_batches
    r = trace.rollout
    mask = loss_mask(r, trace.config)
    lp = _value_point(trace, jac).requires_grad_(True)
    ent = jac.entropy.detach().clone().requires_grad_(True)
    old = _old(trace)                       # TRL's stored π_old: a reused generation batch's ratio is not 1
    adv = trace.advantages.advantages if advantages is None else advantages
    chunks = micro_batches(trace)
    cap = trace.capture
    # TRL normalises a token-level loss by its generation batch's tokens × g / steps_per_generation
    items = float(cap.num_items_in_batch) if cap is not None and cap.num_items_in_batch else mask.sum()
    spg = int(cap.steps_per_generation) if cap is not None and cap.steps_per_generation else None
    total = 0.0
    for rows, w in zip(chunks, micro_batch_weights(trace, objective)):
        pick = (lambda x: None if x is None else x[rows])
        total = total + w * compute_loss(lp[rows], pick(old) if old is not None else lp[rows].detach(),
                                         pick(r.ref_per_token_logps), adv[rows], mask[rows], objective,
                                         LossBatch(entropy=ent[rows], num_items_in_batch=items,
                                                   gradient_accumulation_steps=accumulation(trace),
                                                   steps_per_generation=spg)).loss
    if extra is not None:
        total = total + extra(lp, ent, mask)
    u_lp, u_ent = torch.autograd.grad(total, [lp, ent], allow_unused=True)
    return (torch.zeros_like(lp) if u_lp is None else u_lp), (torch.zeros_like(ent) if u_ent is None else u_ent)


def _value_point(trace, jac: TokenJacobian) -> torch.Tensor:
    """(N, T) the log-probs u is taken at: the step's RECORDED loss-forward log-probs where it kept them (the
    replay's rule: each phase from the previous phase's recorded output; the scoring phase holds them to the
    weights), else the recompute's. At the recorded values a term that is 0 in the step (the KL of a policy still
    equal to its reference) is 0 here too, not the recompute's float noise times the Jacobian."""
    r, rec = trace.rollout, trace.recorded
    mine = jac.logps.detach().clone()
    if rec is not None and "policy_logps" not in rec.recorded:
        return mine
    if rec is None and trace.capture is None and getattr(trace.config, "sampling_autocast", None):
        return mine                  # a run_step's rollout log-probs came from its bf16 sampler, not the loss forward
    kept = r.per_token_logps.to(mine.dtype)
    m = r.completion_mask.bool()
    if kept.shape != mine.shape or not bool(torch.isfinite(kept[m]).all()):
        return mine
    return torch.where(m, kept, mine)


def declared_weights(trace, jac: TokenJacobian) -> tuple[torch.Tensor, torch.Tensor]:
    """u of the trace's declared loss, each (N, T): its gradient is jac.gradient(*u)."""
    return token_weights(trace, Objective.from_config(trace.config), jac)


def declared_gradient(trace, jac: TokenJacobian) -> dict:
    """∇θ of the trace's declared loss (one backward through `jac`'s forward)."""
    return jac.gradient(*declared_weights(trace, jac))


class GradientFit:
    """The regression of the module doc, on demand (the forward runs when `fit` is first called)."""

    def __init__(self, trace, jac: TokenJacobian, previous=None):
        self.trace, self.jac = trace, jac
        self.previous = previous        # () -> the declared gradient at the previous pass's weights, or None

    def fit_carried_over(self, recorded: dict, ours: dict, names):
        """g_recorded ≈ g + c·g_previous, with g_previous the declared loss's gradient at the previous pass's weights
        (the weights that sampled, on a rollout's second pass): c = 1 is a gradient not zeroed between passes."""
        prev = self.previous() if self.previous is not None else None
        if prev is None:
            return {}, math.inf
        coefs, resid = _regress(recorded, {"this pass's gradient": (ours, 1.0),
                                           "the previous pass's gradient": (prev, 0.0)}, names)
        # the previous pass's gradient left out as float noise: nothing was carried over
        return (coefs, resid) if "the previous pass's gradient" in coefs else ({}, math.inf)

    def fit_discount(self, recorded: dict, names, bound: float):
        """(γ, residual) of the first γ in DISCOUNTS under which the declared loss with each token's advantage
        A·γ^(L−1−t) (the row's outcome advantage discounted by the token's distance to the row's last token)
        reproduces the recorded gradient within `bound`, else None. The policy term is positively homogeneous in
        each token's advantage, so its u at those advantages is γ^(L−1−t) × its u at A: one backward per γ."""
        from rookworld_debug.diagnosis.replay.loss_phase import LINEAR_CLIP_TYPES
        t = self.trace
        ob = Objective.from_config(t.config)
        if ob.loss_type not in LINEAR_CLIP_TYPES or ob.importance_sampling_level != "token":
            return None
        mask = loss_mask(t.rollout, t.config)
        u_decl, u_ent = token_weights(t, ob, self.jac)
        u_pol = token_weights(t, ob.replace(beta=0.0, entropy_coef=0.0), self.jac)[0]
        to_end = (mask.sum(1, keepdim=True) - 1 - torch.arange(mask.shape[1])[None]).clamp(min=0)     # (N, T)
        for gamma in DISCOUNTS:
            u = u_decl + (gamma ** to_end - 1) * u_pol * mask
            if self.jac.rules_out(recorded, names, u, u_ent, bound):
                continue
            g = self.jac.gradient(u, u_ent)
            resid = distance(recorded, g, names)
            if resid <= bound:
                return gamma, resid
        return None

    def fit_wiring(self, recorded: dict, names, bound: float):
        """(name, sentence, residual) of the first rewiring of the loss's inputs (loss_phase.wiring) whose
        declared gradient reproduces the recorded one within `bound`, else None."""
        from rookworld_debug.diagnosis.replay.loss_phase import wiring
        t = self.trace
        ob = Objective.from_config(t.config)
        for name, (kw, sentence) in wiring(t, _old(t)).items():
            other = _rewired(t, kw)
            if other is None:
                continue
            u = token_weights(other, ob, self.jac)
            if self.jac.rules_out(recorded, names, *u, bound):
                continue
            g = self.jac.gradient(*u)
            resid = distance(recorded, g, names)
            if resid <= bound:
                return name, sentence, resid
        return None

    def terms(self, declared_only: bool = False) -> dict:
        """{term: (its gradient, its declared coefficient)}; `declared_only`: the terms the declared loss carries
        (coefficient ≠ 0). The KL and entropy terms first: the policy term is then the declared gradient less them,
        by linearity (TokenJacobian.gradient), without a backward of its own."""
        t = self.trace
        if t.config.kl_estimator == "full":
            return {}
        ob = Objective.from_config(t.config)
        base = ob.replace(beta=0.0, entropy_coef=0.0)
        zero = torch.zeros_like(t.advantages.advantages)
        n_rows = t.rollout.completion_ids.shape[0]

        def mean_logp(lp, ent, mask):             # + Σ_i mean_t ℓ_it / N: a likelihood (SFT-like) term
            return (lp * mask).sum(1).div(mask.sum(1).clamp(min=1)).sum() / n_rows
        # (term, declared coefficient, objective, extra, advantages): each term on its own (A = 0 leaves no policy
        # term): a small term is never the difference of two large ones
        specs = []
        if t.rollout.ref_per_token_logps is not None:
            specs += [("KL term (per unit β)", ob.beta, base.replace(beta=1.0, use_bias_correction_kl=False), None,
                       zero),
                      ("KL term, bias-corrected (per unit β)", ob.beta if ob.use_bias_correction_kl else 0.0,
                       base.replace(beta=1.0, use_bias_correction_kl=True), None, zero)]
        specs += [("entropy bonus (per unit c_H)", ob.entropy_coef, base.replace(entropy_coef=1.0), None, zero),
                  ("policy term", 1.0, base, None, None),
                  ("mean log-likelihood term", 0.0, base, mean_logp, zero)]
        grads = {}
        for name, declared, objective, extra, adv in specs:
            if declared_only and not declared:     # (a declared bias-corrected KL has β ≠ 0: its plain part too)
                continue
            grads[name] = (self.jac.gradient(*token_weights(t, objective, self.jac, extra, adv)), declared)
        out = {k: grads[k] for k in ("policy term", "KL term (per unit β)") if k in grads}
        if "KL term, bias-corrected (per unit β)" in grads:
            corrected, declared = grads["KL term, bias-corrected (per unit β)"]
            out["the KL term's importance-ratio part (per unit β)"] = (
                _minus(corrected, grads["KL term (per unit β)"][0]), declared)
        out.update({k: grads[k] for k in ("entropy bonus (per unit c_H)", "mean log-likelihood term") if k in grads})
        return out

    def fit(self, recorded: dict, names, tol: float):
        """(coefficients {term: (fitted, declared)}, ‖recorded − fit‖) by least squares: on the declared loss's
        own terms first, and on every term where those leave more than `tol` (the simplest fit that holds)."""
        coefs, resid = _regress(recorded, self.terms(declared_only=True), names)
        return (coefs, resid) if resid <= tol else _regress(recorded, self.terms(), names)

    def fit_micro_batches(self, recorded: dict, names):
        """The same regression on each micro-batch's share of the declared gradient (declared: 1 each): which
        micro-batches the recorded gradient holds, and how much of each."""
        return _regress(recorded, {k: (g, 1.0) for k, g in self.micro_batch_gradients().items()}, names) \
            if len(self.micro_batch_gradients()) > 1 else ({}, math.inf)

    def fit_rows(self, recorded: dict, names, max_rows: int = 32):
        """The regression on each row's policy term (per unit advantage) and each row's KL term (per unit β):
        ({"policy": (N,) fitted, "kl": (N,) fitted or None}, ‖recorded − fit‖): the advantage each row's loss used
        and the β each row's KL carried, as the gradient says (a backward per row and term; N ≤ `max_rows`)."""
        t = self.trace
        n = t.rollout.completion_ids.shape[0]
        if n > max_rows or t.config.kl_estimator == "full":
            return {}, math.inf
        base = Objective.from_config(t.config).replace(beta=0.0, entropy_coef=0.0)
        units = {"policy": token_weights(t, base, self.jac, advantages=torch.ones(n))[0]}
        if t.rollout.ref_per_token_logps is not None:
            units["kl"] = token_weights(t, base.replace(beta=1.0), self.jac, advantages=torch.zeros(n))[0]
        terms, zero = {}, torch.zeros_like(units["policy"])
        for term, u in units.items():
            for i in range(n):
                row = zero.clone()
                row[i] = u[i]
                terms[(term, i)] = (self.jac.gradient(row, zero), 0.0)
        coefs, resid = _regress(recorded, terms, names)
        out = {term: torch.tensor([coefs.get((term, i), (0.0, 0.0))[0] for i in range(n)], dtype=torch.float64)
               for term in units}
        return out, resid

    def micro_batch_gradients(self) -> dict:
        """{micro-batch label: its share of the declared gradient}, in the order the loop ran them (cached)."""
        if getattr(self, "_mb", None) is None:
            from rookworld_debug.diagnosis.replay.loss_phase import micro_batches
            chunks = micro_batches(self.trace)
            self._mb = {}
            if len(chunks) > 1:
                u_lp, u_ent = token_weights(self.trace, Objective.from_config(self.trace.config), self.jac)
                for k, rows in enumerate(chunks):
                    keep = torch.zeros(u_lp.shape[0], 1)
                    keep[rows] = 1.0
                    self._mb[f"micro-batch {k + 1} (rows {int(rows[0])}–{int(rows[-1])})"] = \
                        self.jac.gradient(u_lp * keep, u_ent * keep)
        return self._mb


def clipped_in_loop(grads: list, names, max_norm: float) -> list:
    """The weights w of Σ w_i g_i that clip_grad_norm_(max_norm) leaves when it runs after each micro-batch's
    backward (the running sum clipped, then the next micro-batch added): from the micro-batches' Gram matrix."""
    gram = torch.tensor([[dot(a, b, names) for b in grads] for a in grads], dtype=torch.float64)
    w = torch.zeros(len(grads), dtype=torch.float64)
    for i in range(len(grads)):
        w[i] = 1.0
        norm = float(w @ gram @ w) ** 0.5
        w = w * min(1.0, max_norm / (norm + 1e-6))          # torch's clip coefficient, clamped at 1
    return w.tolist()


def _old(trace):
    """π_old's recorded log-probs (a loop's, or TRL's stored ones), None where the ratio is against ℓ.detach()."""
    if trace.capture is not None:
        return trace.capture.old_per_token_logps
    return getattr(trace.recorded, "old_per_token_logps", None)


def _rewired(trace, kw: dict):
    """The trace with the loss's inputs rewired as `kw` says (old_, reference, a), or None where it cannot be."""
    import dataclasses
    out = trace
    if "old_" in kw:
        if trace.recorded is None:
            return None                         # a capture's π_old is TRL's own: no loop wiring to fit
        out = dataclasses.replace(out, recorded=dataclasses.replace(out.recorded, old_per_token_logps=kw["old_"]))
    if "reference" in kw:
        out = dataclasses.replace(out, rollout=dataclasses.replace(out.rollout, ref_per_token_logps=kw["reference"]))
    if "a" in kw:
        out = dataclasses.replace(out, advantages=dataclasses.replace(out.advantages, advantages=kw["a"]))
    return out


def _regress(recorded: dict, terms: dict, names):
    """Least squares of `recorded` on the terms' gradients: ({term: (fitted, declared)}, ‖recorded − fit‖)."""
    keys = list(terms)
    if not keys:
        return {}, math.inf
    gram, rhs = _gram(recorded, [terms[k][0] for k in keys], names)                     # (K, K), (K,)
    # a term whose gradient is float noise here (the KL at a policy still at its reference) has no coefficient
    keep = [i for i in range(len(keys)) if float(gram[i, i]) > TERM_ATOL ** 2]
    if not keep:
        return {}, math.inf
    keys, gram, rhs = [keys[i] for i in keep], gram[keep][:, keep], rhs[keep]
    if not (bool(torch.isfinite(gram).all()) and bool(torch.isfinite(rhs).all())):
        return {}, math.inf                        # a NaN or inf gradient: no combination of terms explains it
    scale = gram.diagonal().sqrt()                  # normalised columns: terms of very different sizes
    coef = torch.linalg.lstsq(gram / scale[:, None] / scale[None], (rhs / scale)[:, None]).solution.squeeze(1) / scale
    resid = math.sqrt(sum(float((recorded[n].double() - sum(float(c) * terms[k][0][n].double()
                                                              for c, k in zip(coef, keys))).pow(2).sum())
                          for n in names))
    return {k: (float(c), terms[k][1]) for c, k in zip(coef, keys)}, resid


def _gram(recorded: dict, grads: list, names) -> tuple[torch.Tensor, torch.Tensor]:
    """(⟨g_i, g_j⟩, ⟨g_i, recorded⟩) in float64, a parameter at a time (each tensor converted once)."""
    k = len(grads)
    gram, rhs = torch.zeros(k, k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    for n in names:
        m = torch.stack([g[n].detach().reshape(-1).double() for g in grads])                     # (K, numel)
        gram += (m @ m.T).cpu()
        rhs += (m @ recorded[n].detach().reshape(-1).double().to(m.device)).cpu()
    return gram, rhs


def _minus(a: dict, b: dict) -> dict:
    return {n: a[n] - b[n] for n in a}


def dot(a: dict, b: dict, names) -> float:
    """Σ over `names` of ⟨a[n], b[n]⟩ in float64: the inner product of two {name: tensor} gradients."""
    return sum(float((a[n].double() * b[n].double()).sum()) for n in names)


def distance(a: dict, b: dict, names) -> float:
    """‖a − b‖ over `names` in float64: the L2 distance of two {name: tensor} gradients or weights."""
    return math.sqrt(sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in names))


def near(a: float, b: float) -> bool:
    """A fitted coefficient equal to a declared one, within the regression's 2 % (and float noise)."""
    return abs(a - b) <= 0.02 * max(abs(b), 1e-3) + 1e-6


def rows_cause(rows: dict, advantages: torch.Tensor, beta: float, lengths: torch.Tensor) -> Optional[tuple]:
    """(code, sentence) from the per-row fit (`GradientFit.fit_rows`): which rows' policy term used another row's
    advantage, and how each row's KL weight follows the row's length; None where neither says anything."""
    a = advantages.double()
    pg, kl = rows["policy"], rows.get("kl")
    tol = 1e-3 * float(a.abs().max()) + 1e-6
    said, code = [], "loss_terms"
    off = [i for i in range(a.numel()) if abs(float(pg[i] - a[i])) > tol]
    if off:
        took = {i: [j for j in range(a.numel()) if abs(float(pg[i] - a[j])) <= tol] for i in off}
        if not all(took.values()):
            return None                           # a row's weight is no advantage of the step: not a wiring
        d = next((d for d in range(-a.numel() + 1, a.numel()) if d and all(i - d in took[i] for i in off)), None)
        said.append(f"the policy term of rows {_span(off)} used the advantages of rows "
                    f"{_span([i - d for i in off]) if d is not None else [took[i][0] for i in off]}, not their own"
                    f" (the gradient fitted per row reproduces the recorded one; e.g. row {off[0]}: "
                    f"{float(pg[off[0]]):.4g} where its advantage is {float(a[off[0]]):.4g}): an index into the "
                    "advantages that is not the micro-batch's rows")
        code = "loss_wiring"
    if kl is not None and beta and any(abs(float(k) - beta) > 0.02 * abs(beta) for k in kl):
        ratio = kl / beta                                                              # (N,)
        lengths = lengths.double().clamp(min=1)
        per_token = ratio / lengths
        if bool((per_token - per_token.mean()).abs().max() <= 0.02 * per_token.mean().abs()):
            k = float(per_token.mean())
            said.append(f"each row's KL term carries β × {k:.4g} × its length (row lengths "
                        f"{_span_vals(lengths)}; fitted β per row {_span_vals(kl)}): the KL is summed over each "
                        "row's tokens" + ("" if abs(k - 1) < 0.02 else f" and scaled by {k:.4g}") +
                        " where the declared objective takes each row's mean")
        else:
            said.append("each row's KL term carries its own β: " + _span_vals(kl) + f" (declared {beta:g})")
    return (code, "; ".join(said)) if said else None


def _span(rows: list) -> str:
    return f"{rows[0]}–{rows[-1]}" if len(rows) > 2 and rows == list(range(rows[0], rows[-1] + 1)) else str(rows)


def _span_vals(v) -> str:
    vals = [f"{float(x):.4g}" for x in v]
    return "[" + ", ".join(vals[:8]) + (", …" if len(vals) > 8 else "") + "]"


def terms_cause(coefs: dict, accumulation: int) -> tuple[str, str, str]:
    """(phase, code, sentence) from the fitted coefficients: which terms differ from their declared coefficient."""
    off = {k: (a, d) for k, (a, d) in coefs.items() if not near(a, d)}
    said = "; ".join(f"{k}: {a:.4g} (declared {d:.4g})" for k, (a, d) in off.items())
    ratios = [a / d for a, d in coefs.values() if abs(d) > 1e-9]
    if all(abs(a) < 0.02 * max(abs(d), 1e-3) for a, d in coefs.values() if abs(d) > 1e-9):
        return "loss", "loss_terms", ("no term of the loss carries a gradient: the loss is detached from the policy "
                                      "(its ratio or log-probs detached, or computed under no_grad): " + said)
    if ratios and all(near(r, ratios[0]) for r in ratios) and all(abs(a) < 1e-6 for a, d in coefs.values()
                                                                  if abs(d) <= 1e-9):
        k = ratios[0]
        why = f"the recorded gradient is {k:.4g} × the declared loss's (every term scaled alike)"
        if accumulation > 1 and abs(k - accumulation) < 0.05 * accumulation:
            why += f": the micro-batch losses were not divided by the {accumulation} accumulation steps"
        return "gradient", "gradient_scaled", why
    pg = coefs.get("policy term")
    kl = coefs.get("KL term (per unit β)")
    part = coefs.get("the KL term's importance-ratio part (per unit β)")
    if set(off) == {"policy term"} and abs(pg[0]) < 0.02:
        return "loss", "loss_terms", ("the policy term carries no gradient (its ratio or log-probs detached, or "
                                      "computed under no_grad): only the other terms train the policy: " + said)
    if set(off) == {"policy term"} and pg[1] and near(pg[0], 2.0 * pg[1]):
        return "loss", "importance_weight_not_detached", (
            "the policy term's gradient is exactly twice the declared one: a factor whose value is 1 on this step's "
            "weights but whose gradient flows, as an importance weight π_θ / π_sampler (or π_θ / π_old) multiplied "
            "in without .detach() gives (its gradient adds the policy term's own once more); the policy term "
            "added to the loss twice gives the same: " + said)
    if set(off) == {"policy term"} and near(pg[0], -1.0):
        return "loss", "loss_advantage_sign", ("the policy term enters with the opposite sign (its value hides it: "
                                               "Σ A = 0 in a group; its gradient does not): " + said)
    if kl is not None and kl[1] and set(off) <= {"KL term (per unit β)", "the KL term's importance-ratio part "
                                                 "(per unit β)"}:
        if all(near(coefs[k][0], 0.0) for k in off):
            return "loss", "kl_not_applied", ("the β·KL term carries no gradient: the loss leaves it out, or takes "
                                              "it of detached log-probs (where β·KL is below the loss value's "
                                              "tolerance, the value cannot tell the two apart): " + said)
        if all(near(coefs[k][0], -coefs[k][1]) for k in off):
            return "loss", "kl_sign_flipped", "the KL term enters with −β: it pushes the policy away: " + said
    if pg is not None and part is not None and part[1] and near(pg[0], -1.0) and near(part[0], -part[1]):
        return "loss", "loss_terms", ("every gradient through the importance ratio is reversed (the policy term "
                                      "and the KL's ratio part): the ratio is exp(ℓ_old − ℓ), inverted: " + said)
    return "loss", "loss_terms", "the loss's terms carry other coefficients than declared: " + said
