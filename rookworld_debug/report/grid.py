"""Parameter grids: ``name=v1,v2`` specs and YAML grid files → expanded runs, and stable run ids."""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld_debug.errors import ConfigError
from rookworld_debug.report.store import RESERVED_PARAMS, to_jsonable


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
