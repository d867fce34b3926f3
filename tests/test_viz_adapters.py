"""Adapters from phase records / a StepTrace to the views, on a hand-built fake trace.

Advantages and the loss record come from the real grpo functions (cheap, no model) so a renamed
field in those records breaks here rather than in a notebook.
"""
from __future__ import annotations

from types import SimpleNamespace

import plotly.graph_objects as go
import pytest

torch = pytest.importorskip("torch")

from rookworld_debug import viz  # noqa: E402
from rookworld_debug.viz.adapters import decode_bpe_token  # noqa: E402

G, N, T, K = 2, 4, 5, 2
P0 = "P: 2k4r/ppp1q1p1/nbb1N3/4PP2/3p2P1/PB5P/1PPK3R/3RQ3 b - - 3 26"
P1 = "A: rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBQKBNR b KQkq - 0 1+a7a5+b2b3 a7a5+"


@pytest.fixture(scope="module")
def trace():
    from rookworld_debug.grpo.phases.advantages import compute_advantages
    from rookworld_debug.grpo.objective.loss import compute_loss
    from rookworld_debug.grpo.objective.params import LossBatch, Objective

    g = torch.Generator().manual_seed(0)
    lengths = [5, 4, 5, 3]
    mask = torch.tensor([[1 if t < n else 0 for t in range(T)] for n in lengths])           # (N, T)
    logps = -torch.rand(N, T, generator=g) * 3 * mask                                       # (N, T)
    ref = logps + 0.05 * torch.randn(N, T, generator=g) * mask                              # (N, T)
    completion_tokens = (("Ġ", "Ġ", "ĠM", ":", "<|endoftext|>"), ("ĠM", ":", "Ġc", "<|endoftext|>"),
                         ("rn", "bq", "+", "0", "<|endoftext|>"), ("rn", "Ċ", "ĉ"))
    rollout = SimpleNamespace(
        prompts=(P0, P0, P1, P1), tasks=("P", "P", "A", "A"),
        completions=("  M:", "M: c", "rnbq+0", "rn\n\t"), completion_tokens=completion_tokens,
        completion_ids=torch.arange(N * T).view(N, T), completion_mask=mask, per_token_logps=logps,
        ref_per_token_logps=ref, per_token_entropy=torch.rand(N, T, generator=g) * mask,
        per_token_full_kl=torch.rand(N, T, generator=g) * 0.01 * mask,
        topk_ids=torch.zeros(N, T, K, dtype=torch.long), topk_logps=-torch.rand(N, T, K, generator=g),
        topk_tokens=tuple(tuple((" M", " e2") for _ in row) for row in completion_tokens),
        is_truncated=torch.tensor([False, False, False, True]), temperatures=torch.tensor([0.5, 0.5, 0.95, 0.95]),
        num_generations=G, logp_diff_flagged=False, max_abs_logp_diff=1e-6, warnings=())
    rewards = torch.tensor([0.25, 0.25, 1.0, -0.3])
    adv = compute_advantages(rewards, G)
    old = logps - 0.3 * (torch.arange(T) == 1).float()         # ratio ≠ 1 at t = 1 so something clips
    loss = compute_loss(logps, old, ref, adv.advantages, mask.float(),
                        Objective(beta=0.1, epsilon_low=0.2, epsilon_high=0.2, loss_type="grpo", max_completion_length=T),
                        LossBatch(num_generations=G))
    rw = SimpleNamespace(rewards=rewards, rewards_per_func=rewards[:, None], func_names=("rookworld",), weights=(1.0,),
                         breakdowns=tuple(SimpleNamespace(total=float(r), components={"best_move": float(r), "format": 1.0},
                                                          weights={"best_move": 0.5, "format": 0.5}, flags=(), details={})
                                          for r in rewards),
                         components={"best_move": [0.25, 0.25, 1.0, -0.3], "format": [1.0, 1.0, 1.0, 1.0]},
                         flags=((), ("illegal_move",), (), ()))
    update = SimpleNamespace(per_layer={"wte": {"pg": 0.5, "kl": 0.1, "entropy": 0.0, "total": 0.55},
                                        "h.0": {"pg": 0.2, "kl": 0.05, "entropy": 0.0, "total": 0.22}},
                             grad_norm_pre_clip=0.6, grad_norm_post_clip=0.6, loss=0.1)
    greedy = lambda r: SimpleNamespace(prompts=(P0, P1), completions=("M: a", "rn"), rewards=torch.tensor(r))  # noqa: E731
    evaluation = SimpleNamespace(batch_before=greedy([0.1, 0.2]), batch_after=greedy([0.3, 0.2]), heldout_before=None,
                                 heldout_after=None, delta_logp=0.01 * torch.randn(N, T, generator=g) * mask,
                                 corr_adv_delta_logp=0.42)
    inv = SimpleNamespace(max_abs_logp_diff=0.0, max_k3_kl=0.0, max_ratio_dev=0.0, dropout_active=(),
                          policy_training_mode=False, n_tokens=40, ok=True, failures=())
    setup = SimpleNamespace(invariants=inv, provenance={"model": "tiny", "torch": "2.13.0"},
                            config=SimpleNamespace(max_grad_norm=1.0, to_dict=lambda: {"beta": 0.1, "G": G}))
    return SimpleNamespace(setup=setup, rollout=rollout, rewards=rw, advantages=adv, loss=loss, update=update,
                           evaluation=evaluation, config=setup.config)


def test_decode_bpe_token():
    assert decode_bpe_token("ĠM") == " M" and decode_bpe_token("Ċ") == "\n" and decode_bpe_token("ĉ") == "\t"
    # recorded strings are byte-level: 'Ã©' is the two bytes of 'é'; a lone 'é' is byte 0xE9, half a character
    assert decode_bpe_token(" M") == " M" and decode_bpe_token("Ã©") == "é" and decode_bpe_token("é") == "\ufffd"
    assert decode_bpe_token("<|endoftext|>") == "<|endoftext|>"


@pytest.mark.parametrize("metric", ["logp", "ref_logp", "entropy", "full_kl", "kl", "ratio", "pg", "loss",
                                    "delta_logp", "adv_x_logp"])
def test_token_strips_from_trace_every_metric(trace, metric):
    s = viz.token_strips_from_trace(trace, metric)
    assert s.n_rows == N and s.n_tokens == sum(len(r) for r in trace.rollout.completion_tokens)
    assert s.html.count('data-t="') == s.n_tokens
    assert "⟂ EOS" in s.html and "␣M" in s.html and "⏎" in s.html and "⇥" in s.html
    assert "Sampling temperature T = 0.5, 0.95" in s.html
    assert "reward 0.25" in s.html and "truncated (no EOS)" in s.html
    assert "top-k alternatives" in s.html


def test_ratio_strip_outlines_the_clipped_tokens(trace):
    s = viz.token_strips_from_trace(trace, "ratio")
    n_clipped = int((trace.loss.is_clipped_low | trace.loss.is_clipped_high).sum())
    assert n_clipped > 0
    assert s.html.count("rw-out") == n_clipped


def test_missing_record_is_a_clear_error(trace):
    with pytest.raises(ValueError, match="loss.per_token_kl"):
        viz.rollout_token_strips(trace.rollout, "kl")
    with pytest.raises(ValueError, match="unknown metric"):
        viz.rollout_token_strips(trace.rollout, "nope")


def test_tables_from_trace_render(trace):
    html = viz.advantage_table_from_trace(trace).to_html()
    assert "ZERO-STD" in html and trace.advantages.normalization in html and "illegal_move" in html
    assert "best_move (w=0.5)" in html
    assert "illegal_move" in viz.reward_components_table_from_trace(trace).to_html()
    assert "Same batch" in viz.before_after_table_from_trace(trace).to_html()
    inv = viz.invariants_table_from_trace(trace).to_html()
    assert inv.count("✓ PASS") == 4 and "40 tokens" in inv
    prov = viz.provenance_table_from_trace(trace).to_html()
    assert "config.beta" in prov and "tiny" in prov


def test_figures_from_trace(trace):
    figs = [viz.reward_breakdown_from_trace(trace), viz.loss_waterfall_from_trace(trace),
            viz.token_heatmap_from_trace(trace, "kl"), viz.token_heatmap_from_trace(trace, "ratio"),
            viz.per_sequence_kl_from_trace(trace), viz.grad_norms_from_trace(trace),
            viz.before_after_figure_from_trace(trace), viz.delta_logp_scatter_from_trace(trace)]
    assert all(type(f) is go.Figure for f in figs)
    wf = figs[1]
    from rookworld_debug.metrics import term_balance
    bal = term_balance(trace.loss, trace.update)        # the headline replaces a KL-share-in-the-title
    title = wf.layout.title.text
    assert "recorded total ≠" not in title and bal.headline.split(":")[0] in title
    assert (f"{bal.kl_value_share:.0%}" in title) == bal.value_share_meaningful
    assert "max_grad_norm = 1" in figs[5].layout.title.text
    assert "r = +0.420" in figs[7].layout.title.text
    with pytest.raises(ValueError, match="held"):
        viz.before_after_figure_from_trace(trace, "heldout")


def test_board_and_banner_from_trace(trace):
    assert viz.board_from_trace(trace, 0).error is None
    assert viz.board_from_trace(trace, 2).html          # A: with a garbage completion: no raise
    flags = viz.flags_from_trace(trace)
    codes = {f.code for f in flags}
    assert "zero_std" in codes and "truncated" in codes and "reward:illegal_move" in codes
    assert "rw-warning" in viz.banner_from_trace(trace).html


def test_completion_metric_stack_from_trace(trace):
    view = viz.completion_metrics_from_trace(trace, row=2)
    n = len(trace.rollout.completion_tokens[2])
    assert view.html.count('data-t="') == 7 * n           # 7 metrics, all present in this trace
    assert "advantage +0.707" in view.html
    partial = SimpleNamespace(rollout=trace.rollout)       # rollout only: strips of the other phases are skipped
    assert viz.completion_metrics_from_trace(partial, row=0).html.count('data-t="') == 3 * 5


def test_trace_flags_are_merged_without_repeats(trace):
    t = SimpleNamespace(**{**vars(trace), "update": None, "evaluation": None,
                           "flags": ("1 of 2 groups have zero reward std (groups [0]): …",
                                     "update refused: NaN in loss", "loss: 1 empty completion")})
    flags = viz.flags_from_trace(t)
    codes = [f.code for f in flags]
    assert codes.count("zero_std") == 1 and "update_refused" in codes and "no_update" not in codes
    assert any(f.message == "loss: 1 empty completion" for f in flags)
    html = viz.banner_from_trace(t).html
    assert "rw-error" in html and "update refused: NaN in loss" in html


def test_kl_views_name_the_estimator_of_the_record(trace):
    from dataclasses import replace
    k1 = SimpleNamespace(**{**vars(trace), "loss": replace(trace.loss, kl_estimator="k1", use_bias_correction_kl=False)})
    html = viz.token_strips_from_trace(k1, "kl").html
    assert "per-token KL (k1)" in html and "k1 = logp − ref" in html and "k3 =" not in html
    assert "per-token KL (k1)" in viz.token_heatmap_from_trace(k1, "kl").layout.title.text
    assert "(k1)" in viz.per_sequence_kl_from_trace(k1).layout.title.text
    assert "Loss as recorded:" in viz.token_strips_from_trace(trace, "pg").html
    assert "Loss: " in viz.loss_waterfall_from_trace(trace).layout.title.text     # the record's own formula


def test_scatter_labels_a_view_computed_r_as_such(trace):
    t = SimpleNamespace(**{**vars(trace), "evaluation": SimpleNamespace(**{**vars(trace.evaluation),
                                                                          "corr_adv_delta_logp": float("nan")})})
    title = viz.delta_logp_scatter_from_trace(t).layout.title.text
    assert "Evaluation.corr_adv_delta_logp" not in title and "computed for display" in title


def test_one_colour_language_blue_is_more_likely_or_lower_loss(trace):
    """Blue = the step makes this token more likely / lowers the loss, in every signed strip: a NEGATIVE
    per-token PG loss is blue (it lowers the loss), a POSITIVE A·logp or Δlogp is blue; the legend says so."""
    from rookworld_debug.viz._style import NEG_RGB, POS_RGB, diverging_rgb
    from rookworld_debug.viz.tokens import METRICS, make_scale
    pg = make_scale(METRICS["pg"], [-1.0, 1.0])
    assert pg.rgb(-1.0) == diverging_rgb(1.0) == POS_RGB and pg.rgb(1.0) == NEG_RGB
    for key in ("adv_x_logp", "delta_logp", "log_ratio"):
        assert make_scale(METRICS[key], [-1.0, 1.0]).rgb(1.0) == POS_RGB, key
    html = viz.token_strips_from_trace(trace, "pg").html
    assert "blue = negative: lowers the loss, the step makes this token more likely · orange = raises it" in html
    assert "blue = A &gt; 0: the step makes this token more likely" in viz.token_strips_from_trace(trace, "adv_x_logp").html


def test_signed_strips_scale_over_the_batch_or_absolute(trace):
    """Showing a few rows must not re-fit the colour scale to them: default = the whole batch's range;
    'rows' fits the shown rows; a number pins an absolute ±scale (strip and advantage chips)."""
    import re as _re

    import numpy as np
    from rookworld_debug.viz._style import diverging_rgb, hex_rgb
    pg = trace.loss.per_token_pg.numpy()
    m = trace.rollout.completion_mask.numpy().astype(bool)
    batch_half, row_half = float(np.abs(pg[m]).max()), float(np.abs(pg[2][m[2]]).max())
    assert row_half < batch_half                               # the premise: row 2 alone would saturate
    scale_of = lambda html: float(_re.search(r"Colour scale ±([0-9.e+-]+):", html).group(1))  # noqa: E731
    one = viz.token_strips_from_trace(trace, "pg", rows=[2]).html
    assert scale_of(one) == pytest.approx(batch_half, rel=1e-3) and "over all 4 rows" in one
    fitted = viz.token_strips_from_trace(trace, "pg", rows=[2], scale="rows").html
    assert "Colour scale ±" not in fitted
    fixed = viz.token_strips_from_trace(trace, "pg", rows=[2], scale=5.0).html
    assert scale_of(fixed) == 5.0 and "absolute scale" in fixed
    a = float(trace.advantages.advantages[2])
    assert hex_rgb(diverging_rgb(a / 5.0)) in fixed            # the advantage chip on the same absolute scale
    with pytest.raises(ValueError, match="scale must be"):
        viz.token_strips_from_trace(trace, "pg", scale="per-row")
