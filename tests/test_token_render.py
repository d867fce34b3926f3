"""The one token renderer (viz.tokens.token_text), by bytes, over the WHOLE GPT-2 vocabulary and in the views.

The label of every id must be non-empty and unambiguous: we parse each label back to bytes with an
independent reader of the glyph convention and get the token's exact bytes, for all 50257 ids."""
from __future__ import annotations

import re
import unicodedata

import pytest

from rookworld_debug.models.tokenizer import byte_level_bytes, bytes_to_byte_level, gpt2_tokenizer, token_strings
from rookworld_debug.viz._style import _NAMED
from rookworld_debug.viz.tokens import token_strip, token_text, token_text_from_raw

_INV_WS = {"␣": " ", "⏎": "\n", "⇥": "\t", "␍": "\r", "⍽": "\u00a0", "␡": "\x7f"}
_INV_NAMED = {v: chr(k) for k, v in _NAMED.items()}
_ESCAPE = re.compile(r"⟨([0-9A-F]{2}|U\+[0-9A-F]{4,6}|[A-Z]+)⟩")


def label_to_bytes(label: str) -> bytes:
    """Read a label back: glyphs → whitespace/controls, ⟨XX⟩ → one raw byte, ⟨U+XXXX⟩/⟨NAME⟩ → that character,
    '◌' + combining mark → the mark. Raises on anything the convention does not allow (ambiguity)."""
    out, i = bytearray(), 0
    while i < len(label):
        ch = label[i]
        if ch == "⟨":
            m = _ESCAPE.match(label, i)
            assert m, f"unreadable escape in {label!r} at {i}"
            body = m.group(1)
            if len(body) == 2:
                out.append(int(body, 16))
            elif body.startswith("U+"):
                out += chr(int(body[2:], 16)).encode("utf-8")
            else:
                out += _INV_NAMED[body].encode("utf-8")
            i = m.end()
            continue
        assert ch not in "⟩∅", f"bare glyph {ch!r} in {label!r}"
        if ch == "◌":
            assert unicodedata.category(label[i + 1]) in ("Mn", "Me"), label
            i += 1
            ch = label[i]
        elif ch in _INV_WS:
            ch = _INV_WS[ch]
        elif 0x2400 <= ord(ch) < 0x2420:
            ch = chr(ord(ch) - 0x2400)
        out += ch.encode("utf-8")
        i += 1
    return bytes(out)


@pytest.fixture(scope="module")
def vocab():
    tok = gpt2_tokenizer()
    raw = token_strings(tok, range(len(tok)))
    return tok, raw, {i: token_text_from_raw(r) for i, r in raw.items()}


def test_whole_gpt2_vocab_renders_unambiguously(vocab):
    tok, raw, tts = vocab
    assert len(tts) == 50257
    labels = [tts[i].label for i in range(len(tts))]
    assert all(labels), "an empty label"
    assert len(set(labels)) == len(labels), "two ids share a label"
    for i, tt in tts.items():
        if tt.special:
            assert i == 50256 and tt.label == "<|endoftext|>"
            continue
        data = byte_level_bytes(raw[i])
        assert tt.data == data
        assert label_to_bytes(tt.label) == data, (i, raw[i], tt.label)
        assert not any(c.isspace() for c in tt.label), (i, tt.label)         # whitespace is always a glyph
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            assert not tt.complete and "⟨" in tt.label and "incomplete UTF-8" in tt.note, (i, tt.label)
            continue
        # valid UTF-8: round-trips to exactly what the tokenizer decodes, every visible char shown as itself
        assert tt.complete and tt.text == text == tok.decode([i]), i
        shown = "".join(c for c in text if unicodedata.category(c)[0] in "LNPS" and c not in "␣⏎⇥␍␡⟨⟩◌∅⍽")
        assert all(c in tt.label for c in shown), (i, text, tt.label)


def test_issue_examples(vocab):
    tok, raw, tts = vocab
    assert tts[34803].label == "î" and raw[34803] == "Ã®"                    # was 'Ã®' (mojibake)
    assert tts[tok.convert_tokens_to_ids("Ã©")].label == "é"
    assert tts[tok.encode("о")[0]].label == "о"                                # Cyrillic, was 'Ð¾'
    assert tts[133].label == "⟨C9⟩" and not tts[133].complete                 # was 'É'
    assert tts[12466].label == "␣⟨D0⟩"
    shy = tok.convert_tokens_to_ids(bytes_to_byte_level("\u00ad".encode()))
    assert tts[shy].label == "⟨SHY⟩" and "SOFT HYPHEN" in tts[shy].note        # was an empty chip
    assert tts[220].label == "␣" and tts[198].label == "⏎"
    n_bad = sum(not t.complete for t in tts.values())
    assert 150 < n_bad < 400        # GPT-2 has a few hundred tokens that are only part of a character


def test_plain_text_and_bytes_inputs_agree():
    assert token_text("é") == token_text("é".encode()) == token_text_from_raw("Ã©")
    assert token_text(b"\xc3").label == "⟨C3⟩"
    assert token_text("⟨C3⟩").label == "⟨U+27E8⟩C3⟨U+27E9⟩"                   # a literal glyph is escaped
    assert token_text("").label == "∅" and token_text("\u0301").label == "◌\u0301"
    assert token_text("<|endoftext|>").special


def test_strip_tooltip_and_topk_marker_use_bytes_and_ids():
    from html.parser import HTMLParser

    # two alternatives that LOOK alike as text (both incomplete, both decode to U+FFFD) but are different ids
    toks = [b" \xd0", "\u00ad", b"\xc3\xae"]
    topk = [[(b"\xc3", -0.1, 7), (b" \xd0", -0.2, 12466)], [("\u00ad", -0.5, 3907)], [("î", -0.3, 34803)]]
    html = token_strip(toks, [-1.0, -2.0, -3.0], metric="logp", topk=topk, token_ids=[12466, 3907, 34803]).html

    class P(HTMLParser):
        spans: list = []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "span" and "data-t" in a:
                self.spans.append(a["title"])

    p = P()
    p.feed(html)
    t0, t1, t2 = p.spans
    assert "'␣⟨D0⟩' (id 12466)" in t0 and "bytes 20 D0" in t0 and "incomplete UTF-8" in t0
    assert "1. '⟨C3⟩' (id 7)  -0.1\n" in t0 + "\n" and "2. '␣⟨D0⟩' (id 12466)  -0.2  ← sampled" in t0
    assert "'⟨SHY⟩'" in t1 and "SOFT HYPHEN" in t1 and "← sampled" in t1
    assert "'î' (id 34803)" in t2 and "← sampled" in t2 and "Ã" not in html


def test_legend_explains_split_bytes_only_when_present():
    assert "⟨XX⟩ = one byte" in token_strip([b" \xd0", b"\xb4"], [-1.0, -2.0]).html
    assert "⟨XX⟩" not in token_strip(["a", "é"], [-1.0, -2.0]).html


def test_bundled_char_tokenizer_goes_through_the_same_renderer():
    from transformers import AutoTokenizer

    from rookworld_debug.models.loading import TINY_DIR
    from rookworld_debug.models.tokenizer import is_byte_level
    tok = AutoTokenizer.from_pretrained(str(TINY_DIR))
    assert is_byte_level(tok)
    raw = token_strings(tok, range(len(tok)))
    tts = {i: token_text_from_raw(r) for i, r in raw.items()}
    labels = [t.label for t in tts.values()]
    assert all(labels) and len(set(labels)) == len(labels)
    for i, tt in tts.items():
        if not tt.special:
            assert label_to_bytes(tt.label) == tt.data == byte_level_bytes(raw[i])
            if tt.complete:
                assert tt.text == tok.decode([i])
    ids = tok.encode("P: 8/8 w - - 0 1    M: e2e4")
    assert [tts[i].label for i in ids][:3] == ["P", ":", "␣"]


def test_non_byte_level_tokenizer_is_rendered_from_the_utf8_of_its_pieces():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rookworld_debug.models.provenance import tokenizer_sha256
    from rookworld_debug.models.tokenizer import is_byte_level
    tk = Tokenizer(models.WordLevel({"é": 0, "дом": 1, "a": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", eos_token="<|endoftext|>")
    assert not is_byte_level(tok)
    raw = token_strings(tok, [0, 1, 2, tok.eos_token_id])
    assert [token_text_from_raw(raw[i]).label for i in (0, 1, 2)] == ["é", "дом", "a"]
    assert token_text_from_raw(raw[tok.eos_token_id]).special
    assert len(tokenizer_sha256(tok)) == 64 and tokenizer_sha256(tok) != tokenizer_sha256(gpt2_tokenizer())


def test_pinned_stock_gpt2_tokenizer_hash(vocab):
    from rookworld_debug.models.provenance import tokenizer_sha256
    from rookworld_debug.models.tokenizer import GPT2_TOKENIZER_SHA256
    tok, _, _ = vocab
    assert tokenizer_sha256(tok) == GPT2_TOKENIZER_SHA256
    tok.pad_token, tok.padding_side = tok.eos_token, "left"       # what the loader changes: not identity
    assert tokenizer_sha256(tok) == GPT2_TOKENIZER_SHA256
