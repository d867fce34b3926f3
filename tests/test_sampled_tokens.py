"""The sampler read from the tokens it chose (diagnosis/replay/sampled_tokens.py): tokens drawn from a known
distribution by a known sampler, judged against the declared (unfiltered) distribution. Each sampler's mechanism
must be named with its setting, and tokens drawn from the declared distribution itself must get no finding, seed
after seed (the tests' false-alarm bounds are family-wise 1e-4 and 5 standard deviations)."""
from __future__ import annotations

import pytest
import torch

from rookworld_debug.diagnosis.replay import sampled_tokens as S
from rookworld_debug.diagnosis.replay.records import AGREE, DISAGREE, SUSPECT

N, T, V, P = 8, 128, 257, 12            # rows, completion tokens, vocabulary, prompt tokens


EOS = 0


def _draw(seed: int, sampler=None, temperature: float = 1.0, penalty: float = 1.0, min_new: int = 0) -> dict:
    """The statistics of N×T tokens drawn one position at a time from softmax(logits / temperature), through
    `sampler` (a function of the (N, V) log-probs) and a repetition penalty (HF's: a seen token's logit ÷ penalty
    when positive, × penalty when negative), judged against softmax(logits) itself; EOS (id 0, its logit raised
    so rows end early) forbidden before `min_new` tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, T, V, generator=g) * 2.5                                    # (N, T, V)
    logits[..., EOS] += 4.0
    prompt = torch.randint(0, V, (N, P), generator=g)
    seen = torch.zeros(N, V, dtype=torch.bool).scatter_(1, prompt, True)
    ids = torch.zeros(N, T, dtype=torch.long)
    for t in range(T):
        z = logits[:, t] / temperature
        z = torch.where(seen, torch.where(z > 0, z / penalty, z * penalty), z)
        z = z.clone()
        z[:, EOS] = -float("inf") if t < min_new else z[:, EOS]
        lp = z.log_softmax(-1)
        lp = sampler(lp) if sampler is not None else lp
        ids[:, t] = torch.multinomial(lp.exp(), 1, generator=g).squeeze(1)
        seen[torch.arange(N), ids[:, t]] = True
    mask = torch.ones(N, T, dtype=torch.bool)
    return S.statistics_of(logits.log_softmax(-1), ids, mask, S.seen_before(prompt, torch.ones(N, P, dtype=torch.bool),
                                                                            ids, V), eos=EOS)


def _top_p(q: float):
    def warp(lp):
        p, order = lp.exp().sort(-1, descending=True)
        drop = (p.cumsum(-1) - p) >= q
        return lp.masked_fill(drop.scatter(-1, order, drop), -float("inf")).log_softmax(-1)
    return warp


def _top_k(k: int):
    def warp(lp):
        kth = lp.topk(k, -1).values[:, -1:]
        return lp.masked_fill(lp < kth, -float("inf")).log_softmax(-1)
    return warp


def _greedy(lp):
    return torch.full_like(lp, -float("inf")).scatter(-1, lp.argmax(-1, keepdim=True), 0.0)


@pytest.mark.parametrize("seed", range(12))
def test_tokens_drawn_from_the_declared_distribution_get_no_finding(seed):
    c = S.judge(_draw(seed))
    assert c.status == AGREE and not c.cause, c.explanation


@pytest.mark.parametrize("sampler, name", [(_top_p(0.9), "top_p=0.9"), (_top_p(0.8), "top_p=0.8"),
                                           (_top_k(20), "top_k=20"), (_top_k(50), "top_k=50")])
def test_a_filter_the_loop_does_not_declare_is_named_with_its_setting(sampler, name):
    c = S.judge(_draw(0, sampler))
    assert c.status == DISAGREE and c.cause == "sampler_distribution_changed", c.explanation
    assert c.fit["params"]["filter"] == name and c.max_abs_diff < S.P_ERROR
    assert f"{N * T} chosen tokens" in c.explanation and "does not declare" in c.explanation


def test_an_end_of_sequence_forbidden_before_a_length_is_named_with_it():
    c = S.judge(_draw(0, min_new=30))
    assert c.status == DISAGREE and c.cause == "sampler_distribution_changed", c.explanation
    assert c.fit["params"]["filter"] == "min_new_tokens≥30" and "no row ended before token 30" in c.explanation


def test_greedy_decoding_is_named_as_such():
    c = S.judge(_draw(0, _greedy))
    assert c.status == DISAGREE and c.cause == "sampling_greedy" and "greedy" in c.explanation


def test_a_repetition_penalty_is_named_from_the_repeats_it_suppressed():
    c = S.judge(_draw(0, penalty=1.5))
    assert c.cause == "sampler_distribution_changed" and c.fit["kind"] == "sampler_repetition", c.explanation
    assert c.fit["params"]["z"] < -S.Z_WARN and c.fit["params"]["observed"] < c.fit["params"]["expected"]


def test_a_lower_sampling_temperature_is_named_as_a_sharper_distribution():
    c = S.judge(_draw(0, temperature=0.7))
    assert c.cause == "sampler_distribution_changed" and c.status in (DISAGREE, SUSPECT)
    assert c.fit["kind"] in ("sampler_sharpness", "sampler_filter"), c.fit
    if c.fit["kind"] == "sampler_sharpness":
        assert c.fit["params"]["z"] > S.Z_WARN and "sharper" in c.explanation


def _shared_draw(seed: int, penalty: float = 1.0, g: int = 4):
    """(statistics, rollout) of N×T tokens where each group of g rows draws with ONE uniform per position (the rows
    of a group are then one completion), through HF's repetition penalty; judged against softmax(logits)."""
    from types import SimpleNamespace
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, T, V, generator=gen) * 2.5
    logits = logits.view(N // g, g, T, V)[:, :1].expand(N // g, g, T, V).reshape(N, T, V)   # a group: one prompt
    prompt = torch.randint(0, V, (N // g, 1, P), generator=gen).expand(N // g, g, P).reshape(N, P)
    seen = torch.zeros(N, V, dtype=torch.bool).scatter_(1, prompt, True)
    ids = torch.zeros(N, T, dtype=torch.long)
    for t in range(T):
        z = torch.where(seen, torch.where(logits[:, t] > 0, logits[:, t] / penalty, logits[:, t] * penalty),
                        logits[:, t])
        u = torch.rand(N // g, 1, generator=gen).repeat_interleave(g, 0)                 # (N, 1) shared per group
        ids[:, t] = (z.softmax(-1).cumsum(-1) < u).sum(-1).clamp(max=V - 1)
        seen[torch.arange(N), ids[:, t]] = True
    mask = torch.ones(N, T, dtype=torch.long)
    st = S.statistics_of(logits.log_softmax(-1), ids, mask, S.seen_before(prompt, torch.ones(N, P, dtype=torch.bool),
                                                                           ids, V))
    return st, SimpleNamespace(num_generations=g, completion_ids=ids, completion_mask=mask)


def test_rows_drawn_with_one_seed_per_group_are_named_unless_their_tokens_reject_the_distribution():
    c = S.shared_or_judged(*_shared_draw(0))
    assert c.status == DISAGREE and c.cause == "sampling_draws_shared", c.explanation
    assert c.fit["params"]["rows"] == [k * 4 + j for k in range(N // 4) for j in range(1, 4)]
    # a penalty that forces tokens repeats a group's rows too: the distinct rows' tokens name the penalty instead
    st, r = _shared_draw(0, penalty=3.0)
    assert S.shared_draws(st, r) is not None             # the identical rows alone would read as shared draws
    c = S.shared_or_judged(st, r)
    assert c.cause == "sampler_distribution_changed" and c.fit["kind"] == "sampler_repetition", c.explanation


def test_too_few_tokens_or_a_declared_filter_are_not_tested():
    class Rollout:                       # only what the check reads before it needs a model
        completion_mask = torch.ones(1, S.MIN_TOKENS - 1)
    assert S.sampled_tokens_check(None, Rollout(), declared_filter=False) is None
    Rollout.completion_mask = torch.ones(4, 64)
    assert S.sampled_tokens_check(None, Rollout(), declared_filter=True) is None


# --------------------------------------------------------------------- the per-row fit's reading
def test_rows_that_took_other_rows_advantages_are_named_with_the_offset():
    from rookworld_debug.diagnosis.replay.terms import rows_cause
    adv = torch.tensor([1.2, -0.4, -0.8, 0.9, -0.3, -0.6, 0.0, 0.0], dtype=torch.float64)
    used = torch.cat([adv[:4], adv[:4]])                           # the second micro-batch re-used the first's
    code, why = rows_cause({"policy": used, "kl": torch.full((8,), 0.04, dtype=torch.float64)}, adv, 0.04,
                           torch.full((8,), 30))
    assert code == "loss_wiring" and "rows 4–7 used the advantages of rows 0–3" in why


def test_a_kl_summed_per_row_is_named_from_the_row_lengths():
    from rookworld_debug.diagnosis.replay.terms import rows_cause
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    lengths = torch.tensor([10, 25, 7, 40])
    code, why = rows_cause({"policy": adv.clone(), "kl": 0.04 * lengths.double()}, adv, 0.04, lengths)
    assert code == "loss_terms" and "summed over each row's tokens" in why and "scaled" not in why
    # weights that follow no row quantity: said as they are, with no mechanism claimed
    code, why = rows_cause({"policy": adv.clone(), "kl": torch.tensor([0.04, 0.5, 0.01, 0.3], dtype=torch.float64)},
                           adv, 0.04, lengths)
    assert "its own β" in why and "summed" not in why
    # a row weight that is no advantage of the step is not a wiring
    assert rows_cause({"policy": adv * 3, "kl": None}, adv, 0.04, lengths) is None
