"""Completion ids changed after sampling, found from the sampler's own log-probs: at each disagreeing position the
distribution of the weights that sampled holds exactly one token whose log-prob is the recorded one."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from rookworld_debug.diagnosis.replay.records import DISAGREE, PhaseCheck
from rookworld_debug.diagnosis.replay.rewritten_ids import rewritten_ids

N, T, V, EOS = 3, 6, 11, 10


def _case(rewrite):
    """(check, recorded, trusted, mask, logits, rollout): a sampler's draws, then `rewrite(ids)` applied to them."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, T, V, generator=g) * 2                                   # (N, T, V)
    drawn = torch.randint(0, EOS, (N, T), generator=g)                               # no EOS drawn
    ids = rewrite(drawn.clone())
    lp = (logits / 0.8).log_softmax(-1)
    recorded = lp.gather(-1, drawn[..., None]).squeeze(-1)                           # what the sampler drew
    trusted = lp.gather(-1, ids[..., None]).squeeze(-1)                              # the recompute at the ids
    rollout = SimpleNamespace(completion_ids=ids, temperatures=torch.full((N,), 0.8))
    check = PhaseCheck("scoring", "sampling_per_token_logps (N, T): the sampler's log-probs", DISAGREE,
                       float((recorded - trusted).abs().max()), 1e-5)
    return check, recorded, trusted, torch.ones(N, T), (lambda: logits), rollout


def _last_to_eos(ids):
    ids[1, -1] = EOS
    return ids


def _middle_changed(ids):
    ids[2, 2] = (ids[2, 2] + 1) % EOS
    return ids


def test_eos_written_over_a_truncated_completions_last_token_is_named():
    check, *rest, rollout = _case(_last_to_eos)
    out = rewritten_ids(check, *rest, rollout, 1e-5, EOS)
    assert out.phase == "generation" and out.cause == "eos_forced_on_truncated"
    assert "row 1 token 5" in out.explanation and "length limit" in out.explanation


def test_an_id_changed_elsewhere_is_named_as_rewritten():
    check, *rest, rollout = _case(_middle_changed)
    out = rewritten_ids(check, *rest, rollout, 1e-5, EOS)
    assert out.phase == "generation" and out.cause == "completion_ids_rewritten" and "row 2 token 2" in out.explanation


def test_a_difference_no_token_reproduces_is_left_as_it_was():
    check, recorded, trusted, mask, logits, rollout = _case(_last_to_eos)
    shifted = recorded + 0.37 * (recorded != trusted)              # not any token's log-prob at that position
    assert rewritten_ids(check, shifted, trusted, mask, logits, rollout, 1e-5, EOS) is check
