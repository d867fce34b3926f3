"""grpo.phases.generation: sampling on the sampled ids, TRL-exact log-probs, padding, determinism, EOS, consistency."""
import pytest
import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.phases import generation as gen
from rookworld_debug.grpo.phases.generation import Rollout, generate, per_token_logps_and_entropy
from rookworld_debug.models import load_policy_and_reference
from tinymodels import save_tiny_gpt2

EOS = "<|endoftext|>"
P_PROMPT = "P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
A_PROMPT = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
SAMPLING = {"P": (0.5, 0.9, None), "A": (0.95, 0.95, 20)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny random GPT-2 saved to disk and loaded like a user would.

    EOS is made likely (~12 % per token at T=0.5, ~2.5 % at T=0.95) so rollouts hold both ended and
    truncated completions."""
    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gen"), n_positions=256)
    return load_policy_and_reference(folder)


@pytest.fixture(scope="module")
def rollout(models) -> Rollout:
    pol, ref, tok, _ = models
    return generate(pol, ref, tok, [P_PROMPT, A_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1"], ["P", "A", "P"],
                    num_generations=4, max_new_tokens=24, sampling=SAMPLING, seed=7)


def test_shapes_and_trl_layout(rollout):
    n, t = rollout.completion_ids.shape
    assert n == 12 and t <= 24 and rollout.prompt_ids.shape == rollout.prompt_mask.shape
    assert rollout.prompts[:4] == (P_PROMPT,) * 4 and rollout.tasks[4:8] == ("A",) * 4  # G copies consecutive
    for name in ("per_token_logps", "ref_per_token_logps", "per_token_entropy", "per_token_full_kl",
                 "sampling_per_token_logps"):
        assert getattr(rollout, name).shape == (n, t) and getattr(rollout, name).dtype == torch.float32
    assert rollout.topk_ids.shape == rollout.topk_logps.shape == (n, t, 5)
    assert rollout.is_truncated.shape == (n,) and rollout.unique_per_group.shape == (3,)
    assert rollout.prompt_mask[:, -1].all() and not rollout.prompt_mask[:, 0].all()  # left padding
    assert len(rollout.completions) == len(rollout.completion_tokens) == len(rollout.topk_tokens) == n
    with pytest.raises(AttributeError):
        rollout.seed = 1  # frozen


def test_mixed_batch_one_decoding_loop_per_row_settings(rollout):
    assert rollout.counts["generate_calls"] == 1        # P: and A: rows decode together, per-row T/top-p/top-k
    assert rollout.temperatures.tolist() == pytest.approx([0.5] * 4 + [0.95] * 4 + [0.5] * 4)
    assert rollout.sampling == SAMPLING


def test_eos_kept_in_mask_and_everything_after_cut(models, rollout):
    eos = models.tokenizer.eos_token_id
    ids, mask = rollout.completion_ids, rollout.completion_mask
    lengths = mask.sum(1)
    ended = ~rollout.is_truncated
    assert ended.any() and rollout.is_truncated.any()  # the fixture model produces both kinds
    last = ids.gather(1, (lengths - 1)[:, None]).squeeze(1)
    assert (last[ended] == eos).all()                  # EOS is the last masked token ...
    assert ((ids == eos) & (mask == 1)).sum(1)[ended].eq(1).all()  # ... and the only one in the mask
    assert (ids[mask == 0] == models.tokenizer.pad_token_id).all()
    assert (mask[rollout.is_truncated] == 1).all() and (lengths[rollout.is_truncated] == 24).all()
    assert (mask[:, 1:] <= mask[:, :-1]).all()         # contiguous from the left
    assert rollout.counts["tokens_generated"] == int(mask.sum())
    assert rollout.completion_tokens[int(ended.nonzero()[0])][-1] == EOS
    assert all(EOS not in c for c in rollout.completions)  # special tokens skipped in texts


def test_recompute_consistency(rollout):
    assert rollout.max_abs_logp_diff < 1e-4 and not rollout.logp_diff_flagged
    assert not [w for w in rollout.warnings if "recomputed" in w or "dropout" in w]  # empty rows are flagged too
    m = rollout.completion_mask.bool()
    assert (rollout.per_token_logps[m] < 0).all() and (rollout.per_token_logps[~m] == 0).all()


def test_policy_equals_reference_at_step_zero(rollout):
    m = rollout.completion_mask.bool()
    assert torch.equal(rollout.per_token_logps, rollout.ref_per_token_logps)
    assert rollout.per_token_full_kl[m].abs().max() < 1e-6


def test_topk_alternatives(rollout, models):
    m = rollout.completion_mask.bool()
    assert (rollout.topk_logps[..., :-1] >= rollout.topk_logps[..., 1:]).all()
    # the sampled token can never be more likely than the top-1 alternative
    assert (rollout.per_token_logps[m] <= rollout.topk_logps[..., 0][m] + 1e-6).all()
    i, t = 0, 0
    # byte-level strings (the tokenizer's own vocab strings), not decoded text: views render them by bytes
    assert rollout.topk_tokens[i][t][0] == models.tokenizer.convert_ids_to_tokens(int(rollout.topk_ids[i, t, 0]))
    assert rollout.completion_tokens[i][t] == models.tokenizer.convert_ids_to_tokens(int(rollout.completion_ids[i, t]))


def test_matches_trl_selective_log_softmax_and_entropy(models, rollout):
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    r = rollout
    t = r.completion_ids.shape[1]
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1)
    attn = torch.cat([r.prompt_mask, r.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = models.policy(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -t - 1:-1]
    logits = logits / r.temperatures[:, None, None]
    m = r.completion_mask.bool()
    trl_logps = selective_log_softmax(logits, r.completion_ids)
    trl_entropy = entropy_from_logits(logits)
    assert (trl_logps - r.per_token_logps)[m].abs().max() < 1e-5
    assert (trl_entropy - r.per_token_entropy)[m].abs().max() < 1e-5
    # exact full-vocabulary KL against an independent formula (reference == policy here, so check vs itself)
    kl = torch.nn.functional.kl_div(logits.log_softmax(-1), logits.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    assert (kl - r.per_token_full_kl)[m].abs().max() < 1e-6


def test_helper_matches_rollout_and_supports_grad(models, rollout):
    r = rollout
    args = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.temperatures)
    logps, ent = per_token_logps_and_entropy(models.policy, *args, chunk=5)
    assert torch.allclose(logps, r.per_token_logps, atol=1e-6) and torch.allclose(ent, r.per_token_entropy, atol=1e-6)
    logps_g, _ = per_token_logps_and_entropy(models.policy, *args, with_grad=True)
    assert logps_g.requires_grad
    (logps_g * r.completion_mask).sum().backward()
    assert models.policy.transformer.wte.weight.grad is not None
    models.policy.zero_grad(set_to_none=True)


def test_columns_past_every_rows_end_are_not_run_and_change_nothing(models, rollout):
    """A rollout padded with completion columns no row reaches (a loop padding to max_new_tokens) gets the same
    log-probs, entropies and gradient, 0 in those columns; the forward runs only the columns a mask holds."""
    from rookworld_debug.grpo.phases.scoring import used_columns
    r, extra = rollout, 7
    pad = lambda x: torch.nn.functional.pad(x, (0, extra))                      # noqa: E731
    args = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.temperatures)
    wide = (r.prompt_ids, r.prompt_mask, pad(r.completion_ids), pad(r.completion_mask), r.temperatures)
    assert used_columns(wide[3]) == used_columns(r.completion_mask) <= r.completion_ids.shape[1]
    seen = []
    hook = models.policy.get_output_embeddings().register_forward_hook(lambda m, a, o: seen.append(a[0].shape[1]))
    try:
        lp, ent = per_token_logps_and_entropy(models.policy, *args, with_grad=True)
        lp_w, ent_w = per_token_logps_and_entropy(models.policy, *wide, with_grad=True)
    finally:
        hook.remove()
    assert seen[-1] == used_columns(r.completion_mask)                         # the padding never ran
    assert lp_w.shape[1] == lp.shape[1] + extra and not bool(lp_w[:, -extra:].any() or ent_w[:, -extra:].any())
    assert torch.allclose(lp_w[:, :-extra], lp, atol=1e-6) and torch.allclose(ent_w[:, :-extra], ent, atol=1e-6)
    w = models.policy.transformer.wte.weight
    g, = torch.autograd.grad(lp.sum(), w)
    g_w, = torch.autograd.grad(lp_w.sum(), w)
    assert torch.allclose(g, g_w, atol=1e-6, rtol=1e-5)
    assert used_columns(torch.zeros(2, 5)) == 1


def test_left_padding_does_not_change_logps(models):
    """A prompt's log-probs are the same alone and batched with a much longer prompt."""
    pol, _, tok, _ = models
    short, long = "P: 8/8/8/8/8/8/8/K6k w", A_PROMPT + " and a much longer tail " * 3
    completion = torch.tensor(tok([" M: a1a2 b2b3", " M: c3c4 d4d5"]).input_ids)  # equal lengths
    mask = torch.ones_like(completion)
    enc_alone = tok([short], return_tensors="pt")
    enc_batch = tok([short, long], padding=True, padding_side="left", return_tensors="pt")
    assert enc_batch.attention_mask[0].sum() < enc_batch.attention_mask.shape[1]  # really padded
    alone, ent_alone = per_token_logps_and_entropy(pol, enc_alone.input_ids, enc_alone.attention_mask,
                                                   completion[:1], mask[:1], 0.7)
    batch, ent_batch = per_token_logps_and_entropy(pol, enc_batch.input_ids, enc_batch.attention_mask,
                                                   completion, mask, 0.7)
    assert (alone[0] - batch[0]).abs().max() < 1e-5 and (ent_alone[0] - ent_batch[0]).abs().max() < 1e-5


def test_same_seed_same_ids_and_rng_untouched(models):
    pol, ref, tok, _ = models
    kw = dict(num_generations=3, max_new_tokens=12, sampling=SAMPLING, seed=123, compute_ref=False)
    state = torch.get_rng_state()
    a = generate(pol, ref, tok, [P_PROMPT], ["P"], **kw)
    b = generate(pol, ref, tok, [P_PROMPT], ["P"], **kw)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is not advanced
    assert torch.equal(a.completion_ids, b.completion_ids) and a.completions == b.completions
    c = generate(pol, ref, tok, [P_PROMPT], ["P"], **{**kw, "seed": 124})
    assert not torch.equal(a.completion_ids, c.completion_ids)
    assert a.ref_per_token_logps is None and a.per_token_full_kl is None


@pytest.mark.parametrize("greedy_max", [6, 40])
def test_greedy_rows_in_the_sampling_loop_change_nothing(models, rollout, greedy_max):
    """The before-update greedy rows ride in the sampling loop. The rollout is the one a loop of
    its own gives (same ids, masks, sampling-time log-probs to float noise), and the greedy completions are
    `greedy_completions`' — whether the greedy rows stop before the samples (6) or go on after them (40)."""
    from rookworld_debug.grpo.phases.evaluation import greedy_completions
    from rookworld_debug.grpo.phases.generation import generate_with_greedy
    pol, ref, tok, _ = models
    greedy_prompts = [P_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1", A_PROMPT + "e2e4+"]   # a longer prompt too
    merged, greedy = generate_with_greedy(
        pol, ref, tok, [P_PROMPT, A_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1"], ["P", "A", "P"], num_generations=4,
        max_new_tokens=24, sampling=SAMPLING, seed=7, greedy_prompts=greedy_prompts, greedy_max_new_tokens=greedy_max)
    assert torch.equal(merged.completion_ids, rollout.completion_ids)
    assert torch.equal(merged.completion_mask, rollout.completion_mask)
    assert merged.completions == rollout.completions
    assert torch.allclose(merged.sampling_per_token_logps, rollout.sampling_per_token_logps, atol=1e-5)
    assert torch.allclose(merged.per_token_logps, rollout.per_token_logps, atol=1e-6)
    assert greedy == greedy_completions(pol, tok, greedy_prompts, greedy_max)
    # sampling-only call through the same path: identical to generate()
    alone, none = generate_with_greedy(pol, ref, tok, [P_PROMPT, A_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1"],
                                       ["P", "A", "P"], num_generations=4, max_new_tokens=24, sampling=SAMPLING,
                                       seed=7)
    assert none == [] and torch.equal(alone.sampling_per_token_logps, rollout.sampling_per_token_logps)


def _rows(tok, prompts, g):
    enc = tok([p for p in prompts for _ in range(g)], padding=True, padding_side="left", return_tensors="pt")
    return enc, enc.input_ids[::g], enc.attention_mask[::g]


@pytest.mark.parametrize("temp, top_p, top_k", [(0.8, 0.9, 0), (1.0, 1.0, 5), (0.6, 0.5, 12)])
def test_decode_matches_generate_tokens_and_logits(models, temp, top_p, top_k):
    """Our loop draws the same tokens as transformers' generate for the same seed (multinomial = argmax(p/Exp)
    over all N rows), and its sampling-time log-probs are log_softmax(raw logits / T) of generate's logits."""
    from transformers import GenerationConfig

    from rookworld_debug.grpo.phases.decoding import SamplingParams, decode
    pol, _, tok, _ = models
    g, t = 3, 16
    enc, ids_b, mask_b = _rows(tok, [P_PROMPT, A_PROMPT], g)
    torch.manual_seed(11)
    out = pol.generate(**enc, generation_config=GenerationConfig(
        max_new_tokens=t, do_sample=True, temperature=temp, top_p=top_p, top_k=top_k, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, return_dict_in_generate=True, output_logits=True, disable_compile=True))
    new = out.sequences[:, enc.input_ids.shape[1]:]                                       # (N, L)
    n = new.shape[0]
    d = decode(pol, ids_b, mask_b, expand=g, max_new_tokens=t, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
               sampling=SamplingParams(temperatures=torch.full((n,), temp), top_k=torch.full((n,), top_k),
                                       top_p=torch.full((n,), top_p), generator=torch.Generator().manual_seed(11)))
    assert torch.equal(d.tokens, new)
    ref = torch.stack(out.logits, 1).div(temp).log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)  # (N, L)
    _, mask, _ = gen._cut_after_eos(new, tok.eos_token_id, tok.pad_token_id)
    assert (d.logps - ref)[mask.bool()].abs().max() < 1e-5


def test_greedy_decode_matches_generate(models):
    from rookworld_debug.grpo.phases.decoding import SamplingParams, decode
    from rookworld_debug.grpo.phases.evaluation import greedy_completions
    pol, _, tok, _ = models
    prompts = [P_PROMPT, A_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1"]
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    out = pol.generate(**enc, do_sample=False, max_new_tokens=20, pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id, disable_compile=True)[:, enc.input_ids.shape[1]:]
    d = decode(pol, enc.input_ids, enc.attention_mask, expand=1, max_new_tokens=20, eos_id=tok.eos_token_id,
               pad_id=tok.pad_token_id)
    assert torch.equal(d.tokens, out) and d.logps is None
    assert greedy_completions(pol, tok, prompts, 20) == tok.batch_decode(out, skip_special_tokens=True)


def test_decode_drops_finished_rows_without_changing_tokens(models):
    """Dropping finished rows (checked every step) and never dropping (no check before the end) decode
    the same tokens; the dropped rows are not forwarded any more."""
    from rookworld_debug.grpo.phases.decoding import SamplingParams, decode
    pol, _, tok, _ = models
    g, t = 6, 24
    _, ids_b, mask_b = _rows(tok, [P_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1"], g)
    kw = dict(expand=g, max_new_tokens=t, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    sampling = dict(temperatures=torch.full((2 * g,), 0.5), top_p=torch.full((2 * g,), 0.9))
    fast = decode(pol, ids_b, mask_b, sampling=SamplingParams(**sampling, generator=torch.Generator().manual_seed(3)),
                  sync_every=1, **kw)
    full = decode(pol, ids_b, mask_b, sampling=SamplingParams(**sampling, generator=torch.Generator().manual_seed(3)),
                  sync_every=10**6, **kw)
    assert full.steps == t and full.row_steps == 2 * g * (t - 1)
    assert torch.equal(full.tokens[:, :fast.steps], fast.tokens)
    assert (full.tokens[:, fast.steps:] == tok.pad_token_id).all()
    m = gen._cut_after_eos(fast.tokens, tok.eos_token_id, tok.pad_token_id)[1].bool()
    assert torch.allclose(full.logps[:, :fast.steps][m], fast.logps[m], atol=1e-5)
    ended = (fast.tokens == tok.eos_token_id).any(1)
    assert ended.sum() >= 2 * g * 0.25                      # the fixture model ends often enough to drop rows
    assert fast.row_steps < 2 * g * (fast.steps - 1)


def test_per_row_settings_in_one_loop(models):
    """A top-k = 1 task decodes greedily (argmax of the tempered logits) while the other task samples, in the
    same loop: per-row warpers, not one setting for the batch."""
    from rookworld_debug.grpo.phases.evaluation import greedy_completions
    pol, ref, tok, _ = models
    r = generate(pol, ref, tok, [P_PROMPT, A_PROMPT], ["P", "A"], num_generations=4, max_new_tokens=12,
                 sampling={"P": (1.0, 1.0, None), "A": (0.9, 1.0, 1)}, seed=2, compute_ref=False)
    greedy = greedy_completions(pol, tok, [A_PROMPT], 12)[0]
    assert r.completions[4:] == (greedy,) * 4
    assert len(set(r.completions[:4])) > 1


def test_core_path_uses_the_sampling_loops_values(models, rollout):
    """score_policy=False: no policy forward; log-probs/entropy/top-k from the loop agree with the
    teacher-forced ones; the reference keeps TRL's selected log-probs; no exact KL, no recompute check."""
    pol, ref, tok, _ = models
    lean = generate(pol, ref, tok, [P_PROMPT, A_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1"], ["P", "A", "P"],
                    num_generations=4, max_new_tokens=24, sampling=SAMPLING, seed=7, score_policy=False)
    assert torch.equal(lean.completion_ids, rollout.completion_ids)   # same seed → same tokens in both modes
    m = lean.completion_mask.bool()
    assert torch.equal(lean.per_token_logps, lean.sampling_per_token_logps)
    assert (lean.per_token_logps - rollout.per_token_logps)[m].abs().max() < 1e-4
    assert (lean.per_token_entropy - rollout.per_token_entropy)[m].abs().max() < 1e-4
    assert (lean.ref_per_token_logps - rollout.ref_per_token_logps).abs().max() < 1e-6
    assert torch.equal(lean.topk_ids[m][:, 0], rollout.topk_ids[m][:, 0])
    assert lean.per_token_full_kl is None and not lean.logp_diff_flagged
    assert lean.max_abs_logp_diff != lean.max_abs_logp_diff                     # NaN: not checked
    assert lean.counts["scoring_forwards"] == 1 and lean.counts["recompute_checked"] == 0


def test_nan_logits_raise_named_error(models):
    from rookworld_debug.errors import NumericalError
    pol, ref, tok, _ = models
    w = pol.lm_head.weight if hasattr(pol, "lm_head") else pol.get_output_embeddings().weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.fill_(float("nan"))
        with pytest.raises(NumericalError, match="NaN/inf"):
            generate(pol, ref, tok, [P_PROMPT], ["P"], num_generations=2, max_new_tokens=4, sampling=SAMPLING,
                     seed=0, compute_ref=False)
    finally:
        with torch.no_grad():
            w.copy_(saved)


def test_wrong_position_ids_are_flagged(models, monkeypatch):
    """With position ids 0..L-1 (a plain forward on left-padded rows) the consistency check fires."""
    pol, ref, tok, _ = models
    from rookworld_debug.grpo.phases import scoring          # the teacher-forced forwards' module
    monkeypatch.setattr(scoring, "_position_ids", lambda attn: torch.arange(attn.shape[1]).expand_as(attn))
    r = generate(pol, ref, tok, [P_PROMPT, "P: 8/8/8/8/8/8/8/K6k w"], ["P", "P"], num_generations=2,
                 max_new_tokens=6, sampling=SAMPLING, seed=0)
    assert r.logp_diff_flagged and r.max_abs_logp_diff > 1e-4 and "position ids" in r.warnings[-1]


def test_unique_per_group_counts_ids_and_length():
    ids = torch.tensor([[1, 2, 0], [1, 2, 0], [1, 2, 3], [1, 2, 0],   # group 0: 2 distinct
                        [5, 5, 5], [6, 5, 5], [7, 5, 5], [8, 5, 5]])  # group 1: 4 distinct
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]] + [[1, 1, 1]] * 4)
    assert gen._unique_per_group(ids, mask, 4).tolist() == [3, 4]  # row 3 has a 3rd token (0): differs


def test_dropout_in_train_mode_is_reported(models):
    pol, ref, tok, _ = models
    drop = torch.nn.Dropout(0.1)
    pol.add_module("_probe_dropout", drop)
    pol.train()
    try:
        assert "dropout" in gen._dropout_warnings(policy=pol, reference=ref)[0]
    finally:
        pol.eval()
        del pol._probe_dropout


@pytest.mark.parametrize("kw, field", [
    (dict(tasks=["X"]), "sampling"),
    (dict(sampling={"P": (0.0, 1.0, None)}), "sampling"),
    (dict(num_generations=0), "num_generations"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(prompts=[""]), "prompts"),
])
def test_bad_config_raises_named_error(models, kw, field):
    pol, ref, tok, _ = models
    args = dict(prompts=[P_PROMPT], tasks=["P"], num_generations=2, max_new_tokens=4, sampling=SAMPLING, seed=0)
    args.update(kw)
    with pytest.raises(ConfigError) as e:
        generate(pol, ref, tok, args.pop("prompts"), args.pop("tasks"), **args)
    assert e.value.field == field


def test_bf16_autocast_path_runs_with_fp32_master_weights(models):
    """The GPU path (bf16 autocast, fp32 weights) exercised on CPU with autocast='bf16': the loop samples,
    the scoring and training forwards give fp32 log-probs, gradients land on the fp32 weights, and the
    recompute check names bf16 as the expected cause of any drift."""
    from rookworld_debug.models.precision import autocast_dtype, set_autocast
    pol, ref, tok, _ = models
    assert autocast_dtype(pol) is None                         # 'auto' on CPU: no autocast
    set_autocast("bf16", pol, ref)
    try:
        assert autocast_dtype(pol) == torch.bfloat16
        r = generate(pol, ref, tok, [P_PROMPT], ["P"], num_generations=2, max_new_tokens=8, sampling=SAMPLING, seed=0)
        assert r.per_token_logps.dtype == torch.float32 and torch.isfinite(r.per_token_logps).all()
        if r.logp_diff_flagged:
            assert "bfloat16" in r.warnings[-1]
        args = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.temperatures)
        logps, ent = per_token_logps_and_entropy(pol, *args, with_grad=True, entropy_grad=False)
        assert logps.dtype == torch.float32 and logps.requires_grad and not ent.requires_grad
        (logps * r.completion_mask).sum().backward()
        w = pol.transformer.wte.weight
        assert w.dtype == torch.float32 and w.grad.dtype == torch.float32 and torch.isfinite(w.grad).all()
    finally:
        set_autocast("auto", pol, ref)
        pol.zero_grad(set_to_none=True)


def test_device_auto_is_the_default_and_resolves():
    from rookworld_debug.config import StepConfig
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.models.devices import check_device
    assert StepConfig().device == "auto" and StepConfig().autocast == "auto"
    assert check_device("auto").type == ("cuda" if torch.cuda.is_available() else check_device("auto").type)
    with pytest.raises(ConfigError) as e:
        StepConfig(autocast="fp8")
    assert e.value.field == "autocast"


def test_auto_micro_batch_size_splits_124m_not_tiny(models):
    """micro_batch_size=None: a GPT-2 124M grad forward over 32 rows × 170 tokens is split (estimate > 1 GiB)
    into a divisor of N; the tiny fixture model runs all rows at once."""
    from transformers import GPT2Config, GPT2LMHeadModel
    with torch.device("meta"):
        big = GPT2LMHeadModel(GPT2Config())
    k = gen.auto_micro_batch_size(big, 32, 170)
    assert 1 <= k < 32 and 32 % k == 0
    assert gen.auto_micro_batch_size(big, 7, 170) in (1, 7)
    assert gen.auto_micro_batch_size(models.policy, 32, 170) == 32


@pytest.mark.parametrize("t", [1, 7])
def test_shared_prompt_forward_equals_the_full_forward(models, t):
    # a group's G rows share one prompt forward (KV cache indexed out to the rows); logits and
    # gradients must be the full per-row forward's up to float summation order
    from rookworld_debug.grpo.phases.generation import _forward_completion_logits, _position_ids
    pol = models.policy
    g_ = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 200, (3, 10), generator=g_).repeat_interleave(4, 0)          # (12, 10), B=3, G=4
    pmask = torch.ones_like(prompts)
    pmask[:4, :3] = 0                                                                      # left padding, group 0
    comp = torch.randint(0, 200, (12, t), generator=g_)
    cmask = torch.ones_like(comp)
    cmask[5, t // 2 + 1:] = 0                                                              # a finished row
    seen = []
    hook = pol.base_model.register_forward_hook(lambda m, a, k, out: seen.append(tuple(k["input_ids"].shape)),
                                              with_kwargs=True)
    try:
        shared = _forward_completion_logits(pol, prompts, pmask, comp, cmask)              # (12, t, V)
    finally:
        hook.remove()
    assert seen[0] == (3, 10)                                                              # once per distinct prompt
    attn = torch.cat([pmask, cmask], 1)
    full = pol(input_ids=torch.cat([prompts, comp], 1), attention_mask=attn, position_ids=_position_ids(attn),
               use_cache=False).logits[:, 9:-1]                                            # (12, t, V)
    m = cmask.bool()
    assert shared.shape == full.shape and (shared - full)[m].abs().max() < 1e-4
    grads = []
    for logits in (shared, full):
        pol.zero_grad()
        (logits.float().logsumexp(-1) * cmask).sum().backward(retain_graph=False)
        grads.append(torch.cat([p.grad.flatten() for p in pol.parameters()]))
    pol.zero_grad()
    assert float((grads[0] - grads[1]).norm() / grads[1].norm()) < 1e-4


def test_kv_cache_keyword_follows_the_installed_transformers(models):
    """transformers 5.24 renamed forward's `past_key_values` to `cache`; the old name warned into every
    report (and pushed the report's summary below the first screen). Generation uses whichever the
    installed forward takes, and warns nothing."""
    import inspect
    import warnings

    from rookworld_debug.grpo.phases.decoding import cache_kw

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None):
            return input_ids

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None):
            return input_ids

    assert cache_kw(New()) == "cache" and cache_kw(Old()) == "past_key_values"
    pol, ref, tok, _ = models
    assert cache_kw(pol) in inspect.signature(type(pol).forward).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        generate(pol, ref, tok, [P_PROMPT, P_PROMPT], ["P", "P"], num_generations=2, max_new_tokens=8,
                 sampling=SAMPLING, seed=3)
