"""A necessary condition on a gradient Jᵀu without its backward: the final layer norm's part, in closed form.

Every path from the loss to the final LayerNorm's weight γ and bias β runs through the LM head at the positions that
predict completion tokens, so their gradient for any token weights u = (u_ℓ, u_H) is a closed form of the forward's
own values: with h_t the head's input (γ ⊙ x̂_t + β), p_t the tempered distribution over the vocabulary, W the
head's weight, τ the row's temperature and m_t the completion mask,

    ∂/∂h_t = m_t / τ · [ u_ℓ,t (W_{y_t} − p_t W) − u_H,t ((p_t ⊙ (log p_t + H_t)) W) ]
    ∂/∂γ = Σ_t ∂/∂h_t ⊙ x̂_t,        ∂/∂β = Σ_t ∂/∂h_t

(ℓ_t = log p_t(y_t) and H_t = −Σ_v p log p, as the loss forward computes them). Both are linear in u: two (N, T, d)
tensors per channel, computed once, answer every u. A candidate gradient farther than a bound from the recorded one
on these 2·d coordinates is farther than it on all of them, so a fit that tests "within the bound" skips the
candidate's backward (`TokenJacobian.rules_out`); one it cannot rule out still runs.

Shape legend: N rows, T completion tokens, d width, V vocabulary.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

# slack for this closed form's own float rounding against autograd's (both in float32): relative to the vectors
SCREEN_RTOL = 1e-4
# the (rows, T, V) tensors one chunk of the precomputation may hold
CHUNK_ELEMENTS = 2 ** 24


class HeadScreen:
    """The final layer norm's gradient for any u, from the loss forward's head inputs (module doc)."""

    def __init__(self, names: tuple[str, str], hidden, gamma, beta, head_weight, head_bias, rollout):
        self.names = names                          # the final layer norm's (weight, bias) parameter names
        self._inputs = (hidden, gamma, beta, head_weight, head_bias, rollout)
        self._basis = None                          # (A, B, Aγ, Bγ): each (N, T, d) float64, on first use

    @classmethod
    def of(cls, model, hidden: Optional[torch.Tensor], rollout, trainable) -> Optional["HeadScreen"]:
        """The screen of `model`'s loss forward whose head inputs were `hidden` (N, T, d), or None where the model
        has no final LayerNorm with a trainable weight and bias feeding its head, or the inputs are not whole."""
        ln = getattr(getattr(model, "base_model", None), "ln_f", None)
        head = model.get_output_embeddings()
        if hidden is None or not isinstance(ln, torch.nn.LayerNorm) or ln.weight is None or ln.bias is None:
            return None
        ids = {id(p): n for n, p in model.named_parameters()}
        names = (ids.get(id(ln.weight)), ids.get(id(ln.bias)))
        n, t = rollout.completion_ids.shape
        run = hidden.shape[1]           # the forward ran the columns through the last one a mask holds
        trainable = set(trainable)
        if not all(x in trainable for x in names) or hidden.shape[0] != n or run > t \
                or bool(rollout.completion_mask[:, run:].any()) or bool((ln.weight == 0).any()) \
                or hidden.dtype != torch.float32:
            return None                 # x̂ = (h − β) / γ needs γ without zeros; an autocast forward rounds otherwise
        bias = getattr(head, "bias", None)
        return cls(names, hidden, ln.weight.detach(), ln.bias.detach(), head.weight.detach(),
                   None if bias is None else bias.detach(), rollout)

    def gradient(self, u_logps: torch.Tensor, u_entropy: torch.Tensor) -> torch.Tensor:
        """(2·d,) float64: (∂/∂γ, ∂/∂β) of Σ u·(ℓ, H)."""
        a, b, ag, bg = self._precomputed()
        run = a.shape[1]                            # the columns after these hold no token: their u does nothing
        ul, ue = u_logps.detach()[:, :run].double(), u_entropy.detach()[:, :run].double()  # (N, T) each
        grad_gamma = torch.einsum("nt,ntd->d", ul, ag) + torch.einsum("nt,ntd->d", ue, bg)
        grad_beta = torch.einsum("nt,ntd->d", ul, a) + torch.einsum("nt,ntd->d", ue, b)
        return torch.cat([grad_gamma, grad_beta])

    def gap(self, recorded: dict, names, u_logps, u_entropy, scale: tuple = (1.0, 1.0)) -> Optional[float]:
        """min over s in [scale] of ‖recorded − s·Jᵀu‖ on the layer norm's coordinates, less SCREEN_RTOL of slack
        for float rounding: a lower bound of that distance over `names` (the parameters compared). None where they
        or the recorded gradient lack the layer norm, or it holds a non-finite value."""
        if not all(n in recorded and n in names for n in self.names):
            return None
        rec = torch.cat([recorded[n].detach().reshape(-1).double().cpu() for n in self.names])     # (2·d,)
        ours = self.gradient(u_logps, u_entropy)
        if not bool(torch.isfinite(rec).all() and torch.isfinite(ours).all()):
            return None
        sq = float(ours @ ours)
        s = min(max(float(rec @ ours) / sq if sq > 0 else scale[0], scale[0]), scale[1])   # the nearest s allowed
        return float((rec - s * ours).norm()) - SCREEN_RTOL * (float(rec.norm()) + abs(s) * math.sqrt(sq))

    def _precomputed(self):
        if self._basis is None:
            self._basis = _basis(*self._inputs)
            self._inputs = None
        return self._basis


@torch.no_grad()
def _basis(hidden, gamma, beta, w, bias, rollout):
    """(A, B, A⊙x̂, B⊙x̂), each (N, T, d) float64: ∂/∂h_t per unit u_ℓ,t (A) and per unit u_H,t (B)."""
    run = hidden.shape[1]
    ids, mask = rollout.completion_ids[:, :run], rollout.completion_mask[:, :run]
    n, t = ids.shape
    temps = rollout.temperatures.to(torch.float32).reshape(-1)
    temps = temps.expand(n) if temps.numel() == 1 else temps
    a, b = torch.empty(hidden.shape, dtype=torch.float64), torch.empty(hidden.shape, dtype=torch.float64)
    rows_per = max(1, CHUNK_ELEMENTS // max(1, t * w.shape[0]))
    for s in range(0, n, rows_per):
        rows = slice(s, s + rows_per)
        h = hidden[rows].to(w.device)
        lp = (F.linear(h, w, bias).float() / temps[rows].to(w.device)[:, None, None]).log_softmax(-1)  # (r, T, V)
        p = lp.exp()
        ent = -(p * lp).sum(-1, keepdim=True)                                                   # (r, T, 1)
        expected = torch.stack([p, p * (lp + ent)]) @ w.float()                               # (2, r, T, d)
        scale = (mask[rows].to(w.device).float() / temps[rows].to(w.device)[:, None])[..., None]   # (r, T, 1)
        a[rows] = ((w.float()[ids[rows].to(w.device)] - expected[0]) * scale).double().cpu()
        b[rows] = (-expected[1] * scale).double().cpu()
    x_hat = (hidden.double().cpu() - beta.double().cpu()) / gamma.double().cpu()                   # (N, T, d)
    return a, b, a * x_hat, b * x_hat
