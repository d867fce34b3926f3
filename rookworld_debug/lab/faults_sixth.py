"""How the sixth held-out fault set (`handloop.SIXTH_FAULTS`, `between_steps.SIXTH_BETWEEN_FAULTS`) is written into
the hand-written loop: each helper is the buggy computation as a trainer that has the bug computes it, called by the
loop where the fault is named (its TRL part, `faults_trl.SIXTH_TRL_FAULTS`, lives with the other TRL faults). Kept
apart so that the loop's own file stays readable; it imports nothing of the loop."""
from __future__ import annotations

import torch

IS_CAP = 2.0                 # the truncated importance-sampling weight's cap (TIS)
NO_DECAY_NAMES = ("bias", "LayerNorm.weight")   # a name-based no-weight-decay list written for BERT-style names
SHARED_BLOCKS = 3            # the reference's first blocks that share the policy's storage
MAX_PROMPT_LENGTH = 48       # the trainer's max_prompt_length (the P: prompts the loop draws are 55-69 tokens)


def stopped_at_first_eos(ids: torch.Tensor, mask: torch.Tensor, logps: torch.Tensor, eos: int) -> tuple:
    """The rollout of a generation loop whose stopping criterion returns one bool for the whole batch: it stops every
    row at the step where the first row emits EOS. (ids, mask, log-probs) cut to that width; the rows still running
    end there without EOS (truncated, every kept token in the mask)."""
    is_eos = ids == eos
    if not is_eos.any():
        return ids, mask, logps
    width = int(is_eos.int().argmax(1)[is_eos.any(1)].min()) + 1
    return ids[:, :width], mask[:, :width], logps[:, :width] * mask[:, :width]


def rewards_in_ids_dtype(r: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The rewards written into a buffer made with zeros_like of the completion ids (an integer tensor): each
    fractional reward truncated toward zero, then read back as float for the advantages."""
    out = torch.zeros_like(ids[:, 0])
    out[:] = r
    return out.float()


def balanced_order(lengths: torch.Tensor, parts: int) -> torch.Tensor:
    """The row order a batch balancer leaves: rows sorted by length (longest first) and dealt round-robin into
    `parts` partitions of similar token counts (one per micro-batch), the partitions concatenated."""
    by_length = torch.argsort(lengths, descending=True, stable=True)
    return torch.cat([by_length[i::parts] for i in range(parts)])


def grouped_after_balancing(r: torch.Tensor, order: torch.Tensor, group_advantages) -> torch.Tensor:
    """Advantages computed on the rows in `order` (after the balancer reordered them) by the (-1, G) reshape that
    forms the groups: each group is G rows that happen to be neighbours there, not one prompt's G rows; put back in
    row order."""
    adv = torch.empty_like(r)
    adv[order] = group_advantages(r[order])
    return adv


def packed_logits(model, prompt_ids, prompt_mask, ids, mask) -> list:
    """Each row's logits from ONE forward over the rows packed into a single sequence (padding removed, position
    ids restarting at 0 for each row) given an all-ones attention mask: the mask is plain causal, so every row
    attends to the rows packed before it. Per row: the logits at its completion's positions (those that predict
    its in-mask tokens)."""
    rows, spans = [], []
    for pi, pm, ci, cm in zip(prompt_ids, prompt_mask, ids, mask):
        p, c = pi[pm.bool()], ci[cm.bool()]
        spans.append((sum(len(x) for x in rows) + len(p), len(c)))
        rows.append(torch.cat([p, c]))
    packed = torch.cat(rows)[None]
    positions = torch.cat([torch.arange(len(x)) for x in rows])[None]
    logits = model(input_ids=packed, attention_mask=torch.ones_like(packed), position_ids=positions).logits[0]
    return [logits[start - 1:start - 1 + n] for start, n in spans]


def packed_logps(model, prompt_ids, prompt_mask, ids, mask, temperature: float, packs: int = 1) -> torch.Tensor:
    """(N, T) log-probs of the completion tokens scored by `packed_logits`, the rows split into `packs` packs (the
    micro-batches; 0 outside the mask)."""
    out = torch.zeros(ids.shape, dtype=torch.float32)
    for rows in torch.arange(ids.shape[0]).chunk(packs):
        for i, lg in zip(rows.tolist(), packed_logits(model, prompt_ids[rows], prompt_mask[rows], ids[rows],
                                                      mask[rows])):
            tokens = ids[i][mask[i].bool()]
            out[i, :len(tokens)] = (lg.float() / temperature).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    return out * mask


def truncated_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple:
    """The trainer's prompt ids and mask cut to their last MAX_PROMPT_LENGTH columns (left truncation of the
    left-padded batch), as max_prompt_length cuts them; the sampler was given the whole prompts."""
    return prompt_ids[:, -MAX_PROMPT_LENGTH:], prompt_mask[:, -MAX_PROMPT_LENGTH:]


def is_weight_with_gradient(logps: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """The truncated importance-sampling weight min(π_θ / π_sampler, C) per token, NOT detached: its value is ~1 on
    the rollout's own weights, and the policy term's gradient flows through it too."""
    return torch.exp(logps - sampled).clamp(max=IS_CAP)


def round_grads_to_bf16(model) -> None:
    """The gradient accumulation buffer held in bfloat16: after each micro-batch's backward the running sum is
    rounded to bf16 (kept in the parameters' own dtype)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.copy_(p.grad.to(torch.bfloat16))


def optimizer_no_decay_by_name(model, lr: float, weight_decay: float):
    """AdamW's two groups split by parameter NAME against NO_DECAY_NAMES: GPT-2's LayerNorm weights (ln_1, ln_2,
    ln_f) match no entry, so they land in the decayed group with the matrices."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    skip = [p for n, p in named if any(k in n for k in NO_DECAY_NAMES)]
    decay = [p for n, p in named if not any(k in n for k in NO_DECAY_NAMES)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": skip, "weight_decay": 0.0}], lr=lr)


# ------------------------------------------------------------------------------------- between consecutive steps
def rows_seen(rows_prompts: list, earlier: list) -> torch.Tensor:
    """(N,) bool: the rows whose prompt an earlier rollout already sent (a prefix cache holds its KV)."""
    seen = set(earlier)
    return torch.tensor([p in seen for p in rows_prompts])


def prefill_with_stale_prefix(model, stale, reused: torch.Tensor, prompt_ids, attn, positions):
    """The prompt forward of a sampler engine whose prefix cache was not reset after the weight sync: for the rows
    in `reused`, every prompt token but the last is served from the KV the previous weights (`stale`) computed; the
    last prompt token is always computed again, by the synced weights. Returns the model output (logits, cache)."""
    head = dict(input_ids=prompt_ids[:, :-1], attention_mask=attn[:, :-1], position_ids=positions[:, :-1],
                use_cache=True)
    fresh, old = model(**head).past_key_values, stale(**head).past_key_values
    pick = reused[:, None, None, None]
    for new_layer, old_layer in zip(fresh.layers, old.layers):
        new_layer.keys = torch.where(pick, old_layer.keys, new_layer.keys)
        new_layer.values = torch.where(pick, old_layer.values, new_layer.values)
    return model(input_ids=prompt_ids[:, -1:], attention_mask=attn, position_ids=positions[:, -1:],
                 past_key_values=fresh, use_cache=True)


def lr_from_config(opt) -> None:
    """A resume that restores the scheduler's count but leaves the optimizer's rate at the config's initial value:
    the first optimizer step after it runs at the initial rate (the scheduler sets its own at its next step)."""
    for group in opt.param_groups:
        group["lr"] = group["initial_lr"]


def moments_rounded_to_bf16(opt) -> None:
    """Adam's moments as a checkpoint that stored them in bfloat16 gives them back: exp_avg and exp_avg_sq rounded
    to bf16 (read back at their own dtype)."""
    for st in opt.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            st[key].copy_(st[key].to(torch.bfloat16))


def share_first_blocks(ref, model, n: int = SHARED_BLOCKS) -> None:
    """The reference built with its first `n` blocks pointing at the policy's storage (shared layers, meant to be
    frozen in both) while the policy still trains them: every optimizer step moves those blocks of the reference."""
    for blk_ref, blk in zip(ref.transformer.h[:n], model.transformer.h[:n]):
        for p_ref, p in zip(blk_ref.parameters(), blk.parameters()):
            p_ref.data = p.data

