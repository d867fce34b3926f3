"""The repository tracks sources, not build artefacts: no tracked file (`git ls-files`) is a wheel or an archive,
and none is over 5 MB except the embedded model's weights (rookworld_debug/models/tiny/, listed below by path)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ARCHIVE_ENDINGS = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".7z", ".egg")
MAX_BYTES = 5 * 1024 * 1024
# The files allowed over MAX_BYTES, each by its path: the embedded tiny model (its card: MODEL_CARD.md there).
LARGE_ALLOWED = frozenset({"rookworld_debug/models/tiny/model.safetensors"})


def _tracked() -> list[str]:
    try:
        r = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if r.returncode != 0:
        pytest.skip(f"not a git checkout: {r.stderr.decode(errors='replace').strip()}")
    return [p for p in r.stdout.decode().split("\0") if p]


def _offenders(paths: list[str], root: Path) -> tuple[list[str], dict[str, int]]:
    """(archives, {large file: bytes}) among `paths` under `root`; links are not followed."""
    archives = [p for p in paths if p.lower().endswith(ARCHIVE_ENDINGS)]
    large = {}
    for p in paths:
        f = root / p
        if p not in LARGE_ALLOWED and f.is_file() and not f.is_symlink() and f.stat().st_size > MAX_BYTES:
            large[p] = f.stat().st_size
    return archives, large


def test_no_tracked_wheel_archive_or_large_file():
    tracked = _tracked()
    assert LARGE_ALLOWED <= set(tracked), f"an allowed large file is no longer tracked: {LARGE_ALLOWED - set(tracked)}"
    archives, large = _offenders(tracked, REPO)
    assert not archives, f"build artefacts or archives are tracked (git rm them): {archives}"
    assert not large, f"tracked files over {MAX_BYTES} bytes outside the embedded model: {large}"


def test_the_check_catches_what_it_names(tmp_path):
    names = ["pyflakes-4.1.0-py2.py3-none-any.whl", "a.zip", "b.tar.gz", "c.TGZ", "d.tar.bz2", "e.7z", "f.egg",
             "g.tar", "model.safetensors", "notes.md", "a.gz.txt", "big.json", "just_under.bin"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(MAX_BYTES + 1)
    with open(tmp_path / "just_under.bin", "wb") as f:
        f.truncate(MAX_BYTES)
    archives, large = _offenders(names, tmp_path)
    assert archives == names[:8]
    assert large == {"big.json": MAX_BYTES + 1}
