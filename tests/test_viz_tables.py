"""pandas Stylers: render to HTML without jinja errors, carry definitions, flag zero-std groups."""
from __future__ import annotations

import math
import re

import pytest

from rookworld_debug.viz.tables import (advantage_table, before_after_table, invariants_table, metrics_table,
                                        provenance_table, reward_components_table)

P0 = "P: 2k4r/ppp1q1p1/nbb1N3/4PP2/3p2P1/PB5P/1PPK3R/3RQ3 b - - 3 26"
P1 = "A: rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBQKBNR b KQkq - 0 1+a7a5+b2b3 a7a5+"
PAD = " " * 34
COMPLETIONS = [PAD + "M: a6c5 c6d7 c8b8 h8e8 d4d3      E: -3.37 -3.37 -3.37 -3.37 -3.37           B: c6d7"] * 3 + \
              [PAD + "M: a6c5      B: zz"] + ["rnbqkbnr/1ppppppp/8/p7/8/1P6/P1PPPPPP/RNBQKBNR w KQkq - 0 2+0.001+0+0"] * 4
REWARDS = [0.25, 0.25, 0.25, 0.25, 1.0, -0.3, 0.5, 0.2]
# advantages as an Advantages record would hold them (group 0: zero std → 0)
ADV = [0.0, 0.0, 0.0, 0.0, 1.193, -1.193, 0.2753, -0.2753]
PROMPTS = [P0] * 4 + [P1] * 4


def adv_table(**kw):
    args = dict(num_generations=4, group_mean=[0.25, 0.35], group_std=[0.0, 0.5447],
                normalization="A=(r-mean_g)/(std_g(ddof=1)+0.0001), scale_rewards=group, NaN→0",
                components=[{"best_move": 1.0, "candidates": 0.6}] * 8, weights={"best_move": 0.5, "candidates": 0.3},
                zero_std_groups=(0,))
    args.update(kw)
    return advantage_table(PROMPTS, COMPLETIONS, REWARDS, ADV, **args)


def test_advantage_table_renders_blocks_with_stats_and_normalization():
    html = adv_table().to_html()
    assert "A=(r-mean_g)/(std_g(ddof=1)+0.0001)" in html              # normalization in the caption
    assert "B=2 prompts × G=4 generations" in html
    assert "μ=0.35" in html and "σ=0.5447" in html                    # group stats in the block label
    assert 'rowspan="4"' in html                                      # one block per prompt
    assert "best_move (w=0.5)" in html and "+1.193" not in html        # weights in header; plain numbers
    assert html.count("<tr>") >= 8 + 1


def test_zero_std_group_is_flagged_with_reason():
    html = adv_table().to_html()
    assert "⚠ ZERO-STD" in html
    assert "all 4 rewards = 0.25 → A = 0, no PG signal from this group" in html
    assert "Zero-std groups: [0] of 2." in html
    assert "#fff3cd" in html                                          # amber background on the block
    # the other group carries no badge
    body = html[html.index("<tbody>"):]
    assert body.count("⚠ ZERO-STD") == 1


def test_advantage_colours_diverge_and_zero_is_white():
    html = adv_table().to_html()
    # the positive / negative extremes get blue / orange backgrounds (capped intensity); 0 is white
    styles = dict(re.findall(r"#(T_\w+_row\d+_col\d+)[^{]*\{([^}]*)\}", html))
    assert any("background-color: #ffffff" in v or "background-color:#ffffff" in v for v in styles.values())
    from rookworld_debug.viz._style import diverging_rgb, hex_rgb
    assert hex_rgb(diverging_rgb(0.7)) in html and hex_rgb(diverging_rgb(-0.7)) in html   # ±max at capped intensity


def test_advantage_table_accepts_B_prompts_tensors_and_row_flags():
    torch = pytest.importorskip("torch")
    st = adv_table(group_mean=torch.tensor([0.25, 0.35]), group_std=torch.tensor([0.0, 0.5447]),
                   row_flags=["", "truncated (no EOS)"] + [""] * 6)
    html = advantage_table([P0, P1], COMPLETIONS, torch.tensor(REWARDS), torch.tensor(ADV), num_generations=4,
                           group_mean=[0.25, 0.35], group_std=[0.0, 0.5447], normalization="n").to_html()
    assert "truncated (no EOS)" in st.to_html()
    assert "ZERO-STD" in html      # without a record list, isclose(σ, 0) is used as a fallback


def test_advantage_table_visible_whitespace_and_truncation():
    html = adv_table(max_chars=30).to_html()
    assert "␣×34M:" in html and "…" in html
    assert PAD + "M:" not in html


def test_advantage_table_shape_errors():
    with pytest.raises(ValueError, match="whole number of groups"):
        advantage_table(PROMPTS[:3], COMPLETIONS[:3], REWARDS[:3], ADV[:3], num_generations=2, group_mean=[0],
                        group_std=[0], normalization="n")
    with pytest.raises(ValueError, match="advantages has 7 entries"):
        adv_table().__class__  # noqa: B018 (sanity)
        advantage_table(PROMPTS, COMPLETIONS, REWARDS, ADV[:7], num_generations=4, group_mean=[0, 0],
                        group_std=[1, 1], normalization="n")


def test_two_tables_never_share_css_ids():
    a = adv_table().to_html()
    b = adv_table(normalization="other").to_html()
    ida = set(re.findall(r'id="(T_[0-9a-f]+)"', a))
    idb = set(re.findall(r'id="(T_[0-9a-f]+)"', b))
    assert ida and idb and not (ida & idb)
    assert adv_table().to_html() == a                                # deterministic


def test_reward_components_table():
    html = reward_components_table(COMPLETIONS, {"best_move": [1, 0, 0, 1, 0, 0, 0, 0], "format": [1] * 8},
                                   totals=REWARDS, weights={"best_move": 0.5}, flags=[("illegal_move",)] + [()] * 7,
                                   definitions={"best_move": "1 if B: equals Stockfish #1"}).to_html()
    assert "best_move (w=0.5)" in html and "illegal_move" in html
    assert "RewardBreakdown.total" in html and "1 if B: equals Stockfish #1" in html


def test_before_after_table_labels_same_batch():
    st = before_after_table(["P: a", "P: b"], [0.2, 0.5], [0.3, 0.1], before_text=["x  y", "z"], after_text=["u", "v"])
    html = st.to_html()
    assert "Same batch" in html and "Δ = reward after − reward before" in html
    assert "+0.1" in html and "-0.4" in html and "0.200000" not in html
    assert "x␣␣y" in html


def test_invariants_table_pass_fail_spelled_and_coloured():
    html = invariants_table({"logps equal": {"passed": True, "value": 0.0, "expected": 0},
                             "KL == 0": True, "dropout off": False}).to_html()
    assert html.count("✓ PASS") == 2 and html.count("✗ FAIL") == 1
    assert "#d9f0d3" in html and "#fddbc7" in html
    assert "2/3 pass" in html


def test_invariants_table_accepts_objects():
    from types import SimpleNamespace
    html = invariants_table([SimpleNamespace(name="ratio == 1", passed=True, value=0.0)]).to_html()
    assert "ratio == 1" in html and "✓ PASS" in html


def test_provenance_and_metrics_tables():
    html = provenance_table({"git_sha": "abc123", "versions": {"torch": "2.13.0"}, "beta": 0.1}).to_html()
    assert "versions.torch" in html and "2.13.0" in html
    html = metrics_table({"kl": 1e-5, "clip_ratio/low_mean": 0.0}, definitions={"kl": "mean k3"}).to_html()
    assert "clip_ratio/low_mean" in html and "mean k3" in html and "1.000e-05" in html


def test_html_escaping_of_untrusted_text():
    html = advantage_table(["P: <b>x</b>"] * 2, ["<script>alert(1)</script>", "ok"], [0.0, 1.0], [0.0, 0.0],
                           num_generations=2, group_mean=[0.5], group_std=[math.sqrt(0.5)], normalization="n").to_html()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>x</b>" not in html


def test_not_applicable_components_are_dashes_not_nan():
    html = reward_components_table(["P", "A"], {"best_move": [1.0, float("nan")], "fen_match": [float("nan"), 1.0]},
                                   totals=[1.0, 1.0]).to_html()
    assert ">—<" in html and ">nan<" not in html and "repeating-linear-gradient" not in html
    html = reward_components_table(["P"], {"best_move": [1.0]}, totals=[float("nan")]).to_html()
    assert ">nan<" in html and "repeating-linear-gradient" in html      # a NaN total is a real problem


def test_metrics_table_labels_every_number_with_its_batch():
    from rookworld_debug.viz import metrics_table
    html = metrics_table({"reward_before": 0.1, "heldout_reward_after": 0.2, "loss": 0.3, "format_valid": 0.5,
                          "grad_norm_pre_clip": 1.0}).to_html()
    for label in ("greedy · this batch · before", "greedy · held-out · after", "update (sampled rollout)"):
        assert label in html, label
    assert html.count("sampled rollout · this batch") == 2          # loss and format_valid: the rollout
