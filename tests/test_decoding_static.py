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


def test_the_loop_is_chosen_per_device_and_the_trace_says_which_ran(model_and_prompts):
    from rookworld_debug.grpo.phases.decoding import decode
    from rookworld_debug.grpo.phases.decoding_static import decode_static, loop_for
    model, tok, ids, mask = model_and_prompts
    assert loop_for("cpu", None) is decode                      # measured: the dynamic loop is faster on the CPU
    assert loop_for("cuda", None).func is decode_static and loop_for("cuda", None).keywords == {"graph": True}
    d = decode_static(model, ids, mask, expand=1, max_new_tokens=8, eos_id=tok.eos_token_id,
                      pad_id=tok.pad_token_id, graph=True)
    assert d.loop == "static" and "CUDA graphs need a CUDA device" in d.note


def test_a_cpu_rollout_records_the_dynamic_loop(tiny_byte_model_dir, fixtures_dir):
    from rookworld_debug.grpo.step import run_step
    from tinymodels import tiny_step_config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = run_step(tiny_step_config(tiny_byte_model_dir, dataset=str(fixtures_dir / "rook_p_lines.txt"),
                                      eval_max_new_tokens=4))
    assert t.rollout.counts["decode_static"] == 0 and t.rollout.counts["decode_graph"] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device: the graph path is CUDA-only")
def test_the_graphed_loop_equals_the_dynamic_loop_on_cuda(model_and_prompts):
    from rookworld_debug.grpo.phases.decoding import decode
    from rookworld_debug.grpo.phases.decoding_static import decode_static
    model, tok, ids, mask = model_and_prompts
    model = model.to("cuda")
    sp = _params(ids.shape[0] * 4)
    outs = []
    for fn in (decode, lambda *a, **k: decode_static(*a, graph=True, **k)):
        from dataclasses import replace
        outs.append(fn(model, ids, mask, expand=4, max_new_tokens=60, eos_id=tok.eos_token_id,
                       pad_id=tok.pad_token_id,
                       sampling=replace(sp, generator=torch.Generator(device="cuda").manual_seed(3))))
    dyn, gra = outs
    assert gra.loop == "static+graph", gra.note
    assert torch.equal(dyn.tokens, gra.tokens) and torch.allclose(dyn.logps, gra.logps, atol=1e-3)
