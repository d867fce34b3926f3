"""The static-shape decode loop (fixed-capacity KV cache, finished rows masked, bookkeeping on the device) equals the
dynamic loop token for token on the CPU, with the same sampling-time log-probs to float tolerance: sampled rows
(temperature, top-k, top-p, mixed per row), greedy rows in the same loop, and the entropy/top-k statistics."""
from __future__ import annotations

import warnings

import pytest
import torch


@pytest.fixture(scope="module")
def model_and_prompts():
    from rookworld_debug.data.loaders import load_bundled
    from rookworld_debug.models.loading import load_policy_and_reference
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_policy_and_reference("tiny")
    tok = loaded.tokenizer
    texts = [s.prompt for s in load_bundled()[:3]]
    enc = tok(texts, return_tensors="pt", padding=True)
    return loaded.policy, tok, enc.input_ids, enc.attention_mask


def _both(model, tok, ids, mask, **kw):
    from rookworld_debug.grpo.phases.decoding import decode
    from rookworld_debug.grpo.phases.decoding_static import decode_static
    out = []
    for fn in (decode, decode_static):
        sp = kw.get("sampling")
        if sp is not None:
            from dataclasses import replace
            kw = {**kw, "sampling": replace(sp, generator=torch.Generator().manual_seed(7))}
        out.append(fn(model, ids, mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **kw))
    return out


def _params(n, **kw):
    from rookworld_debug.grpo.phases.decoding import SamplingParams
    return SamplingParams(temperatures=torch.full((n,), 0.9), **kw)


@pytest.mark.parametrize("warp", [{}, {"top_k": 5}, {"top_p": 0.9}])
def test_sampled_rows_are_the_dynamic_loop_s(model_and_prompts, warp):
    model, tok, ids, mask = model_and_prompts
    n = ids.shape[0] * 3
    warpers = {k: torch.full((n,), v) for k, v in warp.items()}
    dyn, sta = _both(model, tok, ids, mask, expand=3, max_new_tokens=40, sampling=_params(n, stats_k=3, **warpers))
    assert torch.equal(dyn.tokens, sta.tokens) and dyn.steps == sta.steps
    assert torch.allclose(dyn.logps, sta.logps, atol=1e-5)
    assert torch.allclose(dyn.entropy, sta.entropy, atol=1e-4) and torch.equal(dyn.topk_ids, sta.topk_ids)


def test_greedy_rows_in_the_same_loop_are_the_dynamic_loop_s(model_and_prompts):
    from rookworld_debug.grpo.phases.decoding import GreedyRows
    model, tok, ids, mask = model_and_prompts
    greedy = GreedyRows(ids[:2], mask[:2], max_new_tokens=25)
    dyn, sta = _both(model, tok, ids, mask, expand=2, max_new_tokens=30, sampling=_params(ids.shape[0] * 2),
                     greedy=greedy)
    assert torch.equal(dyn.tokens, sta.tokens) and torch.equal(dyn.greedy_tokens, sta.greedy_tokens)


def test_greedy_decoding_is_the_dynamic_loop_s(model_and_prompts):
    model, tok, ids, mask = model_and_prompts
    dyn, sta = _both(model, tok, ids, mask, expand=1, max_new_tokens=60)
    assert torch.equal(dyn.tokens, sta.tokens) and dyn.logps is None and sta.logps is None
