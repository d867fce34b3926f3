"""The layers hold (import-linter's contract in pyproject.toml, function-level imports included) and
no module imports itself back through others (no import circle in the package)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contract_is_kept():
    import importlinter  # noqa: F401 - a machine without it reports the test as needing it
    exe = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(exe)], cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def _cycles(adj: dict) -> list:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in adj:
        if root in index:
            continue
        work = [(root, iter(sorted(adj[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(adj[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle():
    import grimp
    g = grimp.build_graph("rookworld_debug")
    adj = {m: set(g.find_modules_directly_imported_by(m)) - {m} for m in g.modules}
    assert _cycles(adj) == []
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]      # the check can fail


def test_the_layers_picture_in_developing_md_is_made_from_the_current_imports():
    import importlib.util
    spec = importlib.util.spec_from_file_location("layers_graph", REPO / "scripts" / "layers_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (REPO / "docs" / "DEVELOPING.md").read_text()
    block = doc[doc.index(mod.BEGIN) + len(mod.BEGIN):doc.index(mod.END)].strip()
    assert block == mod.mermaid(mod.graph_edges()), "run: .venv/bin/python scripts/layers_graph.py --write"


def test_the_benchmark_tables_are_what_their_results_files_render():
    """docs/BENCHMARKS.md is generated from docs/bench/*.jsonl; a results file changed without regenerating it (or
    a table edited by hand) fails here, as a user would see it from the command."""
    r = subprocess.run([sys.executable, "scripts/diagnosis_tables.py", "--check"], cwd=REPO, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    page = (REPO / "docs" / "BENCHMARKS.md").read_text()
    for line in (REPO / "docs" / "bench" / "replay_heldout_frozen_fits.jsonl").read_text().splitlines()[:3]:
        assert json.loads(line)["fault"] in page
