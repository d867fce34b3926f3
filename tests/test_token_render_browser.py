"""A token strip with multi-byte GPT-2 tokens, rendered in real Chromium (offline): the browser shows each
token's label (whole characters as themselves, split characters as explicit bytes), the tooltip carries the
bytes and the note, and a screenshot is taken of the strip (reports/token_bytes_strip.png when reports/ exists)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rookworld_debug import viz
from rookworld_debug.models.tokenizer import gpt2_tokenizer

ROOT = Path(__file__).resolve().parents[1]
# whole non-ASCII characters (î, é), Cyrillic that GPT-2 splits into byte tokens, an emoji (4 bytes), a soft hyphen
TEXT = "î x é дом 😀 a\u00adb"   # GPT-2: Ã® Ġx ĠÃ© ĠÐ ´ Ð¾Ð ¼ ĠðŁĺ Ģ Ġa ÂŃ b


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium (scripts/setup.sh --browser installs it)")
    tok = gpt2_tokenizer()
    ids = tok.encode(TEXT)
    raws = tok.convert_ids_to_tokens(ids)
    labels = [viz.token_text_from_raw(r) for r in raws]
    strip = viz.token_strip(labels, [-0.5 - 0.7 * i for i in range(len(ids))], metric="logp", token_ids=ids,
                            vocab_size=len(tok), title="GPT-2 BPE tokens of " + repr(TEXT))
    path = tmp_path_factory.mktemp("tokbrowser") / "strip.html"
    path.write_text(viz.HTMLView(strip.html).page(), encoding="utf-8")
    out = tmp_path_factory.mktemp("shots") / "token_bytes_strip.png"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                          "--disable-background-networking", "--disable-component-update"])
        try:
            pg = browser.new_page(viewport={"width": 900, "height": 300})
            blocked: list[str] = []
            pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
                     else (blocked.append(r.request.url), r.abort()))
            pg.goto(path.as_uri())
            spans = pg.locator(".rw-tok")
            texts = [spans.nth(i).inner_text() for i in range(spans.count())]
            titles = [spans.nth(i).get_attribute("title") for i in range(spans.count())]
            widths = [spans.nth(i).bounding_box()["width"] for i in range(spans.count())]
            png = pg.locator(".rw-strips").screenshot(path=str(out))
            if (ROOT / "reports").is_dir():
                (ROOT / "reports" / "token_bytes_strip.png").write_bytes(png)
        finally:
            browser.close()
    return dict(raws=raws, labels=labels, texts=texts, titles=titles, widths=widths, png=png, blocked=blocked)


@pytest.mark.browser
def test_browser_shows_multibyte_tokens_by_their_bytes(rendered):
    r = rendered
    assert r["blocked"] == []
    assert r["texts"] == [t.label for t in r["labels"]]                 # what Chromium displays, token by token
    assert r["texts"][r["raws"].index("Ã®")] == "î"                    # id 34803: not the mojibake 'Ã®'
    assert r["texts"][r["raws"].index("ĠÃ©")] == "␣é"
    assert r["texts"][r["raws"].index("Ð¾Ð")] == "о⟨D0⟩"                # a whole letter + half of the next
    assert all(w > 4 for w in r["widths"])                             # no empty chip (the soft hyphen was one)
    split = [k for k, t in enumerate(r["labels"]) if not t.complete]
    assert split, "the sample text must contain tokens holding part of a character"
    for k in split:
        assert "⟨" in r["texts"][k] and "incomplete UTF-8" in r["titles"][k] and "these bytes spell" in r["titles"][k]
    assert any("'😀' U+1F600" in r["titles"][k] for k in split)
    assert "⟨SHY⟩" in "".join(r["texts"]) and "SOFT HYPHEN" in "".join(r["titles"])
    assert r["png"][:8] == b"\x89PNG\r\n\x1a\n" and len(r["png"]) > 2000
