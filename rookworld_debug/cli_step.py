"""`rookworld-debug step`: run ONE GRPO step, print the phase-by-phase log, write the trace.

Output: the phase-by-phase log goes to stdout; the trace to OUT/trace.json + OUT/trace.safetensors (reload
with `StepTrace.load(OUT)`, view with notebook 01 or `rookworld-debug report --trace OUT`). Errors go to
stderr as `rookworld-debug step: error: <NamedError>: …` with exit code 2 (bad paths are checked before
the step); exit code 1 when the update was refused (NaN/inf).

Examples:
  rookworld-debug step --set beta=0.05 --set reward_mode=dataset --out reports/step1
  rookworld-debug step --config my.yaml --set loss_type=grpo
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_FIRST_SENTENCE = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!vs)(?<!etc)\.(\s|$)")


def config_keys_help(width: int = 118) -> str:
    """Every StepConfig key, grouped, with its default and one line of help: the first sentence of the
    field's `metadata["help"]` (cut at a word boundary to fit `width`). Generated, so it never drifts."""
    from rookworld_debug.config import StepConfig
    lines = ["StepConfig keys: set with --set KEY=VALUE (repeatable) or --config FILE; shown as KEY=default.",
             "Full help text: python -c 'from rookworld_debug.config import StepConfig as C; "
             "print(C.glossary_markdown())'"]
    group = None
    for name, e in StepConfig.glossary().items():
        if e["group"] != group:
            group = e["group"]
            lines.append(f"  [{group}]")
        m = _FIRST_SENTENCE.search(e["help"])
        text = e["help"][:m.start() + 1] if m else e["help"]
        if "choices" in e:
            text = "{" + "|".join(map(str, e["choices"])) + "} " + text
        key = f"    {name}={e['default']!r}".ljust(38) + " "
        room = max(20, width - len(key))
        if len(text) > room:
            text = text[:room - 1].rsplit(" ", 1)[0] + "…"
        lines.append(key + text)
    return "\n".join(lines)


class KeysHelpParser(argparse.ArgumentParser):
    """A parser whose epilog is `config_keys_help()`, made only when help is printed: listing the keys imports
    the loss registry (and torch), which bad input and a normal run should not wait for before their first line."""

    def format_help(self) -> str:
        if self.epilog is None:
            self.epilog = config_keys_help()
        return super().format_help()


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
    choices = {k: e.get("choices") or () for k, e in StepConfig.glossary().items()}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        key = key.strip()
        # a documented choice spelled like a literal ('none' of scale_rewards) stays that choice
        d[key] = value.strip() if value.strip() in choices.get(key, ()) else parse_value(value)
    return StepConfig.from_dict(d)


def main(argv: list[str] | None = None) -> int:
    """`rookworld-debug step` (errors: one line, exit 2; see cli.run_guarded)."""
    from rookworld_debug.cli import run_guarded
    return run_guarded("step", _main, argv)


def _main(argv: list[str] | None = None) -> int:
    p = KeysHelpParser(prog="rookworld-debug step", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML or JSON file with StepConfig fields")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one StepConfig field (repeatable), e.g. --set beta=0.05")
    p.add_argument("--out", default="reports/step", help="folder for trace.json + trace.safetensors (created; "
                   "default reports/step); the log itself goes to stdout")
    p.add_argument("--no-replay", action="store_true", help="diagnose the step by its checks only, without "
                   "replaying its phases (the replay takes a few seconds on the embedded model)")
    args = p.parse_args(argv)
    from rookworld_debug.safeio import check_input_file, check_output_dir
    # paths first, before torch is imported: a bad --out must not cost a whole step, nor the seconds of the imports
    # (errors end in cli.run_guarded: one line, exit 2)
    if args.config:
        check_input_file(args.config, "--config")
    check_output_dir(args.out, "--out")
    config = config_from_args(args.config, args.overrides)
    from rookworld_debug.diagnosis.registry import diagnose_step
    from rookworld_debug.grpo.step import check_step_folder, run_step
    from rookworld_debug.steplog import format_step_log
    check_step_folder(Path(args.out))
    trace = run_step(config)
    print(format_step_log(trace, diagnose_step(trace, replay=not args.no_replay)[0]))   # what `diagnose` says
    path = trace.save(args.out)
    kept = trace.counts.get("state/bytes", 0)
    print(f"trace written to {path}/trace.json (+ trace.safetensors"
          + (f"; the weights the replay needs in state/, {kept / 1e6:.0f} MB)" if kept else ")"))
    return 0 if trace.update is not None else 1


if __name__ == "__main__":
    sys.exit(main())
