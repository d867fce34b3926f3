"""The declared public API: every name in a public module's `__all__` imports; every `from rookworld_debug… import …`
written in the README, the docs and the notebooks imports; the modules that moved import from their old paths with a
DeprecationWarning naming the new one."""
from __future__ import annotations

import ast
import importlib
import json
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("rookworld_debug", "rookworld_debug.record", "rookworld_debug.diagnosis", "rookworld_debug.diagnosis.replay",
          "rookworld_debug.trl", "rookworld_debug.whatif", "rookworld_debug.report", "rookworld_debug.viz",
          "rookworld_debug.widgets", "rookworld_debug.grpo.families", "rookworld_debug.config",
          "rookworld_debug.errors", "rookworld_debug.grpo.step", "rookworld_debug.models", "rookworld_debug.notebook",
          "rookworld_debug.grpo.registry", "rookworld_debug.settings")


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_imports(module):
    mod = importlib.import_module(module)
    assert mod.__all__, module
    missing = [n for n in mod.__all__ if getattr(mod, n, None) is None and n != "__version__"]
    assert not missing, (module, missing)


def _code_blocks() -> list[tuple[str, str]]:
    """(where, code) of every python block in README.md and docs/*.md, and every code cell of the notebooks."""
    out = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", md.read_text(), re.S)):
            out.append((f"{md.name} block {i}", block))
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                out.append((f"{nb.name} cell {i}", "".join(cell["source"])))
    return out


def _documented_imports() -> dict:
    """{(module, name or None): where} of every rookworld_debug import in the documentation's code."""
    found = {}
    for where, code in _code_blocks():
        try:
            tree = ast.parse(code)
        except SyntaxError:                      # a notebook's shell line or magic: its imports read line by line
            tree = ast.parse("\n".join(x for x in code.splitlines() if re.match(r"\s*(from|import) rookworld", x)
                                       and not x.rstrip().endswith(("(", "\\"))))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rookworld_debug"):
                for a in node.names:
                    found.setdefault((node.module, a.name), where)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("rookworld_debug"):
                        found.setdefault((a.name, None), where)
    return found


def test_the_documentation_imports_something():
    found = _documented_imports()
    assert len(found) >= 20 and ("rookworld_debug", "run_step") in found, sorted(found)[:10]


def test_every_documented_import_works():
    bad = []
    for (module, name), where in sorted(_documented_imports().items(), key=str):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)        # docs never use a moved path
                mod = importlib.import_module(module)
                if name is not None and not hasattr(mod, name):
                    importlib.import_module(f"{module}.{name}")
        except Exception as err:  # noqa: BLE001 - every failure is listed
            bad.append(f"{where}: from {module} import {name}: {type(err).__name__}: {err}")
    assert not bad, bad


@pytest.mark.parametrize("old,new", [("rookworld_debug.grpo.loss", "rookworld_debug.grpo.objective.loss"),
                                     ("rookworld_debug.grpo.advantages", "rookworld_debug.grpo.phases.advantages"),
                                     ("rookworld_debug.grpo.diagnostics", "rookworld_debug.grpo.signal.noise"),
                                     ("rookworld_debug.grpo.start", "rookworld_debug.grpo.multistep.start"),
                                     ("rookworld_debug.grpo.serialize", "rookworld_debug.grpo.trace.serialize")])
def test_a_moved_module_imports_from_its_old_path_with_a_warning(old, new):
    import sys
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=re.escape(new)):
        mod = importlib.import_module(old)
    assert mod is importlib.import_module(new)


def test_the_old_phases_and_multistep_names_resolve_with_a_warning():
    from rookworld_debug.grpo.multistep.loop import run_steps
    from rookworld_debug.grpo.phases.shared import sample_and_score
    with pytest.warns(DeprecationWarning, match="phases.shared.sample_and_score"):
        from rookworld_debug.grpo.phases import sample_and_score as old_sample
    with pytest.warns(DeprecationWarning, match="multistep.loop.run_steps"):
        from rookworld_debug.grpo.multistep import run_steps as old_run
    assert old_sample is sample_and_score and old_run is run_steps
    with pytest.raises(ImportError):
        from rookworld_debug.grpo.phases import no_such_name  # noqa: F401


def test_no_namespace_stands_in_for_a_record():
    """Views take the records the trace holds (a record change is caught by its type, not at render time)."""
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "rookworld_debug").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "SimpleNamespace" in line]
    assert not hits, hits
