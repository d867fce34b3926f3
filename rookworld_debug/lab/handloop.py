"""A small hand-written GRPO loop, independent of the project's step code, whose code can be broken on purpose at
every phase; it records its step through `rookworld_debug.record.StepRecorder`, so the fault benchmark measures
diagnosis by replay on bugs written into a loop, not into the project.

Its own sampling loop (KV cache, one token per forward, fixed length T with EOS padding), the RookWorld reward
against the dataset label, TRL's group advantages A = (r − mean_g) / (std_g + 1e-4), the PPO-clip objective with
the k3 KL, aggregated as TRL's grpo / dapo / bnpo / dr_grpo, micro-batches with gradient accumulation, AdamW with
grad clip. Its fault sets (`lab.fault_sets`, re-exported here: `FAULTS`, …, `ALL_FAULTS`) map each fault to the
phase it breaks and the cause a diagnosis should name.
"""
from __future__ import annotations

import contextlib
import copy
import json
import random
from dataclasses import dataclass
from typing import Optional

import torch

from rookworld_debug.lab import faults_eighth as E8
from rookworld_debug.lab import faults_fresh as F
from rookworld_debug.lab import faults_novel as N
from rookworld_debug.lab import faults_seventh as S7
from rookworld_debug.lab import faults_sixth as S
from rookworld_debug.lab.fault_sets import (  # noqa: F401  (re-exported: the loop's fault sets, as before)
    ALL_FAULTS, BLIND_FAULTS, BLIND_SETTINGS, EIGHTH_FAULTS, EIGHTH_HEALTHY, EIGHTH_SETTINGS, FAULTS, FRESH_FAULTS,
    FRESH_SETTINGS, FROZEN_FAULTS, HELDOUT_FAULTS, NOVEL_FAULTS, NOVEL_SETTINGS, PROBE_FAULTS, PROBE_SETTINGS,
    SEALED_FAULTS, SEALED_SETTINGS, SHAPE_FAULTS, SEVENTH_FAULTS, SEVENTH_HEALTHY, SEVENTH_SETTINGS, SIXTH_FAULTS,
    SIXTH_HEALTHY, SIXTH_SETTINGS, STRUCTURE_FAULTS, UNSEEN_FAULTS)


@dataclass(frozen=True)
class LoopConfig:
    loss_type: str = "grpo"          # grpo | dapo | bnpo | dr_grpo (TRL's aggregations)
    beta: float = 0.04
    epsilon: float = 0.2
    num_generations: int = 4
    num_prompts: int = 2
    temperature: float = 0.8
    lr: float = 1e-4
    max_grad_norm: float = 1.0
    max_new_tokens: int = 160
    micro_batches: int = 2
    task: str = "P"                  # P | A
    steps: int = 2                   # the last one is recorded
    seed: int = 0
    dtype: str = "float32"
    num_iterations: int = 1          # μ optimizer passes over each rollout (PPO epochs); π_old = the sampler's
    record_pass: int = -1            # which pass of the last rollout is recorded (-1: the last)
    separate_sampler: bool = False   # a sampler copy of the policy, synced before each rollout (vLLM-style)
    autocast: str = ""               # "bfloat16": every forward under CPU autocast (declared as the precision)
    mask_truncated: bool = False     # rows with no EOS get a 0 loss mask (declared mask_truncated_completions)
    bias_correction: bool = True     # the k3 KL × the ratio (TRL's default); False: the plain k3
    scheduler: bool = False          # a linear learning-rate decay per optimizer step (LambdaLR)
    warmup_steps: int = 0            # with the schedule: a linear warm-up over this many optimizer steps first
    declare: tuple = ()              # (keyword, value) pairs the recorder is told that the loop does not compute
    declare_iteration: bool = True   # False: the recorder is not told which pass it records (under-declared)
    undeclare: tuple = ()            # keywords the recorder is not told at all (their defaults stand)
    weight_decay: float = 0.0        # > 0: AdamW's two usual groups, this decay on matrices and none on biases and
                                     # LayerNorm weights (as HF's Trainer builds them)
    frozen_embeddings: bool = False  # the token and position embeddings frozen (requires_grad False, not optimized)
    gradient_after_clip: bool = False   # the recorder is handed the gradient after clip_grad_norm_ (not before)

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


def _data(task: str, n: int, seed: int) -> list[dict]:
    from rookworld_debug.record import BUNDLED_DATA
    rows = [json.loads(x) for x in BUNDLED_DATA.read_text().splitlines()]
    rows = [r for r in rows if r["task"] == task and r["split"] == "train"]
    return random.Random(seed).sample(rows, n)


def _positions(attn: torch.Tensor) -> torch.Tensor:
    return (attn.cumsum(1) - 1).clamp(min=0)


@torch.no_grad()
def sample(model, prompt_ids, prompt_mask, t: int, temperature: float, eos: int, gen, fault: str = "",
           prefix: Optional[tuple] = None):
    """(ids (N, T), mask (N, T) through the first EOS, the sampler's log-probs (N, T)). `prefix`: (the weights
    that computed a stale prefix cache, the rows it serves), the sixth set's sampler_prefix_cache_stale."""
    attn = prompt_mask.clone()
    no_pos = fault == "sampler_no_position_ids"
    no_mask = fault == "sampler_no_attention_mask"        # the forwards get no mask: the left padding is attended
    out = model(input_ids=prompt_ids, attention_mask=None if no_mask else attn,
                position_ids=None if no_pos else _positions(attn),
                use_cache=True) if prefix is None else \
        S.prefill_with_stale_prefix(model, *prefix, prompt_ids, attn, _positions(attn))
    past, logits = out.past_key_values, out.logits[:, -1]
    pos = _positions(attn)[:, -1]
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool)
    ids, logps = [], []
    for _ in range(t):
        t_ = temperature * temperature if fault == "sampler_temperature_squared" else temperature
        lp = (logits.float() / t_).log_softmax(-1)                                        # (N, V)
        if fault == "sampler_top_k":
            kth = lp.topk(5, -1).values[:, -1:]
            lp = lp.masked_fill(lp < kth, -float("inf")).log_softmax(-1)
        draw = lp
        if fault == "sampler_top_p_unrecorded":          # the smallest set of tokens holding 0.9 of the mass
            p_sorted, order = lp.exp().sort(-1, descending=True)
            drop = (p_sorted.cumsum(-1) - p_sorted) >= 0.9
            draw = lp.masked_fill(drop.scatter(-1, order, drop), -float("inf")).log_softmax(-1)
        tok = F.draw_shared(draw.exp(), gen) if fault == "sampler_one_seed_every_row" else \
            torch.multinomial(draw.exp(), 1, generator=gen).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        raw = logits.float().log_softmax(-1) if fault == "sampler_no_temperature" else lp
        ids.append(tok)
        logps.append(S7.top_token_logps(raw) if fault == "sampler_logps_of_top_token" else
                     raw.gather(1, tok[:, None]).squeeze(1))
        done |= tok == eos
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
        pos = pos + 1
        out = model(input_ids=tok[:, None], attention_mask=None if no_mask else attn,
                    position_ids=None if no_pos else pos[:, None],
                    past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
    ids = torch.stack(ids, 1)
    is_eos = ids == eos
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(ids[:, 0], t))
    mask = (torch.arange(t)[None] <= first[:, None]).long()
    if fault == "mask_after_eos":
        mask = torch.ones_like(mask)
    if fault == "mask_drops_eos":
        mask = mask * (ids != eos).long()
    if fault == "mask_shifted":
        mask = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1)
    return ids, mask, torch.stack(logps, 1) * mask


def token_logps(model, prompt_ids, prompt_mask, ids, mask, temperature: float, fault: str = ""):
    if fault == "packed_rows_attend_across":
        return S.packed_logps(model, prompt_ids, prompt_mask, ids, mask, temperature)
    if fault == "scoring_prompt_right_padded":     # real tokens first, pads after: a pad predicts the completion
        order = torch.argsort(1 - prompt_mask, dim=1, stable=True)
        prompt_ids, prompt_mask = prompt_ids.gather(1, order), prompt_mask.gather(1, order)
    full, attn = torch.cat([prompt_ids, ids], 1), torch.cat([prompt_mask, mask], 1)
    kw = {} if fault == "logps_no_position_ids" else {"position_ids": _positions(attn)}
    kw = {"position_ids": N.positions_from_one(attn)} if fault == "position_ids_from_one" else kw
    # the fault's own autocast only: an inner autocast(enabled=False) would switch off the loop's (c.autocast)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if fault == "scoring_bf16" else \
        torch.autocast("cpu", dtype=torch.float16) if fault == "scoring_fp16" else \
        F.blocks_without_gradient(model) if fault == "checkpointing_blocks_no_grad" else contextlib.nullcontext()
    with ctx:
        logits = model(input_ids=full, attention_mask=None if fault == "logps_no_attention_mask" else attn, **kw).logits
    p = prompt_ids.shape[1]
    at = logits[:, p:p + ids.shape[1]] if fault == "logps_unshifted" else logits[:, p - 1:-1]
    t = 1.0 if fault == "logps_no_temperature" else temperature
    if fault == "logps_labels_shifted_left":
        return N.logps_of_next_tokens(logits, p, ids, t, mask, model.config.eos_token_id)
    at = at.to(torch.bfloat16) if fault == "logsoftmax_bf16" else at.float()
    at = F.padded_vocab(at) if fault == "logps_padded_vocab" else at
    if fault == "logps_tempered_after_log_softmax":
        return (at.log_softmax(-1) / t).gather(-1, ids[..., None]).squeeze(-1) * mask
    return (at / t).log_softmax(-1).float().gather(-1, ids[..., None]).squeeze(-1) * mask


def advantages(r: torch.Tensor, g: int, fault: str = "") -> torch.Tensor:
    if fault == "adv_whole_batch_one_group":
        return N.one_group_advantages(r)
    g = g // 2 if fault == "adv_groups_half_size" else g      # the statistics over groups of G/2 rows
    b = r.numel() // g
    grouped = r.view(g, b).T if fault == "adv_grouping_stride" else r.view(b, g)
    centred = grouped - grouped.mean(1, keepdim=True)
    if fault == "adv_not_centred":
        centred = grouped
    if fault == "adv_no_std":
        a = centred
    else:
        a = centred / (grouped.std(1, keepdim=True, correction=0 if fault == "adv_ddof0" else 1) + 1e-4)
    a = a.clamp(-0.5, 0.5) if fault == "adv_clipped" else a
    if fault == "adv_batch_mean":
        a = (grouped - r.mean()) / (grouped.std(1, keepdim=True) + 1e-4)
    if fault == "adv_std_floor":
        a = centred / grouped.std(1, keepdim=True).clamp(min=0.3)
    if fault == "adv_std_over_batch":
        a = centred / (r.std() + 1e-4)
    a = a.flip(1) if fault == "adv_reversed_in_group" else a * g if fault == "adv_times_g" else a
    a = (a - a.mean()) / (a.std() + 1e-8) if fault == "adv_whitened_again" else a
    return a.T.reshape(-1) if fault == "adv_grouping_stride" else a.reshape(-1)


def loss_of(logps, old, ref, adv, mask, c: LoopConfig, n_total: int, tokens_total, fault: str = "", sampled=None):
    """TRL's per-token PPO-clip + β·k3 KL, aggregated as `c.loss_type` (one micro-batch; ÷ micro-batches inside).
    `old`: π_old's log-probs (None: ℓ.detach(), one pass per rollout); `sampled`: the sampler's."""
    old = (logps if fault == "old_not_detached" else logps.detach()) if old is None else old
    ratio = torch.exp(old - logps) if fault == "ratio_inverted" else torch.exp(logps - ref) \
        if fault == "ratio_against_ref" else F.ratio_bf16(logps, old) if fault == "ratio_bf16" else \
        S7.sequence_ratio_summed(logps, old, mask) if fault == "ratio_sequence_summed" else torch.exp(logps - old)
    a = (-adv if fault == "loss_adv_sign" else adv)[:, None]
    a = F.discounted_advantages(adv, mask) if fault == "adv_discounted_per_token" else a
    r_pg = ratio.detach() if fault == "pg_no_gradient" else ratio
    bound = torch.max if fault == "clip_max_not_min" else torch.min
    clipped = F.ratio_clipped_in_log_space(logps, old, c.epsilon) if fault == "ratio_clipped_in_log_space" else \
        N.clip_lower_bound_at_epsilon(r_pg, c.epsilon) if fault == "clip_lower_bound_epsilon" else \
        r_pg.clamp(1 - c.epsilon, 1 + c.epsilon)
    pg = -bound(r_pg * a, clipped * a)
    pg = F.dual_clip_every_sign(pg, a) if fault == "dual_clip_every_sign" else pg
    pg = pg * S.is_weight_with_gradient(logps, sampled) if fault == "is_weight_not_detached" else pg
    d = (old if fault == "kl_against_old" else ref) - (logps.detach() if fault == "kl_detached" else logps)
    d = -d if fault == "kl_k3_reversed" else d
    kl = -d if fault == "kl_k1_estimator" else torch.exp(d) - d - 1
    kl = kl * (E8.sequence_ratio(logps, old, mask) if fault == "kl_corrected_by_sequence_ratio" else
               ratio if c.bias_correction else 1.0)
    beta = -c.beta if fault == "loss_kl_sign" else c.beta ** 2 if fault == "kl_beta_squared" else c.beta
    per_token = pg + beta * kl
    if fault == "entropy_bonus_undeclared":       # a sampled-token entropy proxy, −ℓ, as a bonus
        per_token = per_token + 0.01 * logps
    m = mask.float()
    if fault == "kl_mean_over_all_positions":       # the KL's mean over every position of the batch's rows
        return (pg * m).sum() / tokens_total + beta * (kl * m).sum() / (n_total * m.shape[1])
    agg = WRONG_AGGREGATION[c.loss_type] if fault == "loss_wrong_aggregation" else c.loss_type
    agg = "bnpo" if fault == "accum_token_mean_per_micro_batch" else agg
    if fault == "kl_summed_per_row":                 # the policy term aggregated as declared, the KL each row's sum
        return AGGREGATIONS[agg](pg * m, m, n_total, tokens_total, c) + beta * (kl * m).sum() / n_total
    if fault == "grpo_length_is_t" and AGGREGATIONS[agg] is _sequence_mean:   # each row's mean over T, not its length
        return (per_token * m).sum(1).div(m.shape[1]).sum() / n_total
    if fault == "grpo_sum_not_mean" and AGGREGATIONS[agg] is _sequence_mean:  # each row's sum, not its mean
        return (per_token * m).sum(1).sum() / n_total
    if fault == "dr_grpo_rows_summed" and AGGREGATIONS[agg] is _fixed_length:   # Σ over the rows, ÷ T, ÷ micro-batches
        return E8.rows_summed_over_horizon(per_token * m, c.max_new_tokens, c.micro_batches)
    if fault == "micro_batch_rows_mean" and AGGREGATIONS[agg] is _sequence_mean:
        return E8.micro_batch_row_mean(per_token * m, m, c.micro_batches)
    return AGGREGATIONS[agg](per_token * m, m, n_total, tokens_total, c)


# TRL's aggregations of the masked per-token loss L·m over one micro-batch, as this loop writes them
def _sequence_mean(lm, m, n, tokens, c):
    return (lm.sum(1) / m.sum(1).clamp(min=1)).sum() / n                                # per-sequence mean


def _fixed_length(lm, m, n, tokens, c):
    return lm.sum() / (n * c.max_new_tokens)                                           # a constant


AGGREGATIONS = {
    "grpo": _sequence_mean,
    "dapo": lambda lm, m, n, tokens, c: lm.sum() / tokens,                              # the batch's tokens
    "bnpo": lambda lm, m, n, tokens, c: lm.sum() / m.sum().clamp(min=1) / c.micro_batches,   # the micro-batch's
    "dr_grpo": _fixed_length,
}
WRONG_AGGREGATION = dict(zip(AGGREGATIONS, ("dapo", "grpo", "grpo", "grpo")))


@dataclass
class _Loop:
    """The loop's live objects: tokenizer, policy, reference, sampler copy, optimizer, scheduler."""
    tok: object
    model: object
    ref: object
    sampler: object
    opt: object
    sched: object
    gen: object


def _setup(c: LoopConfig) -> _Loop:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from rookworld_debug.record import EMBEDDED_MODEL
    torch.manual_seed(c.seed)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL, padding_side="left", trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL, dtype=getattr(torch, c.dtype),
                                                 trust_remote_code=False).eval()
    ref = copy.deepcopy(model).requires_grad_(False)
    sampler = copy.deepcopy(model).requires_grad_(False) if c.separate_sampler else None
    if c.frozen_embeddings:
        model.transformer.wpe.requires_grad_(False)
        model.transformer.wte.requires_grad_(False)         # tied: the LM head is frozen with it
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.ndim >= 2]
    groups = [{"params": decay, "weight_decay": c.weight_decay},
              {"params": [p for p in trained if p.ndim < 2], "weight_decay": 0.0}] if c.weight_decay else trained
    opt = torch.optim.AdamW(groups, lr=c.lr)
    sched = schedule(opt, c) if c.scheduler else None
    return _Loop(tok, model, ref, sampler, opt, sched, torch.Generator().manual_seed(c.seed))


def schedule(opt, c: LoopConfig):
    """A linear learning-rate decay per optimizer step, to 1 / (steps·μ + 1) of the rate at the last one (after a
    linear warm-up from 1 / (w + 1) of the rate over `c.warmup_steps` = w steps, when given)."""
    total, w = c.steps * c.num_iterations + 1, c.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / (w + 1)) * (1 - k / total))


def _autocast(c: LoopConfig):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.autocast == "bfloat16")


def _rollout(L: _Loop, c: LoopConfig, step: int, fault: str) -> dict:
    """Sample G completions per prompt with the sampler (the policy itself, or its synced copy), score them."""
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    g = c.num_generations
    if L.sampler is not None and (fault not in ("sampler_not_synced", "sampler_synced_before_step") or step == 1):
        L.sampler.load_state_dict(L.model.state_dict())
    if fault == "ref_refreshed":
        L.ref = copy.deepcopy(L.model).requires_grad_(False)
    if fault == "ref_mixup_each_step" and step > 1:
        with torch.no_grad():
            for p_ref, p_pol in zip(L.ref.parameters(), L.model.parameters()):
                p_ref.mul_(0.4).add_(0.6 * p_pol)
    sampler = L.sampler if L.sampler is not None else L.model
    batch = _data(c.task, c.num_prompts, c.seed + step)
    prompts, labels = [x["prompt"] for x in batch], [x["completion"] for x in batch]
    enc = L.tok(prompts, return_tensors="pt", padding=True)
    if fault == "rows_prompt_major":
        p_ids, p_mask = enc.input_ids.repeat(g, 1), enc.attention_mask.repeat(g, 1)
        rows_p, rows_l = prompts * g, labels * g
    else:
        p_ids, p_mask = enc.input_ids.repeat_interleave(g, 0), enc.attention_mask.repeat_interleave(g, 0)
        rows_p, rows_l = [p for p in prompts for _ in range(g)], [x for x in labels for _ in range(g)]
    eos = L.tok.eos_token_id
    with torch.no_grad(), _autocast(c):
        s_ids, s_mask = N.with_extra_bos(p_ids, p_mask, L.tok.bos_token_id, L.tok.pad_token_id) \
            if fault == "sampler_prompt_extra_bos" else (p_ids, p_mask)
        ids, mask, s_logps = sample(sampler, s_ids, s_mask, c.max_new_tokens, c.temperature, eos, L.gen, fault)
        ids = N.force_eos_on_truncated(ids, eos) if fault == "eos_forced_on_truncated" else ids
        if fault == "batch_stops_at_first_eos":
            ids, mask, s_logps = S.stopped_at_first_eos(ids, mask, s_logps, eos)
        if fault == "prompt_truncated_for_trainer_only":
            p_ids, p_mask = S.truncated_prompts(p_ids, p_mask)
        if fault == "mask_drops_first_token":
            mask, s_logps = S7.without_first_token(mask, s_logps)
        if fault == "sampler_logps_tail_zero_padded":
            s_logps = S7.last_logp_zero_padded(s_logps, mask)
        raw_mask = mask
        if c.mask_truncated:                        # TRL's mask_truncated_completions: no EOS, no loss
            mask = mask * (ids == eos).any(1, keepdim=True).long()
            s_logps = s_logps * mask
        texts = L.tok.batch_decode(ids * mask + eos * (1 - mask),
                                   skip_special_tokens=fault != "texts_with_special_tokens")
        if fault == "completion_texts_rolled":
            texts = texts[1:] + texts[:1]
        use_labels = rows_l[g:] + rows_l[:g] if fault == "reward_wrong_labels" else rows_l
        scored = [p + t for p, t in zip(rows_p, texts)] if fault == "reward_text_with_prompt" else texts
        cols = [f(prompts=rows_p, completions=scored, label=use_labels) for f in rookworld_reward_funcs("dataset")]
        cols = [N.one_value_per_batch(col) for col in cols] if fault == "reward_single_value_broadcast" else cols
        r = torch.tensor([sum(v for v in vals if v is not None) for vals in zip(*cols)], dtype=torch.float32)
        r = S.rewards_in_ids_dtype(r, ids) if fault == "rewards_in_integer_tensor" else r
        r = torch.roll(r, 1) if fault == "reward_shift" else -r if fault == "reward_negated" else r
        r = r * 0.5 if fault == "reward_scaled_half" else r.clamp(max=0.3) if fault == "reward_clamped" else r
        if fault == "reward_length_penalty":
            r = r - 0.002 * mask.sum(1).float()
        if fault == "reward_first_per_prompt":
            r = r.view(-1, g)[:, :1].expand(-1, g).reshape(-1).clone()
        scorer = L.model if fault == "ref_is_policy" else L.ref
        if fault == "ref_in_train_mode":             # GPT-2's dropout 0.1 (the embedded model ships 0), train mode
            for module in scorer.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = 0.1
            scorer.train()
        ref_logps = S.packed_logps(scorer, p_ids, p_mask, ids, mask, c.temperature, c.micro_batches) \
            if fault == "packed_rows_attend_across" else \
            token_logps(scorer, p_ids, p_mask, ids, mask, 1.0 if fault == "ref_logps_no_temperature" else c.temperature,
                        "logps_unshifted" if fault == "ref_logps_unshifted" else "")
        scorer.eval()
        if fault == "ref_logps_bf16_stored":
            ref_logps = ref_logps.to(torch.bfloat16).float()
        if fault == "kl_penalty_in_reward":
            r = F.kl_penalised_rewards(r, s_logps, ref_logps, mask, c.beta)
        # π_old: the sampler's teacher-forced log-probs, fixed for the rollout's passes (μ > 1 only, as TRL)
        old = token_logps(sampler, p_ids, p_mask, ids, mask, c.temperature) if c.num_iterations > 1 else None
        old = ref_logps.clone() if fault == "old_logps_from_ref" else old
    snapshot = copy.deepcopy(sampler) if c.num_iterations > 1 or L.sampler is not None else None
    adv = advantages(r, g, fault)
    if fault == "adv_groups_after_balancing":       # the groups formed after a batch balancer reordered the rows
        adv = S.grouped_after_balancing(r, S.balanced_order(mask.sum(1), c.micro_batches), lambda x: advantages(x, g))
    if fault == "adv_per_micro_batch":                # each micro-batch's rows standardised together
        adv = torch.cat([(x - x.mean()) / (x.std() + 1e-4) for x in r.chunk(c.micro_batches)])
    return dict(p_ids=p_ids, p_mask=p_mask, rows_p=rows_p, rows_l=rows_l, ids=ids, mask=mask, raw_mask=raw_mask,
                s_logps=s_logps, texts=texts, r=r, adv=adv, ref_logps=ref_logps, old=old, sampled_by=snapshot)


def _recorder(L: _Loop, c: LoopConfig, step: int, k: int, ro: dict):
    from rookworld_debug.record import StepRecorder
    declared = dict(loss_type=c.loss_type, num_generations=c.num_generations, beta=c.beta, epsilon=c.epsilon,
                    temperature=c.temperature, reward_mode="dataset", max_grad_norm=c.max_grad_norm,
                    gradient_accumulation_steps=c.micro_batches, seed=c.seed, num_iterations=c.num_iterations,
                    **({"iteration": k} if c.declare_iteration else {}), use_bias_correction_kl=c.bias_correction,
                    mask_truncated_completions=c.mask_truncated, precision=c.autocast or None)
    told = {k: v for k, v in {**declared, **dict(c.declare)}.items() if k not in c.undeclare}
    rec = StepRecorder(L.tok, trainer="lab hand-written loop", step=step, **told)
    rec.batch(ro["rows_p"], labels=ro["rows_l"])
    if ro["sampled_by"] is not None:
        rec.sampler(ro["sampled_by"])
    rec.model_before(L.model, L.opt, reference=L.ref, scheduler=L.sched)
    rec.rollout(prompt_ids=ro["p_ids"], prompt_mask=ro["p_mask"], completion_ids=ro["ids"],
                completion_mask=ro["mask"], completions=ro["texts"], sampling_logps=ro["s_logps"])
    rec.rewards(ro["r"], per_func={"rookworld": ro["r"]})
    rec.advantages(ro["adv"])
    return rec


def _optimizer_step(L: _Loop, c: LoopConfig, ro: dict, fault: str, rec, last: bool) -> None:
    """One optimizer step over the rollout's rows: micro-batches, backward, clip, step (recorded when `rec`)."""
    model, opt = L.model, L.opt
    if fault == "optimizer_reset":
        L.opt = opt = torch.optim.AdamW(model.parameters(), lr=opt.param_groups[0]["lr"])
    if fault == "grad_doubled_by_hook" and rec is not None:
        for p_ in model.parameters():
            p_.register_hook(lambda grad: grad * 2)
    if fault != "no_zero_grad" or not last:
        opt.zero_grad()
    ids, mask = ro["ids"], ro["mask"]
    total, lp_rows, old_rows, n, tokens = 0.0, [], [], ids.shape[0], _tokens(ro, fault)
    running = None                                    # the running loss total (backward_on_running_loss)
    for rows in torch.arange(n).chunk(c.micro_batches):
        if fault == "zero_grad_per_micro_batch":
            opt.zero_grad()
        with _autocast(c):
            lp = token_logps(model, ro["p_ids"][rows], ro["p_mask"][rows], ids[rows], mask[rows], c.temperature,
                             fault)
        old = ro["old"][rows] if ro["old"] is not None else None
        if fault == "old_logps_recomputed" and old is not None:
            old = lp.detach()
        adv = ro["r"] if fault == "loss_uses_rewards" else ro["adv"]
        adv_rows = adv[:len(rows)] if fault == "adv_first_rows_each_micro_batch" else adv[rows]
        loss = loss_of(lp, old, ro["ref_logps"][rows], adv_rows, mask[rows], c, n, tokens, fault,
                       sampled=ro["s_logps"][rows])
        loss = loss / c.num_generations if fault == "loss_divided_by_g" else loss
        scale = c.micro_batches if fault == "accum_no_divide" else 1 / c.micro_batches \
            if fault == "accum_divided_twice" else 1
        if fault == "backward_on_running_loss":
            running = N.backward_running_total(running, loss * scale)
        elif fault != "last_micro_batch_no_backward" or rows[-1] < n - 1:
            (loss * scale).backward()
        if fault == "optimizer_step_per_micro_batch" and rows[-1] < n - 1:    # the last one steps below, as usual
            N.step_inside_micro_batch_loop(model, opt, c.max_grad_norm)
        if fault == "clip_per_micro_batch":
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_grad_norm)
        if fault == "grads_accumulated_in_bf16":
            S.round_grads_to_bf16(model)
        total += float(loss.detach())
        lp_rows.append(lp.detach())
        old_rows.append(old)
    if rec is not None:
        lp_rows = lp_rows[::-1] if fault == "logps_mb_order_reversed" else lp_rows
        rec.logprobs(torch.cat(lp_rows), old=torch.cat(old_rows) if old_rows[0] is not None else None,
                     ref=ro["ref_logps"], training=model.training)
        rec.loss(total)
        if not c.gradient_after_clip:
            rec.gradient(model)
    if fault == "clip_grad_norm_per_parameter":
        for p_ in model.parameters():
            torch.nn.utils.clip_grad_norm_([p_], c.max_grad_norm)
    elif fault == "clip_norm_of_first_shard":
        F.clip_by_first_shard_norm(list(model.parameters()), c.max_grad_norm)
    elif fault == "grad_norm_counts_tied_twice":
        S7.clip_counting_tied_twice(model, c.max_grad_norm)
    elif fault == "clip_before_unscale":
        S7.clip_while_scaled(model, c.max_grad_norm)
    elif fault not in ("no_clip", "clip_after_step"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_grad_norm)
    if rec is not None and c.gradient_after_clip:
        rec.gradient(model)
    if fault == "grad_value_clipped":
        torch.nn.utils.clip_grad_value_(model.parameters(), 1e-3)
    if fault == "scheduler_stepped_early" and L.sched is not None:
        L.sched.step()
    held = [p_.detach().clone() for p_ in model.parameters()] if fault == "update_clamped" else None
    for group in opt.param_groups if rec is not None else ():
        group["lr"] = group["lr"] * 10 if fault == "lr_changed" else 0.0 if fault == "lr_zero" else group["lr"]
        group["weight_decay"] = 0.5 if fault == "weight_decay_changed" else group["weight_decay"]
    if fault == "sampler_synced_before_step" and L.sampler is not None:
        L.sampler.load_state_dict(model.state_dict())          # synced here, the update not yet applied
    if fault != "no_step":
        opt.step()
    if fault == "clip_after_step":
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_grad_norm)
    if held is not None:
        with torch.no_grad():
            for p_, h in zip(model.parameters(), held):
                p_.copy_(h + (p_ - h).clamp(-1e-5, 1e-5))
    if L.sched is not None and fault != "scheduler_stepped_early":
        L.sched.step()
    if rec is not None:
        rec.model_after(model)


def _tokens(ro: dict, fault: str):
    """The token count a token-normalised loss divides by: the in-loss tokens, or a fault's other count."""
    if fault == "dapo_tokens_with_truncated":
        return ro["raw_mask"].sum()
    return ro["mask"].numel() if fault == "dapo_tokens_all_positions" else ro["mask"].sum()


def run(c: LoopConfig, out: Optional[str] = None, fault: str = ""):
    """Train `c.steps` rollouts of `c.num_iterations` optimizer passes each with `fault` written into the loop;
    record one pass of the last rollout (`c.record_pass`). Returns the StepRecorder."""
    if fault and fault not in ALL_FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {sorted(ALL_FAULTS)}")
    L, rec = _setup(c), None
    if fault in ("optimizer_without_vectors", "norm_weights_decayed", "tied_weight_stepped_twice"):
        L.opt = F.optimizer_without_vectors(L.model, c.lr) if fault == "optimizer_without_vectors" else \
            E8.optimizer_over_named_parameters(L.model, c.lr) if fault == "tied_weight_stepped_twice" else \
            S.optimizer_no_decay_by_name(L.model, c.lr, c.weight_decay)
        L.sched = schedule(L.opt, c) if c.scheduler else None
    record_pass = c.record_pass % c.num_iterations
    for step in range(1, c.steps + 1):
        ro = _rollout(L, c, step, fault)
        for k in range(c.num_iterations):
            recording = step == c.steps and k == record_pass
            step_rec = _recorder(L, c, (step - 1) * c.num_iterations + k + 1, k, ro) if recording else None
            _optimizer_step(L, c, ro, fault, step_rec, recording)
            rec = step_rec or rec
    if out is not None:
        rec.save(out)
    return rec
