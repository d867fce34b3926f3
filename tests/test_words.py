"""Words a user understands: no tracker numbers, build rounds or workplace words in what a user reads.

A user of the package never saw the tracker the code was built with, so "issue 27", "the issue-12 rates",
"round 3" or "the seeds' debug loop" mean nothing to them. This test greps the package (code, help texts,
notebooks, package data), the notebooks, docs/, scripts/, benchmarks/, README.md, CHANGELOG.md and
pyproject.toml, and lists every hit as file:line. Name a source by what it is ("rookworld-trl's manual debug run", "TRL 1.16's GRPOTrainer") and a
model by its recipe ("the shipped weights", "the game-ends candidate").
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Each pattern with what it catches; all case-insensitive.
PATTERNS = {
    "tracker number": r"\bissues?[- _]?#?\d+|\bissue #|\bPR ?#\d+|\b(?:see|in|cf\.?|per|fixes|closes) #\d+\b",
    "the issue as a source": r"\bthe issue'?s\b|\bby the issue\b|\bthe issue (?:names|says|asks|started|describes)\b",
    "build round": r"\brounds?[- ]?\d|\bround (?:one|two|three|four|five|six|seven)\b|\b(?:this|next|previous|earlier|later) round\b",
    "the seeds as a source": r"(?<!\[')\bseeds'(?!\w)|\bthe seeds (?:computed|debug|loop|run|script|code|did|wrote)\b",
    "build-process word": (r"\bthis session\b|\b(?:first|second|third|next|previous|earlier|later) session\b"
                           r"|\bsessions?' (?:device|time)\b|\bthe lead\b(?!-)|\blent\b|\bnot drawn\b"
                           r"|\bhelpers? (?:session|engineer)s?\b|\bother engineers\b"),
    "a workplace document as a source": (r"\banchor_\w+|\banchor §|\bthe anchors?(?:'s?)?(?![-\w])|\banchor-doc"
                                         r"|\(anchor\)|\bfeasibility (?:run|report|study)\b|ARCHITECTURE\.md"
                                         r"|shared/(?:design|reference)\b"),
}
COMPILED = {name: re.compile(rx, re.IGNORECASE) for name, rx in PATTERNS.items()}

TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".json", ".jsonl", ".txt", ".toml", ".cfg", ".html", ".css", ".js",
                 ".sh", ".yaml", ".yml", ".csv"}
ROOTS = ("rookworld_debug", "notebooks", "docs", "scripts", "benchmarks")
FILES = ("README.md", "CHANGELOG.md", "pyproject.toml")


def files_to_check() -> list[Path]:
    out = [REPO / f for f in FILES if (REPO / f).is_file()]
    for root in ROOTS:
        for p in sorted((REPO / root).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts:
                out.append(p)
    return out


def hits_in(text: str) -> list[tuple[int, str, str]]:
    """(line number, pattern name, matched text) for every hit in ``text``."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for name, rx in COMPILED.items():
            for m in rx.finditer(line):
                out.append((i, name, m.group(0)))
    return out


def all_hits() -> list[str]:
    lines = []
    for p in files_to_check():
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for i, name, word in hits_in(text):
            lines.append(f"{p.relative_to(REPO)}:{i}: {name}: {word!r}")
    return lines


@pytest.mark.parametrize("text", [
    "the issue-12 rates", "issue 27", "issue #4", "signatures in issue #4", "see #12 for why",
    "round 3", "Round 4 (shipped)", "round-3/4 recipe", "rounds 5, 6, 7", "tiny-round3b-replay.json",
    "the seeds' debug loop", "what the seeds computed by hand", "no GPU was lent", "this session's device time",
    "the second session", "By the issue's rule", "the lead merges", "(anchor_rookworld.md §3.14)",
    "as the anchor: down to −1.5", "the anchors' behaviour", "(an anchor-doc mistake)", "the old tool (anchor §3.5)",
])
def test_the_patterns_catch_tracker_and_workplace_words(text):
    assert hits_in(text), text


@pytest.mark.parametrize("text", [
    "round(x, 3)", "np.round(v, 4)", "dict round-trips", "a JSON round trip", "around 3 s",
    "background:#fff3cd", "color: #000", "task='P'", "the P: task", "helpers", "# helpers",
    "seeds 5000, 6000 and 7000", "three seeds", "a JupyterLab session", "train_round3/r4 (a path in a log)",
    "the cell #", "equivalent", "Stockfish's #1 move", "the lead-up to a trigger",
    "does not apply to this task", "anchor pins the neutral end's value", "xanchor='left'", "metric.anchor", "the issue is that", "GRPO's advantages",
])
def test_the_patterns_leave_ordinary_words_alone(text):
    assert not hits_in(text), (text, hits_in(text))


def test_no_tracker_or_workplace_words_in_what_a_user_reads():
    hits = all_hits()
    assert not hits, f"{len(hits)} tracker/workplace words (file:line: kind: text):\n" + "\n".join(hits)
