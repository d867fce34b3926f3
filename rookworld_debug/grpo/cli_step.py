"""`rookworld-debug step`: run ONE GRPO step, print the phase-by-phase log, write the trace."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_value(text: str):
    """'0.1' → 0.1, 'true' → True, 'none' → None, '[1,2]' → [1, 2], else the string."""
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return json.loads(text)
    except ValueError:
        return text


def config_from_args(config_path: str | None, overrides: list[str]):
    """A StepConfig from an optional YAML/JSON file plus `key=value` overrides (names are the fields)."""
    from rookworld_debug.config import StepConfig
    d: dict = {}
    if config_path:
        text = Path(config_path).read_text()
        if config_path.endswith((".yaml", ".yml")):
            import yaml
            d = yaml.safe_load(text) or {}
        else:
            d = json.loads(text)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        d[key.strip()] = parse_value(value)
    return StepConfig.from_dict(d)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rookworld-debug step", description=__doc__)
    p.add_argument("--config", help="YAML or JSON file with StepConfig fields")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one StepConfig field (repeatable), e.g. --set beta=0.05")
    p.add_argument("--out", default="reports/step", help="folder for trace.json + trace.safetensors")
    args = p.parse_args(argv)
    from rookworld_debug.errors import RookWorldError
    from rookworld_debug.grpo.step import run_step
    from rookworld_debug.steplog import format_step_log
    try:
        config = config_from_args(args.config, args.overrides)
        trace = run_step(config)
    except RookWorldError as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    print(format_step_log(trace))
    path = trace.save(args.out)
    print(f"trace written to {path}/trace.json (+ trace.safetensors)")
    return 0 if trace.update is not None else 1


if __name__ == "__main__":
    sys.exit(main())
