"""The full-game generator (terminal vs non-terminal cannot be read off the move number) and measure's
second generator (A: cases by band of game length), plus the real P: line reader."""
from __future__ import annotations

import collections

import pytest

from rookworld_debug.data.positions import BANDS, band_a_cases


def _fullmove(fen: str) -> int:
    return int(fen.split()[-1])


def test_full_games_have_live_positions_late_and_game_ends_early_and_late():
    from rookworld_debug.lab.generate import generate_records
    recs = generate_records(n_games=12, full_games=True, depth=1, seed=3, workers=1, keep=0.5, p_illegal=0.2,
                            heldout_frac=0.0, p_random_game=0.5, p_share_p=0.1, p_end_branch=1.0, eps_range=(0, 1))
    a = [r for r in recs if r["task"] == "A"]
    live_late = [r for r in a if r["outcome"] is None and _fullmove(r["fen"]) > 60]
    ends = [r for r in a if r["terminated"] == 1 and r["outcome"] != "illegal_move"]
    illegal = [r for r in a if r["outcome"] == "illegal_move"]
    assert live_late, "no non-terminal position past move 60: the shortcut would survive"
    assert {_fullmove(r["fen"]) <= 40 for r in ends} == {True, False}, sorted(_fullmove(r["fen"]) for r in ends)
    assert {_fullmove(r["fen"]) <= 40 for r in illegal} == {True, False}
    for r in a:                                      # every record is the arbiter's answer to its prompt
        assert r["text"] == r["prompt"] + r["completion"]
    assert any(r["task"] == "P" for r in recs)


def test_band_cases_sit_in_their_band_with_the_mix():
    cases = band_a_cases(8, seed=5)
    by = collections.Counter((b, c.kind) for b, c in cases)
    assert len(cases) == 8 * len(BANDS)
    for (lo, hi), label in zip(BANDS, dict.fromkeys(b for b, _ in cases)):
        in_band = [c for b, c in cases if b == label]
        for c in in_band:
            fm = _fullmove(c.prompt[3:].split("+")[0])
            assert lo <= fm <= hi, (label, fm)
        assert by[(label, "game_end")] >= 1 and by[(label, "illegal")] >= 1
    ends = [c for _, c in cases if c.kind == "game_end"]
    assert all(c.expected.split("+")[-2] == "1" for c in ends)           # terminated
    assert band_a_cases(8, seed=5) == cases                              # deterministic


def test_real_p_lines_reader(tmp_path, fixtures_dir):
    from rookworld_debug.errors import FormatError
    from rookworld_debug.lab.measure import read_real_p_lines
    rows = read_real_p_lines(fixtures_dir / "rook_p_lines.txt")
    assert len(rows) == 250 and all(len(b) >= 4 for _, b in rows)
    bad = tmp_path / "bad.txt"
    bad.write_text("P: not a fen   M: e2e4 E: 0.1 B: e2e4\n")
    with pytest.raises(FormatError):
        read_real_p_lines(bad)
