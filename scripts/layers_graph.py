"""Draw the package's layers from its real imports (grimp): a Mermaid graph of sub-package → sub-package arrows.

    .venv/bin/python scripts/layers_graph.py            # prints the Mermaid block docs/DEVELOPING.md embeds
    .venv/bin/python scripts/layers_graph.py --write    # rewrites that block in docs/DEVELOPING.md

Function-level imports count (grimp reads every import statement). Arrows point from the importer to what it
imports, so every arrow should point down the layer list of pyproject.toml's import-linter contract.
"""
from __future__ import annotations

import sys
from pathlib import Path

import grimp

DOC = Path(__file__).resolve().parents[1] / "docs" / "DEVELOPING.md"
BEGIN, END = "<!-- layers-graph:begin -->", "<!-- layers-graph:end -->"


def node(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def graph_edges() -> dict:
    g = grimp.build_graph("rookworld_debug")
    edges: dict = {}
    for m in g.modules:
        for dep in g.find_modules_directly_imported_by(m):
            a, b = node(m), node(dep)
            if a != b and b != "rookworld_debug":
                edges[(a, b)] = edges.get((a, b), 0) + 1
    return edges


def mermaid(edges: dict) -> str:
    short = lambda n: n.replace("rookworld_debug.", "")  # noqa: E731
    lines = ["```mermaid", "graph TD"]
    for (a, b), n in sorted(edges.items()):
        lines.append(f"  {short(a).replace('.', '_')}[{short(a)}] -->|{n}| {short(b).replace('.', '_')}[{short(b)}]")
    lines.append("```")
    return "\n".join(lines)


def main() -> int:
    block = mermaid(graph_edges())
    if "--write" not in sys.argv:
        print(block)
        return 0
    text = DOC.read_text()
    new = f"{BEGIN}\n{block}\n{END}"
    text = text[:text.index(BEGIN)] + new + text[text.index(END) + len(END):] if BEGIN in text else text + "\n" + new + "\n"
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
