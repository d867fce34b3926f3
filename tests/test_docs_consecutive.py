"""What the docs say of the consecutive-step pairs agrees with `folder_diagnosis`: a captures folder's captures kept
with their weights are paired (tests/test_replay_kept.py runs such a folder: one pair of its two captures)."""
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "DIAGNOSIS.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("### Consecutive steps")
    return text[start:text.index("\n#", start + 1)]


def test_the_docs_say_a_captures_folder_is_paired():
    words = " ".join(_section().split())
    assert "no pairs" not in words
    assert "(`captures.json`) is paired the same way" in words
    assert "keep_weights=True" in words
