"""The real model's path in CI: a small random GPT2LMHeadModel with the EXACT GPT-2 BPE tokenizer (50257 ids)
through run_step, the step log, the token views, and `rookworld-debug report` (notebook 01 under papermill →
HTML report), as a user runs them. Random weights: every number is noise, so we assert the plumbing and the
rendering (each token drawn from its bytes), never the model's quality."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rookworld_debug import StepConfig, run_step
from rookworld_debug.models.tokenizer import GPT2_TOKENIZER_SHA256, gpt2_tokenizer
from rookworld_debug.steplog import format_step_log
from rookworld_debug.viz import banner_from_trace, completion_metrics_from_trace, token_strips_from_trace
from rookworld_debug.viz.tokens import token_text_from_raw
from tinymodels import bpe_model_dir

ROOT = Path(__file__).resolve().parents[1]
# text with whole multi-byte characters (é, Cyrillic) and a 4-byte emoji that GPT-2 splits into byte tokens
INJECTED = " M: é2 дом 😀 ­x"


class _Spans(HTMLParser):
    """(text, title) of every token span (data-t) of a strip."""

    def __init__(self):
        super().__init__()
        self.spans, self._depth, self._cur = [], 0, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "data-t" in a and self._cur is None:
            self._cur, self._depth = [a.get("title", ""), ""], 1
        elif self._cur is not None and tag == "span":
            self._depth += 1

    def handle_endtag(self, tag):
        if self._cur is not None and tag == "span":
            self._depth -= 1
            if self._depth == 0:
                self.spans.append((self._cur[1], self._cur[0]))
                self._cur = None

    def handle_data(self, data):
        if self._cur is not None:
            self._cur[1] += data


def _spans(html: str) -> list[tuple[str, str]]:
    p = _Spans()
    p.feed(html)
    return p.spans


@pytest.fixture(scope="module")
def bpe_dir() -> Path:
    return bpe_model_dir()


@pytest.fixture(scope="module")
def no_tokenizer_dir(bpe_dir, tmp_path_factory) -> Path:
    """The same weights WITHOUT tokenizer files: the loader falls back to the stock GPT-2 tokenizer."""
    d = tmp_path_factory.mktemp("bpe_no_tok")
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        if (bpe_dir / f).is_file():
            shutil.copy(bpe_dir / f, d / f)
    return d


@pytest.fixture(scope="module")
def trace(no_tokenizer_dir):
    cfg = StepConfig(model=str(no_tokenizer_dir), task="P", batch_size=2, num_generations=2, max_new_tokens=12,
                     eval_max_new_tokens=8, heldout_n=1, engine_depth=4, seed=1)
    return run_step(cfg, inject={0: INJECTED})


def test_step_runs_on_gpt2_bpe_and_records_byte_level_tokens(trace):
    tok = gpt2_tokenizer()
    ro = trace.rollout
    assert len(tok) == 50257 and trace.setup.provenance["embedding_rows"] == 50257
    for i, row in enumerate(ro.completion_tokens):
        n = int(ro.completion_mask[i].sum())
        assert list(row) == tok.convert_ids_to_tokens(ro.completion_ids[i, :n].tolist())
    assert tok.decode(ro.completion_ids[0, :int(ro.completion_mask[0].sum())]).startswith(INJECTED)


def test_strips_render_every_bpe_token_from_its_bytes(trace):
    ro = trace.rollout
    html = token_strips_from_trace(trace, "logp").html
    spans = _spans(html)
    want = [token_text_from_raw(t) for row in ro.completion_tokens for t in row]
    assert len(spans) == len(want)
    for (text, title), tt in zip(spans, want):
        assert text == ("⟂ EOS" if tt.special else tt.label), (text, tt)
        assert tt.label in title
    shown = "".join(s for s, _ in spans)
    assert not re.search("[ĠĊĉ]", shown) and "Ã" not in shown and "Ð" not in shown       # no byte-level mojibake
    # the injected row: whole characters as themselves, the emoji's 4 bytes as explicit incomplete bytes
    row0 = "".join(token_text_from_raw(t).label for t in ro.completion_tokens[0])
    # GPT-2 splits 'дом' as D0 B4 | о | D0 BC: the split letters' bytes are shown, the whole one as itself
    assert "␣é2␣⟨D0⟩⟨B4⟩о⟨D0⟩⟨BC⟩␣⟨F0⟩⟨9F⟩⟨98⟩⟨80⟩␣⟨SHY⟩x<|endoftext|>" in row0, row0
    titles = [title for _, title in spans[:len(ro.completion_tokens[0])]]
    assert any("incomplete UTF-8" in t and "F0 9F" in t for t in titles)
    assert sum("bytes spell 'д' U+0434 CYRILLIC SMALL LETTER DE" in t for t in titles) == 2   # both halves say so
    assert any("spell '😀' U+1F600" in t for t in titles)
    # the legend fits a 50k vocab: range from the batch, ln V quoted
    assert "percentile" in html and "−ln V = -10.82" in html
    stack = completion_metrics_from_trace(trace, row=0).html
    assert "⟨F0⟩" in stack and "ln V = 10.82 (the maximum)" in stack


def test_provenance_identifies_the_tokenizer_and_the_fallback(trace, no_tokenizer_dir):
    p = trace.setup.provenance
    assert p["tokenizer_sha256"] == GPT2_TOKENIZER_SHA256 and p["tokenizer_is_stock_gpt2"] is True
    assert p["tokenizer_class"].startswith("GPT2Tokenizer") and "vocab.json" in p["tokenizer_source"]
    assert p["is_random_init"] is False                      # factual: nothing says these weights are random
    assert any("no tokenizer in" in n and "stock GPT-2" in n for n in p["notes"])
    log = format_step_log(trace)
    assert "tokenizer: GPT2Tokenizer" in log and "(stock GPT-2 BPE)" in log
    assert f"!! no tokenizer in {no_tokenizer_dir}" in log                  # the fallback is printed, not silent
    # random weights: entropy ≈ ln V → the "looks untrained" flag (log warnings and banner)
    assert any(str(f).startswith("policy looks untrained") for f in trace.flags)
    assert "policy looks untrained" in log
    banner = banner_from_trace(trace).html
    assert "looks untrained" in banner and "no tokenizer in" in banner


def test_own_tokenizer_folder_is_identified(bpe_dir):
    from rookworld_debug.models import load_policy_and_reference
    p = load_policy_and_reference(str(bpe_dir)).provenance
    assert p.notes == () and p.tokenizer_is_stock_gpt2 and p.tokenizer_sha256 == GPT2_TOKENIZER_SHA256
    assert str(bpe_dir) in p.tokenizer_source and "tokenizer.json" in p.tokenizer_source


@pytest.mark.slow                       # notebook 01 under papermill, about 20 s
def test_report_cli_runs_notebook_01_on_the_bpe_model(bpe_dir, tmp_path):
    """`rookworld-debug report` as a user runs it: papermill executes notebook 01 on the BPE model, the
    HTML report is written; its strips show tokens by their bytes, the provenance names the tokenizer."""
    exe = Path(sys.executable).with_name("rookworld-debug")
    cmd = [str(exe), "report", "-p", f"model={bpe_dir}", "-p", "batch_size=2", "-p", "num_generations=2",
           "-p", "max_new_tokens=12", "-p", "eval_max_new_tokens=8", "-p", "heldout_n=1", "-p", "engine_depth=4",
           "--sweep-name", "bpe", "--out", str(tmp_path), "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    reports = list((tmp_path / "bpe").glob("*/report.html"))
    assert len(reports) == 1, r.stdout
    html = reports[0].read_text(encoding="utf-8")
    assert "rw-strips" in html and "looks untrained" in html and GPT2_TOKENIZER_SHA256 in html
    spans = [s for s, _ in _spans(html)]
    assert len(spans) > 20
    shown = "".join(spans)
    assert not re.search("[ĠĊĉ]", shown), "raw byte-level characters in the report's strips"
