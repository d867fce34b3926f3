"""Token-strip views: HTML snapshots plus structural checks. Fast, no model.

Regenerate snapshots after an intended rendering change:  UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/test_viz.py
"""
from __future__ import annotations

import math
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from rookworld_debug.viz import tokens as vt
from rookworld_debug.viz.tokens import METRICS, token_metric_stack, token_strip, token_strips

SNAPSHOTS = Path(__file__).parent / "snapshots"


def assert_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"missing snapshot {path}; create it with UPDATE_SNAPSHOTS=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} differs from its snapshot; if intended, rerun with UPDATE_SNAPSHOTS=1"


class _Spans(HTMLParser):
    """Collects every token span (data-t) with its attributes and inner text; checks tag balance."""

    VOID = {"br", "meta", "img", "input", "hr"}

    def __init__(self):
        super().__init__()
        self.tokens: list[dict] = []
        self.stack: list[tuple[str, dict | None]] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        a = dict(attrs)
        rec = None
        if "data-t" in a:
            rec = {"attrs": a, "text": ""}
            self.tokens.append(rec)
        self.stack.append((tag, rec))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.stack, f"unbalanced </{tag}>"
        open_tag, _ = self.stack.pop()
        assert open_tag == tag, f"<{open_tag}> closed by </{tag}>"

    def handle_data(self, data):
        for _, rec in self.stack:
            if rec is not None:
                rec["text"] += data


def parse(html: str) -> list[dict]:
    p = _Spans()
    p.feed(html)
    p.close()
    assert not p.stack, f"unclosed tags: {[t for t, _ in p.stack]}"
    return p.tokens


def bg(tok: dict) -> str:
    m = re.search(r"background:([^;]+)", tok["attrs"]["style"])
    return m.group(1) if m else ""


# A P: completion as the model emits it: pad spaces, " M", ":", moves, tab/newline oddities, EOS, pad.
TOKENS = [" ", " ", " ", " M", ":", " c2", "c4", "\n", "\t", "<|endoftext|>", "<|endoftext|>"]
LOGPS = [-0.01, -0.02, -0.5, -2.5, -12.0, -0.3, -1.0, -0.5, -0.2, -0.05, 0.0]
MASK = [True] * 10 + [False]
TOPK = [[(" ", -0.01), (" M", -4.6)]] * 11


def basic_strip():
    return token_strip(TOKENS, LOGPS, metric="logp", label="prompt 0 · g 1", mask=MASK, topk=TOPK,
                       token_ids=list(range(220, 231)), info={"reward": 0.25, "advantage": -0.87})


def test_snapshot_single_strip():
    assert_snapshot("token_strip_logp.html", basic_strip().html)


def test_snapshot_stacked_ratio_strips():
    strips = token_strips(
        [TOKENS[:6], [" M", ":", " e2", "e4", "<|endoftext|>"]],
        [[1.0, 1.0, 1.3, 0.7, 1.0, 1.05], [1.0, 0.95, 1.0, 1.25, 1.0]],
        metric="ratio", labels=["p0 g0", "p0 g1"],
        row_info=[{"reward": 1.0, "advantage": 0.7}, {"reward": -0.3, "advantage": -0.7}],
        outlines=[[0, 0, "high", "low", 0, 0], [0, 0, 0, "high", 0]],
        masks=[[1] * 6, [1, 1, 1, 1, 1]], title="importance ratio, rollout batch")
    assert_snapshot("token_strips_ratio.html", strips.html)


def test_one_span_per_token_and_tags_balanced():
    spans = parse(basic_strip().html)
    assert len(spans) == len(TOKENS)
    assert [int(s["attrs"]["data-t"]) for s in spans] == list(range(len(TOKENS)))


def test_whitespace_and_eos_are_visible():
    spans = parse(basic_strip().html)
    texts = [s["text"] for s in spans]
    assert texts[0] == "␣" and texts[3] == "␣M"
    assert texts[7] == "⏎" and texts[8] == "⇥"
    assert texts[9] == "⟂ EOS"
    # no raw whitespace inside any token's visible text: every pad space is a glyph
    assert not any(ch in t for t in texts[:9] for ch in " \n\t")


def test_control_characters_are_visible():
    spans = parse(token_strip(["\x00", "\r", "a\u00a0b", ""], [0.1, 0.2, 0.3, 0.4], metric="kl").html)
    assert [s["text"] for s in spans] == ["␀", "␍", "a⍽b", "∅"]


@pytest.mark.parametrize("metric,neutral_value", [
    ("delta_logp", 0.0), ("adv_x_logp", 0.0), ("pg", 0.0), ("ratio", 1.0), ("kl", 0.0),
    ("entropy", 0.0), ("logp", 0.0)])
def test_neutral_value_is_white(metric, neutral_value):
    vals = [neutral_value, 0.5, -0.5] if METRICS[metric].scale == "signed" else \
        [neutral_value, 1.4, 0.6] if metric == "ratio" else \
        [neutral_value, -3.0, -1.0] if metric == "logp" else [neutral_value, 2.0, 1.0]
    spans = parse(token_strip(["a", "b", "c"], vals, metric=metric).html)
    assert bg(spans[0]) == "#ffffff"
    assert bg(spans[1]) != "#ffffff"


def test_signed_scale_is_symmetric_and_diverging():
    spans = parse(token_strip(["a", "b", "c"], [0.4, -0.4, 0.0], metric="delta_logp").html)
    pos, neg = bg(spans[0]), bg(spans[1])
    assert pos == "#2166ac" and neg == "#e66101"   # full-scale ends: blue > 0, orange < 0


def test_ratio_is_coloured_on_log_scale():
    # r = 2 and r = 1/2 are equally far from 1 in log space: equal intensity, opposite hues
    spans = parse(token_strip(["a", "b"], [2.0, 0.5], metric="ratio").html)
    assert bg(spans[0]) == "#2166ac" and bg(spans[1]) == "#e66101"


def test_outlines_exactly_where_clipped():
    outline = [False, True, False, "low", False]
    spans = parse(token_strip(list("abcde"), [1.0, 1.3, 1.0, 0.7, 1.0], metric="ratio", outline=outline).html)
    outlined = [i for i, s in enumerate(spans) if "outline:" in s["attrs"]["style"]]
    assert outlined == [1, 3]
    assert "clipped by the loss: low" in spans[3]["attrs"]["title"]


def test_masked_tokens_grey_and_do_not_stretch_the_scale():
    a = parse(token_strip(list("abc"), [0.1, 0.2, 0.0], metric="kl").html)
    b = parse(token_strip(list("abcd"), [0.1, 0.2, 0.0, 50.0], metric="kl", mask=[1, 1, 1, 0]).html)
    assert [bg(s) for s in a] == [bg(s) for s in b[:3]]
    assert "rw-masked" in b[3]["attrs"]["class"] and "#e6e6e6" in bg(b[3])
    assert "not in the loss" in b[3]["attrs"]["title"]


def test_hover_has_exact_values_of_all_metrics_and_topk():
    hover = [{"ref_logp": -0.123456789, "entropy": 1.5}] * 2
    s = token_strip([" e2", "e4"], [-0.25, -1.0], metric="logp", hover=hover,
                    topk=[[(" e2", -0.25), (" d2", -1.75)], [("e4", -1.0)]], token_ids=[304, 19])
    spans = parse(s.html)
    title = spans[0]["attrs"]["title"]
    assert "policy logp = -0.25" in title and "ref_logp = -0.123457" in title and "entropy = 1.5" in title
    assert "(id 304)" in title
    assert "1. '␣e2'  -0.25  ← sampled" in title and "2. '␣d2'  -1.75" in title


def test_nan_is_flagged_not_fatal():
    spans = parse(token_strip(list("ab"), [float("nan"), 0.5], metric="kl").html)
    assert "repeating-linear-gradient" in bg(spans[0])
    assert "nan" in spans[0]["attrs"]["title"]


def test_legend_carries_definition_and_range():
    html = token_strip(["a"], [0.5], metric="kl").html
    assert "exp(ref − logp) − (ref − logp) − 1" in html
    assert "rw-bar" in html and "per-token KL (k3)" in html


def test_self_contained():
    html = basic_strip().html
    assert "<script" not in html and "http" not in html and "<link" not in html


def test_length_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="values has 2 entries but there are 3 tokens"):
        token_strip(list("abc"), [1.0, 2.0], metric="kl")
    with pytest.raises(ValueError, match="mask"):
        token_strip(list("abc"), [1.0, 2.0, 3.0], metric="kl", mask=[1, 1])


def test_stacked_rows_share_one_scale_and_cut_padding():
    # (N, T) arrays padded to T=4: each row is cut to its own token count
    vals = np.array([[0.0, 1.0, 0.0, 9.0], [2.0, 0.0, 0.0, 0.0]])
    s = token_strips([["a", "b"], ["c"]], vals, metric="kl")
    spans = parse(s.html)
    assert len(spans) == 3 and s.n_rows == 2
    assert bg(spans[2]) == "#54278f"       # 2.0 is the shared max → full colour
    assert bg(spans[1]) != "#54278f"       # 1.0 is half way on the shared scale


def test_unknown_metric_infers_signedness():
    s = token_strip(list("ab"), [-1.0, 1.0], metric="my_score")
    spans = parse(s.html)
    assert bg(spans[0]) == "#e66101" and bg(spans[1]) == "#2166ac"
    assert "my_score (user-supplied per-token values)" in s.html


def test_vmin_vmax_pin_the_range():
    spans = parse(token_strip(list("ab"), [0.5, 0.25], metric="kl", vmax=0.5).html)
    assert bg(spans[0]) == "#54278f"


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    s = token_strip(["a", "b"], torch.tensor([0.0, -1.0], dtype=torch.bfloat16), metric="logp",
                    mask=torch.tensor([1, 0]).tolist())
    assert s.n_tokens == 2


def test_metric_stack_rows_and_shared_hover():
    view = token_metric_stack([" M", ":"], {"logp": [-0.1, -2.0], "kl": [0.0, 0.3], "ratio": [1.0, 1.3]},
                              outline=[False, True], label="p0 g0")
    spans = parse(view.html)
    assert len(spans) == 6
    assert all("kl = " in s["attrs"]["title"] for s in spans[:2])
    outlined = [i for i, s in enumerate(spans) if "outline:" in s["attrs"]["style"]]
    assert outlined == [5]      # only on the ratio row


def test_metric_presets_have_definitions():
    for key in ("logp", "ref_logp", "ratio", "kl", "entropy", "delta_logp", "adv_x_logp"):
        m = METRICS[key]
        assert m.definition and m.scale in ("signed", "ratio", "sequential")
    assert "logits / T" in METRICS["kl"].definition and "sampled" in METRICS["kl"].definition


def test_repr_and_save(tmp_path):
    s = basic_strip()
    assert s._repr_html_() == s.html and "TokenStrip(metric='logp'" in repr(s)
    page = s.save(tmp_path / "strip.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in page


def test_contrast_text_colour():
    assert vt.text_on((84, 39, 143)) == "#ffffff" and vt.text_on((255, 255, 255)) == "#000000"
    # logp scales fit the batch (1st percentile), not a fixed −10 that a 50k vocab (≈ −10.8) would saturate
    sc = vt.make_scale(METRICS["logp"], np.array([-30.0, -1.0]), vocab_size=50257)
    assert math.isclose(sc.lo, np.percentile([-30.0, -1.0], 1)) and sc.hi == 0.0
    assert "1st percentile" in sc.basis and "−ln V = -10.82" in sc.basis
    vals = np.linspace(-11.4, -10.3, 40)
    cols = {vt.make_scale(METRICS["logp"], vals).rgb(v) for v in vals}
    assert len(cols) > 5                                  # distinct shades, not one clipped colour
    ent = vt.make_scale(METRICS["entropy"], np.full(8, 10.8), vocab_size=50257)
    assert ent.lo == 0.0 and math.isclose(ent.hi, 10.8) and "ln V = 10.82 (the maximum)" in ent.basis


def test_degenerate_scale_says_so():
    assert "every ratio is 1" in token_strip(list("ab"), [1.0, 1.0], metric="ratio").html
    assert "every value is 0" in token_strip(list("ab"), [0.0, 0.0], metric="delta_logp").html
