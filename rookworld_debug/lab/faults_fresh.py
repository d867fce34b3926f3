"""How the fourth held-out fault set (`handloop.FRESH_FAULTS`, `between_steps.FRESH_BETWEEN_FAULTS`) is written into
the hand-written loop: each helper is the buggy computation as a trainer that has the bug computes it, called by the
loop where the fault is named. Kept apart so that the loop's own file stays readable; it imports nothing of the
loop."""
from __future__ import annotations

import contextlib

import torch

VOCAB_MULTIPLE = 64          # a vocabulary padded to a multiple of 64 rows (as Megatron-style trainers pad it)
DUAL_CLIP_C = 3.0            # the dual clip's usual constant (verl's clip_ratio_c)
GAMMA = 0.99                 # a discount left at an RL default where GRPO wants γ = 1


def draw_shared(probs: torch.Tensor, gen) -> torch.Tensor:
    """(N,) tokens drawn by inverting each row's CDF at ONE uniform number per position for every row (one seed for
    every request): rows with the same prompt and the same tokens so far draw the same token."""
    u = torch.rand(1, generator=gen, dtype=probs.dtype)
    cdf = probs.cumsum(-1)
    return (cdf < u * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)


def padded_vocab(logits: torch.Tensor) -> torch.Tensor:
    """The logits with the padding rows of a vocabulary padded to VOCAB_MULTIPLE: zero rows of the output embedding
    give logit 0, and the log-softmax normalises over them too."""
    v = logits.shape[-1]
    extra = -v % VOCAB_MULTIPLE or VOCAB_MULTIPLE
    return torch.cat([logits, logits.new_zeros(*logits.shape[:-1], extra)], -1)


def kl_penalised_rewards(r: torch.Tensor, sampler_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor,
                         beta: float) -> torch.Tensor:
    """r − β·Σ_t (ℓ_sampler − ℓ_ref) over each row's tokens: the KL penalty of PPO's reward (k1 per token, summed as
    token-level rewards are), while the loss keeps its own KL term."""
    return r - beta * ((sampler_logps - ref_logps) * mask).sum(1).float()


def ratio_bf16(logps: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """exp(ℓ − ℓ_old) computed in bfloat16 (the log-ratio cast down before the exponential), back to fp32."""
    return torch.exp((logps - old).to(torch.bfloat16)).float()


def ratio_clipped_in_log_space(logps: torch.Tensor, old: torch.Tensor, eps: float) -> torch.Tensor:
    """The clipped ratio as exp(clamp(ℓ − ℓ_old, −ε, ε)): the range [e^−ε, e^ε] where [1 − ε, 1 + ε] was meant."""
    return torch.exp((logps - old).clamp(-eps, eps))


def dual_clip_every_sign(pg: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The dual clip min(pg, −c·A) applied to every token, not only where A < 0: at ratio ≈ 1 a positive advantage's
    term is the constant −c·A (no gradient)."""
    return torch.min(pg, -DUAL_CLIP_C * a)


def discounted_advantages(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) per-token advantages A·γ^(L − 1 − t): the row's outcome advantage returned through a cumulative-return
    pass with γ < 1 (each token's return discounted by its distance to the row's last token)."""
    m = mask.float()
    to_end = (m.sum(1, keepdim=True) - 1 - torch.arange(m.shape[1], dtype=m.dtype)[None]).clamp(min=0)
    return adv[:, None] * GAMMA ** to_end


@contextlib.contextmanager
def blocks_without_gradient(model):
    """The loss forward as reentrant activation checkpointing runs it when no input requires grad: the blocks'
    output carries no graph, so only the final LayerNorm and the (tied) head get gradients."""
    def detach(_module, _inputs, out):
        return tuple(x.detach() if torch.is_tensor(x) else x for x in out) if isinstance(out, tuple) else out.detach()
    handle = model.transformer.h[-1].register_forward_hook(detach)
    try:
        yield
    finally:
        handle.remove()


def optimizer_without_vectors(model, lr: float):
    """AdamW over the matrices only: a no-decay filter (biases, LayerNorm weights) that drops those parameters from
    the optimizer instead of giving them weight_decay 0. They still get gradients and never move."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad and p.ndim >= 2], lr=lr)


def clip_by_first_shard_norm(params: list, max_norm: float) -> None:
    """clip_grad_norm_ whose total norm is the first half of the parameters' (one rank's shard of two, never reduced
    over the ranks), its coefficient applied to every gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    shard = grads[:len(grads) // 2]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in shard]))
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef)


# ------------------------------------------------------------------------------------- between consecutive steps
EMBEDDING_KEYS = ("transformer.wte.", "transformer.wpe.", "lm_head.")
RESUMED_BETAS = (0.9, 0.95)        # a config's betas applied over the state a resume loaded (the run had 0.999)


def state_without_embeddings(state: dict) -> dict:
    """A weight sync that skips the token and position embeddings and the head tied to them."""
    return {k: v for k, v in state.items() if not k.startswith(EMBEDDING_KEYS)}


def betas_reset(opt) -> None:
    for group in opt.param_groups:
        group["betas"] = RESUMED_BETAS


def block_states_reversed(model, opt) -> None:
    """The optimizer's state loaded by position into a model whose blocks are listed in the other order: block i's
    parameters get the moments and step counts of block n − 1 − i (same shapes, so nothing refuses it)."""
    blocks = list(model.transformer.h)
    old = {p: opt.state[p] for blk in blocks for p in blk.parameters() if p in opt.state}
    for i, blk in enumerate(blocks):
        for p, q in zip(blk.parameters(), blocks[len(blocks) - 1 - i].parameters()):
            if q in old:
                opt.state[p] = old[q]
