"""Shared test fixtures."""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The real RookWorld fixtures in ../shared/fixtures (or $ROOKWORLD_SHARED/fixtures)."""
    candidates = [Path(__file__).parents[1].parent / "shared" / "fixtures"]
    if os.environ.get("ROOKWORLD_SHARED"):
        candidates.append(Path(os.environ["ROOKWORLD_SHARED"]) / "fixtures")
    for path in candidates:
        if (path / "rook_p_lines.txt").exists():
            return path
    pytest.skip(f"RookWorld fixtures not found (looked in {', '.join(map(str, candidates))})")


# tests/tinymodels.py is imported as a plain module by the tests
import sys as _sys

_sys.path.insert(0, str(Path(__file__).parent))
