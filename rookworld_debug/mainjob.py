"""The README's main job on the embedded default. Until the GRPO step report exists this is the
smoke check (data + engine + model load)."""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from rookworld_debug.cli import main as cli_main
    return cli_main(["smoke", *(argv or [])])
