"""Papermill sweeps: notebook × parameter grid → one HTML report per run + a comparing index.

Layout of a sweep (everything a run produces is finalized atomically; ``summary.json`` last)::

    reports/<sweep-name>/
        index.html  index.json            # table of runs + metric-vs-parameter plots (plotly.js inline)
        <run-id>/
            params.json                   # written when the run starts
            report.ipynb                  # the executed notebook (also on failure: up to the failing cell)
            report.html                   # code hidden, plotly.js inline, no network needed (ok runs)
            error.html                    # the failing cell, its source and traceback (failed runs)
            summary.json                  # the notebook's own summary + the runner's record; see below
            runner.log                    # the run's worker process stdout/stderr

Contract with the notebook
    The notebook has a cell tagged ``parameters``; the runner injects the grid's values plus ``run_dir``
    (absolute path of the run folder). The notebook writes ``run_dir/summary.json`` with
    :func:`atomic_write_json`, headline numbers under ``"metrics"`` (a flat mapping name → number;
    nested mappings are flattened with ``/``). Anything else it writes (config, provenance, timings,
    trace path) is kept. For plots to survive the HTML export the notebook sets
    ``plotly.io.renderers.default = "plotly_mimetype+notebook"``; figures that only carry the plotly
    JSON mimetype are converted at export time anyway (and the summary notes it).

summary.json (finalized by the runner)
    The notebook's own keys, plus: ``schema``, ``status`` ("ok" | "failed"), ``run_id``, ``sweep``,
    ``params``, ``params_hash``, ``notebook``, ``notebook_sha256``, ``files`` (names of the run's
    files), ``runner`` (started_at, finished_at, papermill_s, nbconvert_s, total_s, html_bytes,
    html_check, host, pid, warnings...) and, for failed runs, ``error`` (ename, evalue, traceback,
    traceback_text, cell_index, exec_count, cell_source). A notebook value under one of these names is
    moved to ``notebook_fields``. ``metrics`` is always present (``{}`` if the notebook gave none).

Completeness (what "resume" trusts)
    A run is complete only when ``summary.json`` parses, carries ``"schema": SUMMARY_SCHEMA``,
    ``"status": "ok"`` and the ``params_hash`` of the requested parameters, and its ``report.html``
    exists. The runner writes that summary after everything else, with write-to-temp + fsync +
    ``os.replace``, so an interrupted run (SIGINT, SIGKILL, power loss) leaves either no summary or the
    notebook's raw one (no schema) — both read as incomplete and the run is redone on resume.
    :func:`read_summary` refuses anything else with :class:`IncompleteSummaryError`.

Execution
    Every run executes in its own worker process (``python -m rookworld_debug.report --worker
    TASK``; papermill then starts the run's own kernel). Locally, ``workers`` threads each drive one
    such process. The worker holds an ``flock`` on ``<run-id>/.lock`` while it runs, so a resumed sweep
    never races a run that is still finishing; it asks the kernel to die with it (``PR_SET_PDEATHSIG``
    on Linux), so killing the sweep does not leave orphans that keep writing.

Why Dask (``distributed``) rather than Ray for ``cluster=``
    A run is "execute a notebook, write files": a plain function with no large objects to move. Dask's
    ``distributed`` is pure Python and pip-light (no compiled core, no object store, no daemon to set up),
    ``LocalCluster`` starts in seconds inside a test, ``Client(address)`` attaches to an existing
    ``dask scheduler``/``dask worker`` deployment (also on SLURM/Kubernetes via dask-jobqueue /
    dask-kubernetes), and a task may itself start subprocesses. Ray would work too but is heavier to
    install (large wheels, a raylet/GCS daemon and plasma store) and slow to start on a 2-core box, and
    its object store buys nothing here. With ``cluster=`` each run is one Dask task; the task runs the
    same worker process as the local path and writes its files to the *shared* filesystem path of the
    sweep (workers must see ``out_root`` and the notebook at the same absolute paths, and have
    ``rookworld_debug`` installed). The cluster bounds concurrency; ``workers`` is then ignored.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import html
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback as _traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld_debug.errors import ConfigError, RookWorldError

__all__ = [
    "SUMMARY_SCHEMA", "INDEX_SCHEMA", "DEFAULT_NOTEBOOK", "RESERVED_PARAMS",
    "IncompleteSummaryError", "SweepError",
    "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "read_summary", "is_complete",
    "to_jsonable", "params_hash",
    "parse_value", "parse_param_spec", "parse_param_specs", "load_grid_file", "Grid", "make_grid",
    "expand_grid", "run_id",
    "export_html", "HtmlCheck", "error_page",
    "execute_run", "RunOutcome", "SweepResult", "run_sweep", "build_index", "write_index",
]

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

def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part:
    temp file in the same directory, fsync, ``os.replace``, fsync of the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` for text."""
    return atomic_write_bytes(path, text.encode(encoding))


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types from numpy/torch scalars and arrays, dataclasses, paths, tuples and sets.
    Non-finite floats become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (strict JSON has no
    NaN, and dropping them would hide exactly the numbers a debugger is looking for)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [to_jsonable(v) for v in sorted(obj, key=repr)]
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return to_jsonable(obj.to_dict())
    if hasattr(obj, "tolist") and callable(obj.tolist):          # numpy / torch arrays and scalars
        return to_jsonable(obj.tolist())
    if hasattr(obj, "item") and callable(obj.item):
        return to_jsonable(obj.item())
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def atomic_write_json(path, obj: Any, *, indent: int | None = 2) -> Path:
    """Serialise ``obj`` (via :func:`to_jsonable`) as strict JSON and write it atomically."""
    text = json.dumps(to_jsonable(obj), indent=indent, allow_nan=False, ensure_ascii=False)
    return atomic_write_text(path, text + "\n")


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


# ----------------------------------------------------------------------------------------------------
# parameter grids
# ----------------------------------------------------------------------------------------------------

_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$", re.IGNORECASE)
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_value(text: str) -> Any:
    """One command-line value: int, float, bool (true/false, any case), None (none/null), or str.
    Quote a value ('1' or "1") to keep it a string."""
    s = text.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    if _INT_RE.match(s):
        return int(s)
    if _FLOAT_RE.match(s):
        return float(s)
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    return s


def _check_name(name: str, where: str) -> str:
    if not _IDENT_RE.match(name or ""):
        raise ConfigError(where, f"parameter name {name!r} is not a Python identifier")
    if name in RESERVED_PARAMS:
        raise ConfigError(where, f"parameter {name!r} is set by the runner and cannot be swept")
    return name


def parse_param_spec(spec: str) -> tuple[str, list]:
    """``"beta=0,0.005,0.05"`` → ``("beta", [0, 0.005, 0.05])``. Values are split on commas (no
    escaping: put values that contain commas in a YAML grid file)."""
    if "=" not in spec:
        raise ConfigError("-p", f"expected NAME=V1,V2,... but got {spec!r}")
    name, _, rest = spec.partition("=")
    name = _check_name(name.strip(), "-p")
    if rest.strip() == "":
        raise ConfigError(name, "no values given")
    return name, [parse_value(v) for v in rest.split(",")]


def parse_param_specs(specs: Iterable[str]) -> dict[str, list]:
    """Several ``-p`` specs → ordered mapping name → values; a repeated name is an error."""
    out: dict[str, list] = {}
    for spec in specs:
        name, values = parse_param_spec(spec)
        if name in out:
            raise ConfigError(name, "given twice with -p")
        out[name] = values
    return out


def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that also reads ``1e-3`` (no dot) as a float, as Python and YAML 1.2 do."""

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
        list("-+0123456789."))
    return Loader


@dataclass(frozen=True)
class Grid:
    """A parameter grid: ``axes`` (name → list of values, swept as a cartesian product, in this order;
    they name the runs) and ``fixed`` (name → value, passed to every run, not part of run ids)."""

    axes: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)
    name: str | None = None

    def __post_init__(self):
        for k, vals in self.axes.items():
            _check_name(k, "grid")
            if not isinstance(vals, (list, tuple)) or len(vals) == 0:
                raise ConfigError(k, "an axis needs a non-empty list of values")
            keys = [json.dumps(to_jsonable(v), sort_keys=True) for v in vals]
            if len(set(keys)) != len(keys):
                raise ConfigError(k, f"duplicate values in {list(vals)!r}")
        for k in self.fixed:
            _check_name(k, "fixed")
            if k in self.axes:
                raise ConfigError(k, "both swept and fixed")

    @property
    def swept(self) -> list[str]:
        return list(self.axes)

    def expand(self) -> list[dict]:
        return expand_grid(self.axes, self.fixed)

    def to_dict(self) -> dict:
        return {"name": self.name, "axes": to_jsonable(self.axes), "fixed": to_jsonable(self.fixed)}


def load_grid_file(path) -> Grid:
    """A YAML grid: a mapping name → list of values (an axis) or scalar (fixed), plus optional
    ``fixed:`` (mapping) and ``name:`` (the sweep name). Axes may also sit under a ``grid:`` key, which
    frees the names ``fixed``/``name`` for parameters. Example::

        name: beta-vs-temperature
        beta: [0, 0.005, 0.05]
        temperature: [0.7, 1.0]
        fixed: {seed: 0, num_generations: 4}
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_yaml_loader())  # noqa: S506 (SafeLoader)
    except FileNotFoundError:
        raise ConfigError("grid_file", f"{path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError("grid_file", f"{path} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("grid_file", f"{path} must hold a mapping, not {type(data).__name__}")
    data = dict(data)
    name = data.pop("name", None)
    fixed = data.pop("fixed", None) or {}
    if not isinstance(fixed, dict):
        raise ConfigError("fixed", "must be a mapping name → value")
    body = data.pop("grid", None)
    if body is not None:
        if not isinstance(body, dict):
            raise ConfigError("grid", "must be a mapping name → list of values")
        if data:
            raise ConfigError("grid_file", f"keys {sorted(data)} beside 'grid:'; put them under it")
        data = dict(body)
    axes, fixed = {}, dict(fixed)
    for k, v in data.items():
        k = str(k)
        if isinstance(v, list):
            axes[k] = v
        else:
            if k in fixed:
                raise ConfigError(k, "given both at top level and under fixed:")
            fixed[k] = v
    return Grid(axes=axes, fixed=fixed, name=None if name is None else str(name))


def make_grid(specs: Iterable[str] = (), grid_file=None, *, fixed: Mapping | None = None,
              name: str | None = None) -> Grid:
    """Combine a YAML grid file and ``-p`` specs (a ``-p`` axis replaces the file's axis or fixed
    value of the same name)."""
    base = load_grid_file(grid_file) if grid_file is not None else Grid()
    axes, fx = dict(base.axes), dict(base.fixed)
    fx.update(fixed or {})
    for k, vals in parse_param_specs(specs).items():
        fx.pop(k, None)
        axes[k] = vals
    return Grid(axes=axes, fixed=fx, name=name if name is not None else base.name)


def expand_grid(axes: Mapping[str, Sequence], fixed: Mapping[str, Any] | None = None) -> list[dict]:
    """Cartesian product of ``axes`` in their order (the last axis varies fastest), each merged over
    ``fixed``. No axes → one parameter set (just ``fixed``)."""
    names = list(axes)
    combos = itertools.product(*(list(axes[n]) for n in names))
    return [{**dict(fixed or {}), **dict(zip(names, combo))} for combo in combos]


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if v is None or isinstance(v, (bool, int, str)):
        return str(v)
    return json.dumps(to_jsonable(v), sort_keys=True, separators=(",", ":"))


_SAFE_RE = re.compile(r"[^A-Za-z0-9._=+-]")
_MAX_RUN_ID = 96


def run_id(params: Mapping[str, Any], swept: Sequence[str] | None = None) -> str:
    """A readable, stable folder name for a run: ``beta=0.005__temperature=0.7`` over the ``swept``
    names (default: all, sorted). Values with characters outside ``[A-Za-z0-9._=+-]`` are replaced
    by ``_`` and the id gets a ``-<hash8>`` suffix (so two values never collide); so do ids longer
    than 96 characters (truncated). No swept names → ``run``."""
    keys = list(swept) if swept is not None else sorted(k for k in params if k not in RESERVED_PARAMS)
    if not keys:
        return "run"
    raw = "__".join(f"{k}={_fmt_value(params[k])}" for k in keys)
    safe = _SAFE_RE.sub("_", raw)
    if safe == raw and len(raw) <= _MAX_RUN_ID:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{safe[:_MAX_RUN_ID - 9].rstrip('_')}-{digest}"


def _sweep_dir_name(name: str) -> str:
    safe = _SAFE_RE.sub("_", name.strip())
    if not safe or set(safe) <= {".", "_"}:
        raise ConfigError("sweep_name", f"unusable sweep name {name!r}")
    return safe


# ----------------------------------------------------------------------------------------------------
# HTML: executed notebook → self-contained report; error page
# ----------------------------------------------------------------------------------------------------

_OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
"""
_EXTERNAL_SCRIPT_RE = re.compile(
    r"<script\b[^>]*?\bsrc\s*=\s*[\"']?(?:https?:)?//[^\"'\s>]+[\"']?[^>]*>\s*</script>", re.IGNORECASE)
_ANY_EXTERNAL_SRC_RE = re.compile(r"<(?:script|link)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//",
                                  re.IGNORECASE)
_PLOTLYJS_RE = re.compile(r"plotly\.js v\d+\.\d+")
_PLOTLY_MIME = "application/vnd.plotly.v1+json"


@dataclass(frozen=True)
class HtmlCheck:
    """What :func:`export_html` verified about the HTML it produced."""

    bytes: int
    plotly_figures: int            # figure outputs in the notebook
    plotly_js_inline: bool         # the plotly.js bundle is embedded in the page
    converted_figures: int         # JSON-only figures the exporter had to render itself
    removed_external_scripts: int  # <script src=http...> tags stripped (e.g. plotly's MathJax CDN tag)
    external_refs: int             # <script|link src|href=http...> left (must be 0)

    @property
    def offline_ok(self) -> bool:
        return self.external_refs == 0 and (self.plotly_figures == 0 or self.plotly_js_inline)

    def warnings(self) -> list[str]:
        out = []
        if self.converted_figures:
            out.append(f"{self.converted_figures} plotly figure(s) carried only the JSON mimetype and were "
                       "rendered by the exporter; set plotly.io.renderers.default = "
                       "'plotly_mimetype+notebook' in the notebook")
        if self.plotly_figures and not self.plotly_js_inline:
            out.append("plotly figures present but plotly.js is not embedded: they will not render offline")
        if self.external_refs:
            out.append(f"{self.external_refs} external <script>/<link> reference(s) left in the HTML")
        return out


def _fill_plotly_html(nb) -> tuple[int, int]:
    """Give JSON-only plotly outputs a text/html rendering (plotly.js included once, before first use).
    Returns (figures, converted)."""
    figures = converted = 0
    have_bundle = False
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            html_text = data.get("text/html", "")
            if isinstance(html_text, list):
                html_text = "".join(html_text)
            if html_text and _PLOTLYJS_RE.search(html_text[:2000]):
                have_bundle = True
            if _PLOTLY_MIME not in data:
                continue
            figures += 1
            if html_text:
                continue
            import plotly.io as pio
            fig = data[_PLOTLY_MIME]
            data["text/html"] = pio.to_html(fig, include_plotlyjs=not have_bundle, full_html=False,
                                            include_mathjax=False, validate=False)
            have_bundle = True
            converted += 1
    return figures, converted


def export_html(notebook, *, banner: str | None = None) -> tuple[str, HtmlCheck]:
    """Executed notebook (path or NotebookNode) → self-contained HTML with code hidden: nbconvert's lab
    template without the require.js/MathJax/mermaid/widget CDN tags, plotly.js inline, any remaining
    ``<script src=http...>`` (plotly adds a MathJax CDN tag per figure) stripped. Markdown LaTeX is shown
    as source (no MathJax offline). ``banner`` (HTML) is put at the top of the page."""
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook), as_version=4) if not hasattr(notebook, "cells") else notebook
    figures, converted = _fill_plotly_html(nb)
    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True,
                            extra_loaders=[jinja2.DictLoader({"rookworld_offline.html.j2": _OFFLINE_TEMPLATE})],
                            template_file="rookworld_offline.html.j2")
    body, _ = exporter.from_notebook_node(nb)
    body, removed = _EXTERNAL_SCRIPT_RE.subn("", body)
    if banner:
        body = body.replace("<main>", "<main>\n" + banner, 1)
    check = HtmlCheck(bytes=len(body.encode("utf-8")), plotly_figures=figures,
                      plotly_js_inline=bool(_PLOTLYJS_RE.search(body)), converted_figures=converted,
                      removed_external_scripts=removed, external_refs=len(_ANY_EXTERNAL_SRC_RE.findall(body)))
    return body, check


_PAGE_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem 2rem;color:#1f2328}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;font-size:.85rem} th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left}
th{background:#f6f8fa;cursor:pointer;position:sticky;top:0} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.failed td{background:#ffebe9} tr.incomplete td,tr.pending td{background:#fff8c5}
.badge{display:inline-block;padding:0 .45rem;border-radius:.6rem;font-size:.78rem;font-weight:600}
.ok{background:#dafbe1;color:#116329} .failed{background:#ffebe9;color:#a40e26}
.incomplete,.pending{background:#fff8c5;color:#7d4e00} .flag{color:#a40e26;font-weight:600}
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:.6rem;overflow:auto;font-size:.8rem;line-height:1.35}
.muted{color:#656d76;font-size:.85rem} code{background:#f6f8fa;padding:0 .2rem}
.ansi-red-fg{color:#c81e1e}.ansi-green-fg{color:#116329}.ansi-yellow-fg{color:#7d4e00}
.ansi-blue-fg{color:#0550ae}.ansi-cyan-fg{color:#1b7c83}.ansi-magenta-fg{color:#8250df}.ansi-bold{font-weight:700}
"""


def _ansi_html(text: str) -> str:
    try:
        from nbconvert.filters.ansi import ansi2html
        return ansi2html(text)
    except Exception:  # noqa: BLE001 - cosmetic only
        return html.escape(re.sub("\x1b\\[[0-9;]*[A-Za-z]", "", text))


def _strip_ansi(text: str) -> str:
    return re.sub("\x1b\\[[0-9;]*[A-Za-z]", "", text)


def error_page(*, run_id: str, params: Mapping, error: Mapping, sweep: str | None = None,
               notebook: str | None = None, links: Mapping[str, str] | None = None) -> str:
    """A standalone HTML page for a failed run: the failing cell (index, source) and its traceback."""
    esc = html.escape
    rows = "".join(f"<tr><th>{esc(str(k))}</th><td><code>{esc(_fmt_value(v))}</code></td></tr>"
                   for k, v in params.items())
    cell = ""
    if error.get("cell_index") is not None:
        count = error.get("exec_count")
        in_n = "" if count is None else f" (In [{esc(str(count))}])"
        cell = (f"<h2>Failing cell: index {esc(str(error['cell_index']))}{in_n}</h2>"
                f"<pre>{esc(error.get('cell_source') or '')}</pre>")
    tb = error.get("traceback") or []
    tb_text = "\n".join(tb) if isinstance(tb, list) else str(tb)
    link_html = " · ".join(f"<a href='{esc(href)}'>{esc(label)}</a>" for label, href in (links or {}).items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>FAILED {esc(run_id)}</title>
<style>{_PAGE_CSS}</style></head><body>
<h1>Run failed: <code>{esc(run_id)}</code> <span class="badge failed">failed</span></h1>
<p class="muted">sweep <code>{esc(sweep or '')}</code> · notebook <code>{esc(notebook or '')}</code>
{('· ' + link_html) if link_html else ''}</p>
<h2>{esc(str(error.get('ename', 'Error')))}: {esc(str(error.get('evalue', '')))}</h2>
{cell}
<h2>Traceback</h2>
<pre class="traceback">{_ansi_html(tb_text)}</pre>
<h2>Parameters</h2><table>{rows}</table>
</body></html>
"""


# ----------------------------------------------------------------------------------------------------
# one run (executes inside the worker process)
# ----------------------------------------------------------------------------------------------------

def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@contextlib.contextmanager
def _run_lock(run_dir: Path):
    """Exclusive flock on ``run_dir/.lock`` for the duration of a run (released if the process dies)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = open(run_dir / ".lock", "a+")  # noqa: SIM115
    try:
        try:
            import fcntl
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - non-POSIX
            pass
        yield
    finally:
        fh.close()


def _run_banner(task: Mapping[str, Any]) -> str:
    esc = html.escape
    params = " ".join(f"<code>{esc(k)}={esc(_fmt_value(v))}</code>" for k, v in task["params"].items())
    return ("<div class='rookworld-run-banner' style='font:13px system-ui,sans-serif;color:#57606a;"
            "border-bottom:1px solid #d0d7de;padding:.4rem 0 .5rem;margin-bottom:.5rem'>"
            f"run <b>{esc(task['run_id'])}</b> of sweep <b>{esc(str(task.get('sweep')))}</b> · {params} · "
            f"<a href='../index.html'>sweep index</a> · <a href='summary.json'>summary.json</a></div>")


def _error_from_exception(exc: BaseException, output_nb: Path | None) -> dict:
    """ename/evalue/traceback and, where known, the failing cell's index and source."""
    err: dict[str, Any] = {}
    if all(hasattr(exc, a) for a in ("ename", "evalue", "traceback", "cell_index")):  # PapermillExecutionError
        err.update(ename=exc.ename, evalue=exc.evalue, traceback=list(exc.traceback or []),
                   cell_index=exc.cell_index, exec_count=getattr(exc, "exec_count", None),
                   cell_source=getattr(exc, "source", None))
    else:
        err.update(ename=type(exc).__name__, evalue=str(exc),
                   traceback=_traceback.format_exception(type(exc), exc, exc.__traceback__),
                   cell_index=None, exec_count=None, cell_source=None)
        if output_nb is not None and output_nb.exists():     # e.g. a cell timeout or a dead kernel
            with contextlib.suppress(Exception):
                import nbformat
                nb = nbformat.read(str(output_nb), as_version=4)
                code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
                meta = [c.get("metadata", {}).get("papermill", {}) for _, c in code]
                hit = next((k for k, m in enumerate(meta) if m.get("status") == "running" or m.get("exception")),
                           None)
                if hit is None:    # papermill marks a timed-out cell "completed": take the last one started
                    started = [k for k, m in enumerate(meta) if m.get("start_time")]
                    if started and started[-1] + 1 < len(meta):
                        hit = started[-1]
                if hit is not None:
                    i, cell = code[hit]
                    err.update(cell_index=i, exec_count=cell.get("execution_count"), cell_source=cell.source)
    err["traceback_text"] = _strip_ansi("\n".join(err["traceback"]) if isinstance(err["traceback"], list)
                                        else str(err["traceback"]))
    return err


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


def execute_run(task: Mapping[str, Any]) -> dict:
    """Execute one run described by ``task`` (keys: notebook, run_dir, run_id, params, params_hash,
    sweep, kernel_name, timeout_per_cell, start_timeout, resume, require_summary) and finalize its
    folder. Returns the final summary (``status`` ok/failed) or ``{"status": "skipped"}`` when, under
    the lock, the run turned out complete already. Never raises for a notebook failure."""
    import papermill as pm

    run_dir = Path(task["run_dir"])
    notebook = Path(task["notebook"])
    with _run_lock(run_dir):
        if task.get("resume", True) and is_complete(run_dir, task["params_hash"]):
            return {"status": "skipped", "run_id": task["run_id"]}
        for name in _STALE_FILES:                     # summary.json first: never an ok summary w/o files
            with contextlib.suppress(FileNotFoundError):
                (run_dir / name).unlink()
        for tmp in run_dir.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
        started = _now()
        atomic_write_json(run_dir / "params.json", {
            "run_id": task["run_id"], "sweep": task.get("sweep"), "params": task["params"],
            "params_hash": task["params_hash"], "notebook": str(notebook), "started_at": started})

        partial = run_dir / ".report.partial.ipynb"
        final_nb = run_dir / "report.ipynb"
        t0 = time.perf_counter()
        error: dict | None = None
        try:
            pm.execute_notebook(
                str(notebook), str(partial),
                parameters={**task["params"], "run_dir": str(run_dir)},
                kernel_name=task.get("kernel_name", "python3"), progress_bar=False, log_output=False,
                start_timeout=task.get("start_timeout", 120), cwd=str(notebook.parent),
                execution_timeout=task.get("timeout_per_cell"))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a failed-run record
            error = _error_from_exception(exc, partial)
        papermill_s = time.perf_counter() - t0
        if partial.exists():
            os.replace(partial, final_nb)

        nb_summary: dict = {}
        runner_warnings: list[str] = []
        if error is None:
            raw = run_dir / "summary.json"
            if raw.exists():
                try:
                    loaded = _load_json(raw)
                    if not isinstance(loaded, dict):
                        raise IncompleteSummaryError(raw, "the notebook's summary is not a JSON object")
                    nb_summary = loaded
                except IncompleteSummaryError as exc:
                    error = _error_from_exception(exc, None)
            elif task.get("require_summary", True):
                error = {"ename": "MissingSummary",
                         "evalue": "the notebook finished but wrote no summary.json to run_dir (use "
                                   "rookworld_debug.report.atomic_write_json(Path(run_dir) / 'summary.json', {...}))",
                         "traceback": [], "cell_index": None, "exec_count": None, "cell_source": None,
                         "traceback_text": ""}
            else:
                runner_warnings.append("the notebook wrote no summary.json")

        nbconvert_s, check = 0.0, None
        if error is None:
            t1 = time.perf_counter()
            try:
                body, check = export_html(final_nb, banner=_run_banner(task))
                atomic_write_text(run_dir / "report.html", body)
            except Exception as exc:  # noqa: BLE001
                error = _error_from_exception(exc, None)
                error["ename"] = f"HTMLExportError: {error['ename']}"
            nbconvert_s = time.perf_counter() - t1
            if check is not None:
                runner_warnings.extend(check.warnings())

        for key in _RUNNER_KEYS:                      # the runner owns these; keep the notebook's aside
            if key in nb_summary:
                nb_summary.setdefault("notebook_fields", {})[key] = nb_summary.pop(key)
        summary = dict(nb_summary)
        summary.setdefault("metrics", {})
        files = {"params": "params.json", "report_ipynb": "report.ipynb" if final_nb.exists() else None,
                 "runner_log": "runner.log"}
        if error is None:
            files["report_html"] = "report.html"
        else:
            files["error_html"] = "error.html"
        summary.update({
            "schema": SUMMARY_SCHEMA,
            "status": "ok" if error is None else "failed",
            "run_id": task["run_id"], "sweep": task.get("sweep"),
            "params": task["params"], "params_hash": task["params_hash"],
            "notebook": str(notebook), "notebook_sha256": _sha256_file(notebook),
            "files": files,
            "runner": {
                "started_at": started, "finished_at": _now(),
                "papermill_s": round(papermill_s, 3), "nbconvert_s": round(nbconvert_s, 3),
                "total_s": round(time.perf_counter() - t0, 3),
                "html_bytes": None if check is None else check.bytes,
                "html_check": None if check is None else {**dataclasses.asdict(check), "offline_ok": check.offline_ok},
                "kernel_name": task.get("kernel_name", "python3"),
                "host": os.uname().nodename, "pid": os.getpid(), "parent_pid": os.getppid(),
                "python": sys.version.split()[0],
                "papermill": pm.__version__, "warnings": runner_warnings,
            },
        })
        if error is not None:
            summary["error"] = error
            links = {"report.ipynb (executed up to the failure)": "report.ipynb", "runner.log": "runner.log",
                     "index": "../index.html"}
            atomic_write_text(run_dir / "error.html", error_page(
                run_id=task["run_id"], params=task["params"], error=error, sweep=task.get("sweep"),
                notebook=str(notebook), links=links))
        atomic_write_json(run_dir / "summary.json", summary)   # LAST: this is what makes the run count
        return summary


def _set_parent_death_signal(expected_parent: int | None) -> None:
    """Linux: get SIGTERM when the process (thread) that started us dies, so a SIGKILLed sweep leaves no
    orphan worker behind; exit at once if it is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(143)


def _worker_main(task_path: str) -> int:
    """Entry point of the per-run worker process."""
    task = json.loads(Path(task_path).read_text(encoding="utf-8"))
    parent = os.environ.get("ROOKWORLD_REPORT_PARENT_PID")
    _set_parent_death_signal(int(parent) if parent else None)

    def _terminate(signum, frame):  # turn SIGTERM into an exception so papermill shuts its kernel down
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the sweep process decides what Ctrl-C means
    sys.stdout.write(f"=== {_now()} run {task['run_id']} pid {os.getpid()} host {os.uname().nodename}\n")
    sys.stdout.flush()
    summary = execute_run(task)
    if summary.get("status") == "skipped":
        return _EXIT_SKIPPED
    return 0 if summary.get("status") == "ok" else 1


# ----------------------------------------------------------------------------------------------------
# driving runs: worker process per run, local threads or Dask tasks
# ----------------------------------------------------------------------------------------------------

_PROCS: dict[str, subprocess.Popen] = {}
_PROCS_LOCK = threading.Lock()
_CANCEL = threading.Event()


def run_task_subprocess(task: Mapping[str, Any]) -> dict:
    """Run one task in a fresh worker process and return its outcome (also the Dask task function).
    Writes ``<run_dir>/.task.json`` (re-run a single run by hand with
    ``python -m rookworld_debug.report --worker <run_dir>/.task.json``)."""
    run_dir = Path(task["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    task_path = atomic_write_json(run_dir / ".task.json", dict(task))
    env = dict(os.environ)
    env["ROOKWORLD_REPORT_PARENT_PID"] = str(os.getpid())
    env.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    for var, value in (task.get("env") or {}).items():
        env.setdefault(var, str(value))
    t0 = time.perf_counter()
    with open(run_dir / "runner.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rookworld_debug.report", "--worker", str(task_path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        with _PROCS_LOCK:
            _PROCS[task["run_id"]] = proc
        try:
            rc = proc.wait()
        finally:
            with _PROCS_LOCK:
                _PROCS.pop(task["run_id"], None)
    wall = time.perf_counter() - t0
    out = {"run_id": task["run_id"], "rc": rc, "wall_s": round(wall, 3)}
    if rc == _EXIT_SKIPPED:
        return {**out, "status": "skipped"}
    try:
        summary = read_summary(run_dir, params_hash=task["params_hash"], require_ok=False)
    except IncompleteSummaryError as exc:
        if _CANCEL.is_set() or rc in (-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM):
            return {**out, "status": "interrupted"}
        # the worker died without finalizing (OOM kill, segfault...): record it as a failed run
        log_tail = ""
        with contextlib.suppress(OSError):
            log_tail = (run_dir / "runner.log").read_text(errors="replace")[-6000:]
        error = {"ename": "WorkerDied", "evalue": f"worker process exited with {rc} ({exc.reason})",
                 "traceback": [log_tail], "traceback_text": log_tail, "cell_index": None,
                 "exec_count": None, "cell_source": None}
        summary = {"schema": SUMMARY_SCHEMA, "status": "failed", "run_id": task["run_id"],
                   "sweep": task.get("sweep"), "params": task["params"], "params_hash": task["params_hash"],
                   "notebook": task["notebook"], "metrics": {}, "error": error,
                   "files": {"params": "params.json", "error_html": "error.html", "runner_log": "runner.log"},
                   "runner": {"finished_at": _now(), "total_s": round(wall, 3), "rc": rc}}
        atomic_write_text(run_dir / "error.html", error_page(
            run_id=task["run_id"], params=task["params"], error=error, sweep=task.get("sweep"),
            notebook=task["notebook"], links={"runner.log": "runner.log", "index": "../index.html"}))
        atomic_write_json(run_dir / "summary.json", summary)
    return {**out, "status": summary["status"], "summary": summary}


def _terminate_all(grace_s: float = 10.0) -> None:
    with _PROCS_LOCK:
        procs = list(_PROCS.values())
    for p in procs:
        with contextlib.suppress(OSError):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()


@dataclass(frozen=True)
class RunOutcome:
    """One run of a sweep. ``status``: ok (executed now), skipped (complete from before), failed,
    interrupted (stopped by the user), not_run (never started because the sweep was interrupted)."""

    run_id: str
    params: dict
    params_hash: str
    status: str
    run_dir: Path
    wall_s: float | None = None
    error: str | None = None
    metrics: dict = field(default_factory=dict)

    @property
    def report_html(self) -> Path | None:
        p = self.run_dir / "report.html"
        return p if self.status in ("ok", "skipped") and p.exists() else None

    @property
    def error_html(self) -> Path | None:
        p = self.run_dir / "error.html"
        return p if self.status == "failed" and p.exists() else None


@dataclass(frozen=True)
class SweepResult:
    """What :func:`run_sweep` did. ``exit_code``: 0 every run ok or skipped, 1 some run failed (or was
    stopped by something other than the user), 130 the sweep was interrupted."""

    sweep_name: str
    sweep_dir: Path
    index_html: Path
    index_json: Path
    runs: tuple
    interrupted: bool = False
    wall_s: float = 0.0

    def _count(self, status: str) -> int:
        return sum(r.status == status for r in self.runs)

    @property
    def n_ok(self) -> int:
        return self._count("ok")

    @property
    def n_skipped(self) -> int:
        return self._count("skipped")

    @property
    def n_failed(self) -> int:
        return self._count("failed")

    @property
    def executed(self) -> list[RunOutcome]:
        return [r for r in self.runs if r.status in ("ok", "failed")]

    @property
    def failed(self) -> list[RunOutcome]:
        return [r for r in self.runs if r.status == "failed"]

    @property
    def n_incomplete(self) -> int:
        """Runs stopped (interrupted) or never started (not_run)."""
        return self._count("interrupted") + self._count("not_run")

    @property
    def ok(self) -> bool:
        return not self.interrupted and self.n_failed == 0 and self.n_incomplete == 0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if (self.n_failed or self.n_incomplete) else 0


def _resolve_grid(grid) -> tuple[list[dict], list[str], dict]:
    """Grid | mapping name → values | list of param dicts → (param sets, swept names, grid record)."""
    if isinstance(grid, Grid):
        return grid.expand(), grid.swept, grid.to_dict()
    if isinstance(grid, Mapping):
        g = Grid(axes={k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in grid.items()})
        return g.expand(), g.swept, g.to_dict()
    runs = [dict(p) for p in grid]
    if not runs:
        raise ConfigError("grid", "no parameter sets")
    for p in runs:
        for k in p:
            _check_name(k, "grid")
    keys: list[str] = []
    for p in runs:
        keys.extend(k for k in p if k not in keys)
    if len(runs) == 1:
        swept = keys
    else:
        swept = [k for k in keys if len({json.dumps(to_jsonable(p.get(k)), sort_keys=True) for p in runs}) > 1]
    return runs, swept, {"name": None, "runs": to_jsonable(runs)}


def _check_notebook_params(notebook: Path, names: Iterable[str]) -> None:
    import papermill as pm
    declared = pm.inspect_notebook(str(notebook))
    if not declared:           # no parameters cell: papermill injects at the top, nothing to check
        return
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise ConfigError(unknown[0], f"not a parameter of {notebook.name} (its parameters cell declares "
                                      f"{', '.join(sorted(declared))}); pass strict_params=False / "
                                      "--allow-unknown-params to inject it anyway")


def _outcome_from_disk(run: dict, status: str, wall_s: float | None, returned: dict | None) -> RunOutcome:
    summary = None
    with contextlib.suppress(IncompleteSummaryError):
        summary = read_summary(run["run_dir"], params_hash=run["params_hash"], require_ok=False)
    if summary is None and returned:
        summary = returned.get("summary")
    err = None
    if summary and summary.get("status") == "failed":
        e = summary.get("error") or {}
        err = f"{e.get('ename', 'Error')}: {e.get('evalue', '')}"
    return RunOutcome(run_id=run["run_id"], params=run["params"], params_hash=run["params_hash"], status=status,
                      run_dir=Path(run["run_dir"]), wall_s=wall_s, error=err,
                      metrics=dict((summary or {}).get("metrics") or {}))


def run_sweep(notebook, grid, *, sweep_name: str | None = None, out_root="reports", workers: int = 1,
              cluster=None, resume: bool = True, timeout_per_cell: float | None = 1800,
              kernel_name: str = "python3", progress: bool = True, start_timeout: float = 120,
              strict_params: bool = True, require_summary: bool = True) -> SweepResult:
    """Execute ``notebook`` once per parameter set of ``grid`` (a :class:`Grid`, a mapping name → list
    of values, or a list of parameter dicts) into ``out_root/<sweep_name>/<run-id>/`` and write the
    sweep's ``index.html``/``index.json``. See the module docstring for the layout and guarantees.

    ``workers`` bounds concurrent local runs (each is a process with its own kernel); ``cluster`` (a
    Dask scheduler address like ``"tcp://host:8786"``, a ``distributed.Client`` or a cluster object)
    sends each run to Dask instead. ``resume`` skips complete runs. ``timeout_per_cell`` (seconds, None
    = no limit) is papermill's per-cell execution timeout. ``strict_params`` refuses grid names the
    notebook's parameters cell does not declare. A KeyboardInterrupt stops the sweep cleanly (finished
    runs are kept, running ones are stopped) and returns ``interrupted=True``."""
    t_start = time.perf_counter()
    notebook = Path(notebook).expanduser().resolve()
    if not notebook.is_file():
        raise SweepError(f"notebook not found: {notebook}")
    param_sets, swept, grid_record = _resolve_grid(grid)
    if sweep_name is None:
        sweep_name = (grid.name if isinstance(grid, Grid) and grid.name else
                      notebook.stem + ("__" + "-".join(swept) if swept else ""))
    sweep_dir = Path(out_root).expanduser().resolve() / _sweep_dir_name(sweep_name)
    if strict_params:
        _check_notebook_params(notebook, {k for p in param_sets for k in p})
    if workers < 1:
        raise ConfigError("workers", "must be >= 1")

    runs: list[dict] = []
    seen: dict[str, dict] = {}
    for params in param_sets:
        rid = run_id(params, swept)
        h = params_hash(params)
        if rid in seen:
            raise SweepError(f"two parameter sets map to run id {rid!r}: {seen[rid]} and {params}")
        seen[rid] = params
        runs.append({"run_id": rid, "params": to_jsonable(params), "params_hash": h,
                     "run_dir": str(sweep_dir / rid)})
    sweep_dir.mkdir(parents=True, exist_ok=True)

    threads = max(1, (os.cpu_count() or 1) // workers) if cluster is None else None
    thread_env = {} if threads is None else {v: threads for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                                   "OPENBLAS_NUM_THREADS")}
    tasks = {r["run_id"]: {**r, "notebook": str(notebook), "sweep": sweep_dir.name, "kernel_name": kernel_name,
                           "timeout_per_cell": timeout_per_cell, "start_timeout": start_timeout,
                           "resume": resume, "require_summary": require_summary, "env": thread_env}
             for r in runs}

    outcomes: dict[str, RunOutcome] = {}
    todo = []
    for r in runs:
        if resume and is_complete(r["run_dir"], r["params_hash"]):
            outcomes[r["run_id"]] = _outcome_from_disk(r, "skipped", None, None)
        else:
            todo.append(r)

    def _index():
        write_index(sweep_dir, current=runs, grid=grid_record, notebook=notebook)

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(runs), initial=len(outcomes), desc=sweep_dir.name, unit="run", file=sys.stderr,
                   dynamic_ncols=True)
        bar.set_postfix(ok=0, failed=0, skipped=len(outcomes))

    def _done(run: dict, returned: dict):
        status = returned.get("status", "failed")
        if status == "skipped":
            outcome = _outcome_from_disk(run, "skipped", returned.get("wall_s"), returned)
        else:
            outcome = _outcome_from_disk(run, status, returned.get("wall_s"), returned)
        outcomes[run["run_id"]] = outcome
        if status in ("ok", "failed", "skipped"):
            _index()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(ok=sum(o.status == "ok" for o in outcomes.values()),
                            failed=sum(o.status == "failed" for o in outcomes.values()),
                            skipped=sum(o.status == "skipped" for o in outcomes.values()))
            if status == "failed":
                bar.write(f"FAILED {run['run_id']}: {outcome.error}  -> {Path(run['run_dir']) / 'error.html'}",
                          file=sys.stderr)

    interrupted = False
    _index()
    try:
        if todo:
            if cluster is None:
                interrupted = _run_local(todo, tasks, workers, _done)
            else:
                interrupted = _run_dask(todo, tasks, cluster, _done)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    for r in runs:
        if r["run_id"] not in outcomes:
            outcomes[r["run_id"]] = _outcome_from_disk(r, "not_run", None, None)
    _index()
    return SweepResult(sweep_name=sweep_dir.name, sweep_dir=sweep_dir, index_html=sweep_dir / "index.html",
                       index_json=sweep_dir / "index.json", runs=tuple(outcomes[r["run_id"]] for r in runs),
                       interrupted=interrupted, wall_s=round(time.perf_counter() - t_start, 3))


def _run_local(todo: list[dict], tasks: dict, workers: int, done) -> bool:
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    _CANCEL.clear()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rookworld-report")
    futures = {pool.submit(run_task_subprocess, tasks[r["run_id"]]): r for r in todo}
    pending = set(futures)
    try:
        while pending:
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in finished:
                run = futures[fut]
                try:
                    returned = fut.result()
                except Exception as exc:  # noqa: BLE001 - a driver bug must not sink the other runs
                    returned = {"status": "failed", "error": repr(exc)}
                done(run, returned)
        return False
    except KeyboardInterrupt:
        _CANCEL.set()
        for fut in pending:
            fut.cancel()
        _terminate_all()
        return True
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _CANCEL.clear()


def _run_dask(todo: list[dict], tasks: dict, cluster, done) -> bool:
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover
        raise SweepError("cluster= needs dask[distributed] (pip install 'rookworld-debug[cluster]')") from exc
    own_client = False
    if isinstance(cluster, distributed.Client):
        client = cluster
    else:
        try:
            client = distributed.Client(cluster if isinstance(cluster, str) else cluster, timeout="30s")
        except Exception as exc:  # noqa: BLE001
            raise SweepError(f"cannot reach the Dask scheduler at {cluster!r}: {exc}") from exc
        own_client = True
    import uuid
    token = uuid.uuid4().hex[:8]
    futures = {}
    try:
        for r in todo:
            fut = client.submit(run_task_subprocess, tasks[r["run_id"]], pure=False,
                                key=f"rookworld-report-{r['run_id']}-{token}")
            futures[fut] = r
        try:
            for fut in distributed.as_completed(list(futures)):
                run = futures[fut]
                try:
                    returned = fut.result()
                except Exception as exc:  # noqa: BLE001 - task errored on the worker
                    returned = {"status": "failed", "error": repr(exc)}
                done(run, returned)
        except KeyboardInterrupt:
            client.cancel(list(futures))
            return True
        return False
    finally:
        if own_client:
            client.close()


# ----------------------------------------------------------------------------------------------------
# the sweep index
# ----------------------------------------------------------------------------------------------------

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not (isinstance(v, float) and not math.isfinite(v))


def _nonfinite(v: Any) -> bool:
    return v in ("NaN", "Infinity", "-Infinity") or (isinstance(v, float) and not math.isfinite(v))


def build_index(sweep_dir, *, current: Sequence[Mapping] | None = None, grid: Mapping | None = None,
                notebook=None) -> dict:
    """The machine-readable index of a sweep folder: every run folder that has a params.json (those of
    ``current``, the sweep being run, first and in grid order; pending ones included), its status
    (ok / failed / incomplete / pending), parameters, flattened metrics and links."""
    sweep_dir = Path(sweep_dir)
    entries: list[dict] = []
    listed: set[str] = set()
    nb_sha = _sha256_file(Path(notebook)) if notebook else None

    def entry(rid: str, params: Mapping | None, phash: str | None, in_current: bool) -> dict:
        rdir = sweep_dir / rid
        e: dict[str, Any] = {"run_id": rid, "in_current_grid": in_current, "params": dict(params or {}),
                             "params_hash": phash, "status": "pending", "metrics": {}, "error": None,
                             "report_html": None, "error_html": None, "report_ipynb": None,
                             "duration_s": None, "notebook_sha256": None, "stale_notebook": False,
                             "warnings": []}
        try:
            s = read_summary(rdir, params_hash=phash, require_ok=False)
        except IncompleteSummaryError as exc:
            if (rdir / "params.json").exists():
                e["status"] = "incomplete"
                e["warnings"].append(exc.reason)
            return e
        files = s.get("files") or {}
        e.update(status=s["status"], params=s.get("params", e["params"]), params_hash=s.get("params_hash"),
                 metrics=_flatten_metrics(s.get("metrics")), notebook_sha256=s.get("notebook_sha256"),
                 duration_s=(s.get("runner") or {}).get("total_s"),
                 warnings=list((s.get("runner") or {}).get("warnings") or []))
        if s["status"] == "ok" and not (rdir / files.get("report_html", "report.html")).exists():
            e["status"] = "incomplete"
            e["warnings"].append("report.html missing")
        for key, name in (("report_html", "report.html"), ("error_html", "error.html"),
                          ("report_ipynb", "report.ipynb")):
            if (rdir / name).exists():
                e[key] = f"{rid}/{name}"
        if s["status"] == "failed":
            err = s.get("error") or {}
            e["error"] = {"ename": err.get("ename"), "evalue": err.get("evalue"),
                          "cell_index": err.get("cell_index")}
        if nb_sha and e["notebook_sha256"] and e["notebook_sha256"] != nb_sha:
            e["stale_notebook"] = True
        return e

    for r in current or ():
        entries.append(entry(r["run_id"], r["params"], r["params_hash"], True))
        listed.add(r["run_id"])
    if sweep_dir.is_dir():
        for sub in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name not in listed):
            pj = sub / "params.json"
            if not pj.exists():
                continue
            try:
                meta = json.loads(pj.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            entries.append(entry(sub.name, meta.get("params"), meta.get("params_hash"), False))

    param_keys: list[str] = []
    for e in entries:
        param_keys.extend(k for k in e["params"] if k not in param_keys)
    swept = [k for k in param_keys
             if len({json.dumps(e["params"].get(k), sort_keys=True) for e in entries}) > 1]
    metric_keys: list[str] = []
    for e in entries:
        metric_keys.extend(k for k, v in e["metrics"].items()
                           if k not in metric_keys and (_is_number(v) or _nonfinite(v)))
    counts = {s: sum(e["status"] == s for e in entries) for s in ("ok", "failed", "incomplete", "pending")}
    return {"schema": INDEX_SCHEMA, "sweep": sweep_dir.name, "sweep_dir": str(sweep_dir),
            "notebook": None if notebook is None else str(notebook), "notebook_sha256": nb_sha,
            "generated_at": _now(), "grid": to_jsonable(grid or {}), "swept": swept, "param_keys": param_keys,
            "metric_keys": metric_keys, "counts": {**counts, "total": len(entries)}, "runs": to_jsonable(entries)}


def _fmt_cell(v: Any) -> str:
    if _nonfinite(v):
        return f"<span class='flag'>{html.escape(str(v))}</span>"
    if isinstance(v, float):
        return f"{v:.6g}"
    return html.escape(_fmt_value(v))


def _metric_figures(index: dict) -> list[str]:
    """One plotly figure per swept parameter: a subplot per numeric metric against it, one line per
    combination of the other swept parameters (ok runs only)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = [e for e in index["runs"] if e["status"] == "ok"]
    metrics = [m for m in index["metric_keys"] if any(_is_number(e["metrics"].get(m)) for e in ok)]
    if not ok or not metrics or not index["swept"]:
        return []
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
    divs = []
    for p in index["swept"]:
        others = [q for q in index["swept"] if q != p]
        xs_all = [e["params"].get(p) for e in ok]
        numeric_x = all(_is_number(x) and not isinstance(x, bool) for x in xs_all)
        groups: dict[str, list] = {}
        for e in ok:
            label = ", ".join(f"{q}={_fmt_value(e['params'].get(q))}" for q in others) or p
            groups.setdefault(label, []).append(e)
        cols = min(3, len(metrics))
        rows = math.ceil(len(metrics) / cols)
        fig = make_subplots(rows=rows, cols=cols, subplot_titles=metrics,
                            vertical_spacing=min(0.12, 0.5 / max(rows - 1, 1)) if rows > 1 else 0.1,
                            horizontal_spacing=0.08)
        for gi, (label, members) in enumerate(groups.items()):
            members = sorted(members, key=lambda e: (e["params"].get(p) if numeric_x
                                                     else _fmt_value(e["params"].get(p))))
            color = palette[gi % len(palette)]
            for mi, m in enumerate(metrics):
                pts = [(e["params"].get(p), e["metrics"].get(m), e["run_id"]) for e in members]
                pts = [(x, float(y), rid) for x, y, rid in pts if _is_number(y)]
                if not pts:
                    continue
                fig.add_trace(go.Scatter(
                    x=[x if numeric_x else _fmt_value(x) for x, _, _ in pts], y=[y for _, y, _ in pts],
                    text=[rid for _, _, rid in pts], mode="lines+markers", name=label, legendgroup=label,
                    showlegend=(mi == 0), line={"color": color}, marker={"color": color},
                    hovertemplate=f"{p}=%{{x}}<br>{m}=%{{y}}<br>%{{text}}<extra>{html.escape(label)}</extra>"),
                    row=mi // cols + 1, col=mi % cols + 1)
        fig.update_xaxes(title_text=p, type=None if numeric_x else "category")
        fig.update_layout(height=max(320, 260 * rows), title=f"headline metrics vs {p}",
                          margin={"l": 50, "r": 20, "t": 70, "b": 40}, legend={"title": " / ".join(others)})
        divs.append(fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                                config={"displaylogo": False, "responsive": True}))
    return divs


_SORT_JS = """
document.querySelectorAll('table.runs th').forEach(function(th, col){th.addEventListener('click', function(){
 var tb=th.closest('table').tBodies[0], rows=Array.from(tb.rows), asc=th.dataset.asc!=='1'; th.dataset.asc=asc?'1':'0';
 rows.sort(function(a,b){var x=a.cells[col].dataset.v??a.cells[col].innerText, y=b.cells[col].dataset.v??b.cells[col].innerText;
  var nx=parseFloat(x), ny=parseFloat(y); var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));
  return asc?c:-c;}); rows.forEach(function(r){tb.appendChild(r);});});});
"""


def _index_html(index: dict) -> str:
    esc = html.escape
    swept, metrics = index["swept"], index["metric_keys"]
    other_params = [k for k in index["param_keys"] if k not in swept]
    head = ["run", "status", *swept, *metrics, "time (s)", "links"]
    body_rows = []
    for e in index["runs"]:
        status = e["status"]
        cells = [f"<td><code>{esc(e['run_id'])}</code>{'' if e['in_current_grid'] else ' <span class=muted>(earlier grid)</span>'}</td>"]
        note = ""
        if e.get("error"):
            note = (f"<br><span class='flag'>{esc(str(e['error'].get('ename')))}: "
                    f"{esc(str(e['error'].get('evalue'))[:200])}</span>")
        if e.get("stale_notebook"):
            note += "<br><span class='muted'>notebook changed since this run</span>"
        for w in e.get("warnings") or []:
            note += f"<br><span class='muted'>{esc(str(w))}</span>"
        cells.append(f"<td data-v='{esc(status)}'><span class='badge {esc(status)}'>{esc(status)}</span>{note}</td>")
        for k in swept:
            v = e["params"].get(k)
            cells.append(f"<td class='num' data-v='{esc(_fmt_value(v))}'>{_fmt_cell(v)}</td>")
        for m in metrics:
            v = e["metrics"].get(m)
            dv = esc(str(v)) if _is_number(v) else ""
            cells.append(f"<td class='num' data-v='{dv}'>{'' if v is None else _fmt_cell(v)}</td>")
        d = e.get("duration_s")
        cells.append(f"<td class='num'>{'' if d is None else f'{d:.1f}'}</td>")
        links = []
        if e.get("report_html") and status == "ok":
            links.append(f"<a href='{esc(e['report_html'])}'>report</a>")
        if e.get("error_html"):
            links.append(f"<a href='{esc(e['error_html'])}'>error</a>")
        if e.get("report_ipynb"):
            links.append(f"<a href='{esc(e['report_ipynb'])}'>ipynb</a>")
        cells.append(f"<td>{' · '.join(links)}</td>")
        body_rows.append(f"<tr class='{esc(status)}'>{''.join(cells)}</tr>")
    c = index["counts"]
    fixed_html = ""
    if other_params and index["runs"]:
        first = index["runs"][0]["params"]
        fixed_html = ("<p class='muted'>same in every run: " +
                      ", ".join(f"<code>{esc(k)}={esc(_fmt_value(first.get(k)))}</code>" for k in other_params)
                      + "</p>")
    figures = _metric_figures(index)
    plots = "".join(f"<div class='fig'>{d}</div>" for d in figures) or \
        "<p class='muted'>No plots: needs ok runs, numeric metrics and at least one parameter that varies.</p>"
    plotly_js = ""
    if figures:
        from plotly.offline import get_plotlyjs
        plotly_js = f"<script type='text/javascript'>{get_plotlyjs()}</script>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>sweep {esc(index['sweep'])}</title>
<style>{_PAGE_CSS}</style>{plotly_js}</head><body>
<h1>Sweep <code>{esc(index['sweep'])}</code></h1>
<p class="muted">notebook <code>{esc(str(index.get('notebook') or ''))}</code> · generated {esc(index['generated_at'])} ·
{c['total']} runs: <span class="badge ok">{c['ok']} ok</span> <span class="badge failed">{c['failed']} failed</span>
<span class="badge incomplete">{c['incomplete'] + c['pending']} incomplete/pending</span> ·
<a href="index.json">index.json</a></p>
{fixed_html}
<h2>Runs</h2>
<table class="runs"><thead><tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr></thead>
<tbody>{''.join(body_rows)}</tbody></table>
<p class="muted">Metrics are the numeric values under <code>summary["metrics"]</code> of each run; click a column to sort.</p>
<h2>Metrics vs parameters</h2>
{plots}
<script>{_SORT_JS}</script>
</body></html>
"""


def write_index(sweep_dir, *, current: Sequence[Mapping] | None = None, grid: Mapping | None = None,
                notebook=None) -> dict:
    """Build the index (see :func:`build_index`) and write index.json and index.html atomically."""
    index = build_index(sweep_dir, current=current, grid=grid, notebook=notebook)
    atomic_write_json(Path(sweep_dir) / "index.json", index)
    atomic_write_text(Path(sweep_dir) / "index.html", _index_html(index))
    return index


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(sys.argv[2]))
    sys.stderr.write("usage: python -m rookworld_debug.report --worker TASK.json "
                     "(sweeps: rookworld-debug report ... / python -m rookworld_debug.report_cli)\n")
    sys.exit(2)
