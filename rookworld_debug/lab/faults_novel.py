"""How the fifth held-out fault set (`handloop.NOVEL_FAULTS`, `between_steps.NOVEL_BETWEEN_FAULTS`) is written into
the hand-written loop: each helper is the buggy computation as a trainer that has the bug computes it, called by the
loop where the fault is named. Kept apart so that the loop's own file stays readable; it imports nothing of the
loop."""
from __future__ import annotations

import torch

SCAFFOLD_STEP = 1.0          # the step count a fresh optimizer state shows after one materialising (dummy) step


def force_eos_on_truncated(ids: torch.Tensor, eos: int) -> torch.Tensor:
    """(N, T) ids whose rows that never sampled EOS (cut at the budget) get their last token overwritten with EOS,
    so that every completion "ends": the trained token is one the sampler did not draw (its recorded log-prob is
    still the drawn token's)."""
    out = ids.clone()
    cut = ~(ids == eos).any(1)
    out[cut, -1] = eos
    return out


def one_value_per_batch(column: list) -> list:
    """A reward function's column as the trainer stores it when the function returned a single value (the score of
    the batch's first completion): the tensor assignment broadcasts it to every row."""
    return [column[0]] * len(column)


def one_group_advantages(r: torch.Tensor) -> torch.Tensor:
    """Advantages standardised over the whole batch as one group: the reshape to (-1, G) fell back to one row."""
    return (r - r.mean()) / (r.std() + 1e-4)


def with_extra_bos(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, bos: int, pad: int) -> tuple:
    """The left-padded prompts as a sampler that tokenizes the prompt text again (adding its BOS in front of a
    prompt the trainer's ids start without) sees them: one more column, BOS before each row's first real token,
    attended."""
    n, p = prompt_ids.shape
    ids, mask = prompt_ids.new_full((n, p + 1), pad), prompt_mask.new_zeros((n, p + 1))
    for i in range(n):
        real = prompt_ids[i][prompt_mask[i].bool()]
        ids[i, p - len(real):] = torch.cat([real.new_tensor([bos]), real])
        mask[i, p - len(real):] = 1
    return ids, mask


def positions_from_one(attn: torch.Tensor) -> torch.Tensor:
    """Position ids counted from 1 (cumsum of the mask without the − 1): every real token one position later than
    the sampler placed it."""
    return attn.cumsum(1)


def logps_of_next_tokens(logits: torch.Tensor, p: int, ids: torch.Tensor, temperature: float, mask: torch.Tensor,
                         pad: int) -> torch.Tensor:
    """(N, T) log-probs with the labels shifted left on unshifted logits: position t holds the log-prob of token
    t + 1 (the logits at the completion's position t, gathered at the next token; the last position at the pad)."""
    at = logits[:, p:p + ids.shape[1]].float()
    nxt = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], pad)], 1)
    return (at / temperature).log_softmax(-1).gather(-1, nxt[..., None]).squeeze(-1) * mask


def clip_lower_bound_at_epsilon(ratio: torch.Tensor, eps: float) -> torch.Tensor:
    """The clipped ratio clamp(r, ε, 1 + ε): the lower bound written ε where 1 − ε was meant, so a ratio that fell
    below 1 − ε is not clipped."""
    return ratio.clamp(eps, 1 + eps)


def backward_running_total(running, part: torch.Tensor) -> torch.Tensor:
    """A loss total carried across micro-batches as a tensor and backpropagated after each one (retain_graph=True
    silences autograd's second-backward error): micro-batch j's gradient is accumulated k − j + 1 times."""
    total = part if running is None else running + part
    total.backward(retain_graph=True)
    return total


def step_inside_micro_batch_loop(model, opt, max_norm: float) -> None:
    """clip, optimizer.step() and zero_grad() run after a micro-batch's backward, inside the accumulation loop: the
    next micro-batch is scored and differentiated at weights this step already moved."""
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    opt.zero_grad()


# ------------------------------------------------------------------------------------- between consecutive steps
def rounded_to_bf16(state: dict) -> dict:
    """A weight sync into a sampler engine that holds bfloat16 weights: every floating tensor cast to bf16 (and read
    back at the copy's own dtype)."""
    return {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}


def optimizer_state_scaffold(opt) -> None:
    """The optimizer state a resume leaves when the checkpoint held none and the loader materialised a fresh state
    with one dummy step: every moment zero, every step count SCAFFOLD_STEP."""
    for st in opt.state.values():
        st["exp_avg"].zero_()
        st["exp_avg_sq"].zero_()
        st["step"].fill_(SCAFFOLD_STEP)


def reseed(gen, seed: int) -> None:
    """The sampler's generator seeded again with the run's seed before a rollout: every rollout draws the same
    stream of random numbers."""
    gen.manual_seed(seed)
