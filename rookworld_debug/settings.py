"""Settings: the typed, documented knobs of a `StepConfig`, and the sections objective families add to it.

The core declares its knobs as `StepConfig` fields. Each objective family declares its own knobs as a *section*:
a frozen dataclass made with `@section(name)` and registered with the family (`grpo.families.register`). A
config stays flat on the outside: `StepConfig(rlvr_kl_type="reverse")`, `--set rlvr_kl_type=reverse` and a
papermill parameter of that name all reach the mini's section.

Shared by both: `setting` (a field with its help text), `Rule` (a value rule naming its field), `check` (type
normalisation, then the rules: the first broken one raises ConfigError), and the registry of sections and loss
types the config accepts. The built-in families register themselves on first use (`when_first_used`: the
package's root module hands this module the function that imports them).
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Optional, Union

from rookworld_debug.errors import ConfigError

__all__ = ["section", "setting", "Rule", "optional", "sections", "loss_types"]


def setting(default: Any, help: str, *, choices: Optional[tuple] = None, group: str = "", factory=None,
            rollout: bool = False):
    """A documented field. `rollout=True`: it shapes the rollout a step trains on (a one-step counterfactual,
    which reuses the recorded rollout, cannot change it)."""
    md = {"help": help, "group": group, "rollout": rollout}
    if choices is not None:
        md["choices"] = choices
    if factory is not None:
        return field(default_factory=factory, metadata=md)
    return field(default=default, metadata=md)


class Rule(NamedTuple):
    """One value rule: `ok(obj)` must hold, else ConfigError(field, message + " (got value)") (`show_value=False`:
    the message alone); `message` may be a function of the object."""
    field: str
    ok: Callable[[Any], bool]
    message: Union[str, Callable[[Any], str]]
    show_value: bool = True


def optional(name: str, pred: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A rule on an Optional field: None passes."""
    return lambda c: getattr(c, name) is None or pred(getattr(c, name))


# ---------------------------------------------------------------- type normalisation
def _kinds(cls) -> dict:
    """Each kind of field by its annotation: float, int, bool, the non-optional free strings, the tuples of names
    (default ()), the other tuples, and the optional ones (None allowed)."""
    hints = typing.get_type_hints(cls)
    kinds: dict = {"float": [], "int": [], "bool": [], "str": [], "names": [], "tuple": [], "optional": set()}
    for f in dataclasses.fields(cls):
        if not f.init or "help" not in f.metadata:
            continue
        args = typing.get_args(hints[f.name])
        opt = type(None) in args
        t = next((a for a in args if a is not type(None)), hints[f.name]) if opt else hints[f.name]
        if opt:
            kinds["optional"].add(f.name)
        if t in (float, int, bool):
            kinds[t.__name__].append(f.name)
        elif t is str and not opt and "choices" not in f.metadata:
            kinds["str"].append(f.name)
        elif t is tuple:
            kinds["names" if f.default == () else "tuple"].append(f.name)
    return kinds


_KINDS: dict = {}


def _kinds_of(cls) -> dict:
    """`_kinds(cls)`, read once per class."""
    if cls not in _KINDS:
        _KINDS[cls] = _kinds(cls)
    return _KINDS[cls]


def _number(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(name, f"must be a number, got {v!r}")
    if isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63:
        raise ConfigError(name, f"must be finite, got an integer of {v.bit_length()} bits")
    if not math.isfinite(v):
        raise ConfigError(name, f"must be finite, got {v!r}")
    return float(v)


def _integer(name: str, v) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(name, f"must be an integer, got {v!r}")
    if not -2 ** 63 <= v < 2 ** 63:
        raise ConfigError(name, f"must be a 64-bit integer, got one of {v.bit_length()} bits")
    return v


def _names(name: str, v) -> tuple:
    """A tuple of names from a JSON list, the command line's "a,b" or None; ConfigError for anything else."""
    if v is None:
        return ()
    if isinstance(v, str):
        v = [x for x in v.split(",") if x]
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise ConfigError(name, f"must be a list of names, got {v!r}")
    return tuple(v)


def _normalise(obj, choices: Mapping[str, tuple]) -> None:
    """Papermill/JSON shapes (lists → tuples, ints → floats), then the type of every number, bool, string and
    choice field."""
    cls = type(obj)
    kinds = _kinds_of(cls)
    s = object.__setattr__
    for name in kinds["names"]:
        s(obj, name, _names(name, getattr(obj, name)))
    for name in kinds["tuple"]:
        if isinstance(getattr(obj, name), list):
            s(obj, name, tuple(getattr(obj, name)))
    for kind, fix in (("float", _number), ("int", _integer)):
        for name in kinds[kind]:
            v = getattr(obj, name)
            if not (v is None and name in kinds["optional"]):
                s(obj, name, fix(name, v))
    for name in kinds["bool"]:
        if not isinstance(getattr(obj, name), bool):
            raise ConfigError(name, f"must be True or False, got {getattr(obj, name)!r}")
    for name in kinds["str"]:
        v = getattr(obj, name)
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(name, f"must be a non-empty string, got {v!r}")
    for name, allowed in choices.items():
        if getattr(obj, name) not in allowed:
            raise ConfigError(name, f"unknown value {getattr(obj, name)!r}; expected one of {list(allowed)}")


def optional_fields(cls) -> set:
    """The fields of `cls` that accept None."""
    return _kinds_of(cls)["optional"]


def check(obj, rules: tuple = (), choices: Optional[Mapping[str, tuple]] = None) -> None:
    """Normalise `obj`'s fields in place (it is frozen: the normalised value is what was meant), then apply `rules`
    in order: the first one a value breaks raises ConfigError(field, message). `choices`: allowed values known only
    at run time (beside each field's own)."""
    own = {f.name: f.metadata["choices"] for f in dataclasses.fields(obj) if "choices" in f.metadata}
    _normalise(obj, {**own, **(choices or {})})
    for rule in rules:
        try:
            ok = rule.ok(obj)
        except Exception as err:  # noqa: BLE001 - a family's rule that cannot read this value: named, not raised
            raise ConfigError(rule.field, f"its check could not read {getattr(obj, rule.field, None)!r} "
                                          f"({type(err).__name__}: {err})") from None
        if not ok:
            msg = rule.message(obj) if callable(rule.message) else rule.message
            raise ConfigError(rule.field, f"{msg} (got {getattr(obj, rule.field)!r})" if rule.show_value else msg)


# ---------------------------------------------------------------- sections
def section(name: str):
    """Class decorator: a frozen dataclass of one family's knobs, checked at construction (its `RULES`, a class
    attribute, after the type checks). `name` is its heading in `step --help` and the glossary's group."""
    def wrap(cls):
        for f in cls.__dict__.get("__annotations__", {}):
            md = getattr(cls, f, None)
            if isinstance(md, dataclasses.Field):
                md.metadata = type(md.metadata)({**md.metadata, "group": name})
        cls.SECTION = name
        cls.__post_init__ = lambda self: check(self, getattr(type(self), "RULES", ()))
        return dataclass(frozen=True)(cls)
    return wrap


_CORE: set = set()            # the core's settings (StepConfig's own fields): no section may declare one
_SECTIONS: dict = {}          # section name -> its dataclass, in registration order
_OWNER: dict = {}             # a section's field -> the section name
_LOSS_TYPES: dict = {}        # loss type -> its one-paragraph definition (the loss_type help)


def reserve(names) -> None:
    """The core's settings: a section that declares one of them is refused (StepConfig calls this)."""
    _CORE.update(names)


def _check_section(cls) -> list:
    """The names of a section's settings; ConfigError for a class that is not one, a field without its help, a
    name the core or another section has, or defaults its own rules refuse (every config would fail)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(getattr(cls, "SECTION", None), str)):
        raise ConfigError("register", f"settings must be a class made with @section, not {cls!r}")
    name = cls.SECTION
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", name):
        raise ConfigError("register", f"section name {name!r} is not a name (lower-case letters, digits, _)")
    names = [f.name for f in dataclasses.fields(cls)]
    bare = [f.name for f in dataclasses.fields(cls) if "help" not in f.metadata]
    clash = [n for n in names if n in _CORE or _OWNER.get(n, name) != name]
    if bare or clash:
        raise ConfigError("register", f"section {name!r}: " + (f"{bare} lack setting(default, help)" if bare
                                                               else f"{clash} already name other settings"))
    try:
        cls()
    except Exception as err:  # noqa: BLE001 - its defaults, refused by its own rules or missing
        raise ConfigError("register", f"section {name!r}: its defaults do not build ({err})") from None
    return names


def register(settings: Optional[type], loss_types: Mapping[str, str]) -> None:
    """Accept `loss_types` (each with its definition) and the section `settings` (None: the family has no knobs of
    its own); ConfigError names what is wrong with the section."""
    if settings is not None:
        names = _check_section(settings)
        for n in [n for n, sec in _OWNER.items() if sec == settings.SECTION]:     # registered again: its new names
            del _OWNER[n]
        _SECTIONS[settings.SECTION] = settings
        _OWNER.update(dict.fromkeys(names, settings.SECTION))
    _LOSS_TYPES.update(loss_types)


def family_sections(given: tuple, kw: dict, core: frozenset) -> tuple:
    """One instance of every registered section: `given`'s (a config's own) with the knobs of `kw` that are not
    `core` settings applied (they are popped from `kw`). ConfigError names a key no one declares."""
    changes: dict = {}
    for key in [k for k in kw if k not in core]:
        sec = owner(key)
        if sec is None:
            raise ConfigError(key, f"unknown config key {key!r}")
        changes.setdefault(sec, {})[key] = kw.pop(key)
    if not isinstance(given, tuple) or not all(isinstance(getattr(sec, "SECTION", None), str) and
                                               dataclasses.is_dataclass(sec) for sec in given):
        raise ConfigError("family_settings", f"must be a tuple of settings sections, got {given!r}"[:300])
    have = {sec.SECTION: sec for sec in given}
    out = []
    for cls in sections():
        base = have.get(cls.SECTION)
        if base is not None and type(base) is not cls:               # the section was registered again since
            names = {f.name for f in dataclasses.fields(cls)}
            base = cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name in names})
        new = changes.get(cls.SECTION)
        if base is None:
            base = cls(**(new or {}))
        elif new:                                   # unchanged: the config's own (already checked) section
            base = dataclasses.replace(base, **new)
        out.append(base)
    return tuple(out)


def sections() -> tuple:
    """Every registered section's class, in registration order (the built-in families loaded first)."""
    load_builtin()
    return tuple(_SECTIONS.values())


def owner(name: str) -> Optional[str]:
    """The section that declares the field `name` (None: a core field or no field)."""
    load_builtin()
    return _OWNER.get(name)


def loss_types() -> tuple:
    """Every loss type a registered objective family answers."""
    load_builtin()
    return tuple(_LOSS_TYPES)


def loss_type_help() -> str:
    """The definitions of the registered loss types, one sentence each."""
    load_builtin()
    return " ".join(f"'{lt}': {text}" for lt, text in _LOSS_TYPES.items() if text)


# ---------------------------------------------------------------- the glossary
def all_fields(core: type) -> list:
    """The documented fields of `core` (a StepConfig), each registered section's after the last objective one."""
    own = [f for f in dataclasses.fields(core) if "help" in f.metadata]
    out, families = [], [f for c in sections() for f in dataclasses.fields(c)]
    for i, f in enumerate(own):
        out.append(f)
        if f.metadata["group"] == "objective" and own[i + 1].metadata["group"] != "objective":
            out.extend(families)
    return out


def glossary(core: type) -> dict:
    """{setting: {"default", "group", "help", "nullable", "rollout", "choices"?}} for every setting of `core` and
    the sections, in declaration order; loss_type's help ends with each registered loss type's definition."""
    nullable = {n for c in (core, *sections()) for n in optional_fields(c)}
    out = {}
    for f in all_fields(core):
        md = f.metadata
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        out[f.name] = {"default": default, "group": md.get("group", ""), "help": md["help"],
                       "nullable": f.name in nullable, "rollout": md.get("rollout", False),
                       **({"choices": md["choices"]} if "choices" in md else {})}
    if "loss_type" in out:
        out["loss_type"] = {**out["loss_type"], "choices": loss_types(),
                            "help": f"{out['loss_type']['help']} {loss_type_help()}"}
    return out


def glossary_markdown(entries: dict) -> str:
    """A glossary as a Markdown table (field | default | meaning)."""
    rows = ["| field | default | meaning |", "| --- | --- | --- |"]
    for name, e in entries.items():
        choices = f" Choices: {', '.join(map(repr, e['choices']))}." if "choices" in e else ""
        rows.append(f"| `{name}` | `{e['default']!r}` | {e['help'].replace('|', '/')}{choices} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- the built-in families, loaded on first use
_LOADERS: list = []
_LOADED: list = []


def when_first_used(loader: Callable[[], None]) -> None:
    """Run `loader` (it imports the built-in families, which register themselves) before the registry is first
    read. The package's root module calls this: the families sit above the config, so it cannot import them."""
    _LOADERS.append(loader)


def load_builtin() -> None:
    """Register the built-in families, once (a read during their own import sees what is registered so far)."""
    while len(_LOADED) < len(_LOADERS):
        loader = _LOADERS[len(_LOADED)]
        _LOADED.append(loader)
        loader()
