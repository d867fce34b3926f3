"""Atomic writes, summary.json (read/complete), JSON coercion, parameter hashing; the schema names and
the errors every other part of the sweep runner raises."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rookworld_debug.errors import RookWorldError
from rookworld_debug.safeio import (_fsync_dir, atomic_write_bytes, atomic_write_json,  # noqa: F401 - re-exported
                                    atomic_write_text, to_jsonable)



SUMMARY_SCHEMA = "rookworld_debug.report/summary/1"
INDEX_SCHEMA = "rookworld_debug.report/index/1"
DEFAULT_NOTEBOOK = "notebooks/01_grpo_step.ipynb"
#: injected by the runner; a grid may not set them
RESERVED_PARAMS = frozenset({"run_dir"})
#: top-level keys of summary.json owned by the runner (a notebook's own values are moved aside)
_RUNNER_KEYS = ("schema", "status", "run_id", "sweep", "params", "params_hash", "notebook",
                "notebook_sha256", "files", "runner", "error")
_STALE_FILES = ("summary.json", "error.html", "report.html", "report.ipynb", ".report.partial.ipynb")
_EXIT_SKIPPED = 3


class IncompleteSummaryError(RookWorldError, ValueError):
    """A summary.json is missing, partial, unparsable, not finalized by the runner, failed, or was
    written for other parameters. ``reason`` says which."""

    def __init__(self, path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class SweepError(RookWorldError, RuntimeError):
    """The sweep itself could not run (bad notebook path, duplicate run ids, unreachable cluster)."""


# ----------------------------------------------------------------------------------------------------
# atomic writes and summaries
# ----------------------------------------------------------------------------------------------------

def params_hash(params: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit hash of a parameter set (key order does not matter; ``run_dir`` ignored)."""
    clean = {k: v for k, v in params.items() if k not in RESERVED_PARAMS}
    blob = json.dumps(to_jsonable(clean), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _load_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise IncompleteSummaryError(path, "missing") from None
    except OSError as exc:
        raise IncompleteSummaryError(path, f"unreadable ({exc})") from None
    if not text.strip():
        raise IncompleteSummaryError(path, "empty file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise IncompleteSummaryError(path, f"not valid JSON (partial write?): {exc}") from None


def read_summary(path, *, params_hash: str | None = None, require_ok: bool = True) -> dict:
    """Read a run's summary.json (``path`` may be the file or the run folder) and refuse anything that
    is not a finalized runner summary: missing, empty, truncated or invalid JSON, not a mapping, no
    ``schema`` (e.g. the notebook's raw summary of an interrupted run), a different ``params_hash``, or
    (with ``require_ok``) ``status`` other than ``"ok"`` / no ``report.html``. Raises
    :class:`IncompleteSummaryError`."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    data = _load_json(path)
    if not isinstance(data, dict):
        raise IncompleteSummaryError(path, f"not a JSON object but {type(data).__name__}")
    if data.get("schema") != SUMMARY_SCHEMA:
        raise IncompleteSummaryError(path, "not finalized by the runner (no schema; interrupted run?)")
    status = data.get("status")
    if status not in ("ok", "failed"):
        raise IncompleteSummaryError(path, f"unknown status {status!r}")
    if params_hash is not None and data.get("params_hash") != params_hash:
        raise IncompleteSummaryError(
            path, f"written for other parameters (params_hash {data.get('params_hash')} != {params_hash})")
    if require_ok:
        if status != "ok":
            raise IncompleteSummaryError(path, "run failed")
        html_name = (data.get("files") or {}).get("report_html", "report.html")
        if not (path.parent / html_name).is_file():
            raise IncompleteSummaryError(path, f"{html_name} is missing")
    return data


def is_complete(run_dir, params_hash: str | None = None) -> bool:
    """True when :func:`read_summary` accepts the run folder as a finished, ok run of these params."""
    try:
        read_summary(run_dir, params_hash=params_hash)
    except IncompleteSummaryError:
        return False
    return True


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _flatten_metrics(metrics: Any, prefix: str = "") -> dict:
    out: dict[str, Any] = {}
    if not isinstance(metrics, Mapping):
        return out
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten_metrics(v, key + "/"))
        else:
            out[key] = v
    return out
