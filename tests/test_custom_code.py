"""No library may ask: a model or tokenizer folder that asks for custom code (`auto_map`, or a tokenizer class,
architecture or model type transformers does not have) is refused by name before transformers reads it, so
transformers never asks "Do you wish to run the custom code? [y/N]" on stdout and never runs the folder's code.
The recorded step is the fuzzer's (tests/test_step_folder_fuzz.py); each case writes a canary if its code runs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli import run_cli
from test_step_folder_fuzz import _one_torch_thread, record_seed  # noqa: F401 - the fuzzer's fixture

from rookworld_debug.errors import CheckpointError, ModelLoadError, TraceError

PROMPT = "[y/N]"
EVIL = "import pathlib\npathlib.Path(__file__).with_name('CANARY').write_text('ran')\n" \
       "from transformers import GPT2Tokenizer as EvilTokenizer, GPT2Config as EvilConfig\n"


def _strict(text: str):
    """stdout as strict JSON: no NaN/Infinity constants, nothing before or after the payload."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    return record_seed(tmp_path_factory.mktemp("seed") / "step")


def _edit_json(path: Path, **fields) -> None:
    d = json.loads(path.read_text()) if path.exists() else {}
    for k, v in fields.items():
        d.pop(k, None) if v is None else d.__setitem__(k, v)
    path.write_text(json.dumps(d))


def _asking_step(seed: Path, tmp_path: Path, case: str) -> Path:
    """A copy of the recorded step whose state/tokenizer asks for custom code shipped beside it."""
    folder = tmp_path / "step"
    shutil.copytree(seed, folder)
    tok = folder / "state" / "tokenizer"
    (tok / "evil.py").write_text(EVIL)
    if case == "auto_map":                 # no tokenizer_class: transformers had nothing local and asked
        _edit_json(tok / "tokenizer_config.json", tokenizer_class=None,
                   auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    elif case == "auto_map beside a local class":      # transformers took the local class without a word
        _edit_json(tok / "tokenizer_config.json", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    elif case == "tokenizer_class":
        _edit_json(tok / "tokenizer_config.json", tokenizer_class="EvilTokenizer")
    else:                                  # a config.json beside the tokenizer, as AutoTokenizer reads it too
        _edit_json(tok / "tokenizer_config.json", tokenizer_class=None)
        _edit_json(tok / "config.json", model_type="evil", auto_map={"AutoConfig": "evil.EvilConfig",
                                                                     "AutoTokenizer": ["evil.EvilTokenizer", None]})
    return folder


def test_diagnose_json_refuses_a_tokenizer_asking_for_custom_code_without_asking(seed, tmp_path):
    """Was transformers' question on stdout before the JSON (exit 1 with a payload no parser reads)."""
    folder = _asking_step(seed, tmp_path, "auto_map")
    got = run_cli("diagnose", folder, "--json", timeout=180)
    assert PROMPT not in got.stdout and PROMPT not in got.stderr, got.stdout[:600]
    assert "Do you wish" not in got.stdout + got.stderr
    assert got.returncode in (1, 2), got.stderr[-2000:]
    payload = _strict(got.stdout)
    refused = [f for f in payload["findings"] if f["code"] == "recorded_step_refused"]
    assert refused and "auto_map" in refused[0]["cause"] and "custom code" in refused[0]["cause"], refused
    assert not list(tmp_path.rglob("CANARY"))


@pytest.mark.parametrize("case", ["auto_map beside a local class", "tokenizer_class", "config.json"])
def test_every_way_a_recorded_tokenizer_asks_is_the_refused_finding(seed, tmp_path, case):
    from rookworld_debug.diagnosis.registry import folder_diagnosis
    from rookworld_debug.grpo.trace.state import read_state
    folder = _asking_step(seed, tmp_path, case)
    with pytest.raises(TraceError, match="custom code"):
        read_state(folder)
    found = folder_diagnosis(folder).findings
    refused = [f for f in found if f.code == "recorded_step_refused"]
    assert refused and "custom code" in refused[0].cause, [(f.code, f.cause) for f in found]
    assert not list(tmp_path.rglob("CANARY"))


# ------------------------------------------------------------------------------------------ a user's folders
def _model_folder(tmp_path: Path, **config) -> Path:
    """A micro GPT-2 saved by transformers, its config.json then edited."""
    from transformers import GPT2Config, GPT2LMHeadModel
    folder = tmp_path / "model"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=16, vocab_size=300)).save_pretrained(folder)
    (folder / "evil.py").write_text(EVIL)
    _edit_json(folder / "config.json", **config)
    return folder


def _loaders():
    from rookworld_debug.grpo.multistep.drift import load_policy_weights
    from rookworld_debug.models.loading import load_policy_and_reference
    from rookworld_debug.trl.verify import _load_weights

    def init_policy(folder):
        from transformers import GPT2Config, GPT2LMHeadModel
        load_policy_weights(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=16,
                                                       vocab_size=300)), folder)
    return {"load_policy_and_reference": (load_policy_and_reference, ModelLoadError),
            "init_policy": (init_policy, ModelLoadError), "a TRL checkpoint": (_load_weights, CheckpointError)}


@pytest.mark.parametrize("loader", ["load_policy_and_reference", "init_policy", "a TRL checkpoint"])
@pytest.mark.parametrize("config", [
    {"auto_map": {"AutoModelForCausalLM": "evil.EvilModel"}},                 # was loaded as GPT-2, silently
    {"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}},     # was the question on stdin
    {"architectures": ["EvilForCausalLM"]},
])
def test_a_users_model_folder_asking_for_custom_code_is_refused_by_name(tmp_path, loader, config):
    load, error = _loaders()[loader]
    folder = _model_folder(tmp_path, **config)
    with pytest.raises(error, match="custom code"):
        load(folder)
    assert not list(tmp_path.rglob("CANARY"))


def test_folders_transformers_writes_itself_pass(seed, tmp_path):
    """The check refuses only what asks: the bundled model, a recorded tokenizer, a saved GPT-2."""
    from rookworld_debug.models.custom_code import custom_code
    from rookworld_debug.models.loading import TINY_DIR
    for folder in (TINY_DIR, seed / "state" / "tokenizer", _model_folder(tmp_path)):
        assert custom_code(folder) == "", folder


def test_every_load_in_the_package_passes_trust_remote_code_false():
    """A syntax scan: every from_pretrained / from_config call of transformers' classes in the package says
    trust_remote_code=False."""
    import ast
    root = Path(__file__).resolve().parents[1] / "rookworld_debug"
    missing = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("from_pretrained", "from_config") \
                    and getattr(node.func.value, "id", "").startswith(("Auto", "GPT2")):   # transformers' classes
                kw = {k.arg: k.value for k in node.keywords}
                if not (isinstance(kw.get("trust_remote_code"), ast.Constant)
                        and kw["trust_remote_code"].value is False):
                    missing.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not missing, missing


# ------------------------------------------------------------------------------------------ tampered folders
# One process imports the package once, then forks a child per command: the child's stdin is /dev/null and its
# stdout and stderr are files, and it runs `rookworld-debug ARGS` (rookworld_debug.cli.main) as the console script
# does, so each case's stdout is the whole of what a user's pipe would get, at a fraction of a cold start.
DRIVER = r"""
import json, os, sys, time
import torch, transformers
import rookworld_debug.cli as cli, rookworld_debug.cli_diagnose, rookworld_debug.cli_whatif
import rookworld_debug.diagnosis.registry
torch.set_num_threads(1)
out, cases, warm = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
rookworld_debug.cli_diagnose._diagnose(warm)      # the lazy imports and tables, once, before the forks
for i, args in enumerate(cases):
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, name in ((1, "out"), (2, "err")):
            os.dup2(os.open(f"{out}/{i}.{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdin = open(0, closefd=False)
        try:
            rc = cli.main(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(rc or 0)
    t0 = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > 60:
            os.kill(pid, 9); os.waitpid(pid, 0); status = -1; break
        time.sleep(0.02)
    open(f"{out}/{i}.rc", "w").write(str(os.waitstatus_to_exitcode(status) if status != -1 else "timeout"))
"""


def _tampered(seed: Path, root: Path, n: int, rng_seed: int) -> list[Path]:
    """`n` copies of the recorded step, each with one of the fuzzer's mutations (its kinds in turn)."""
    import random

    from test_step_folder_fuzz import KINDS, MUTATE
    from test_triage_fuzz import _atoms
    rng, atoms, folders = random.Random(rng_seed), _atoms(root / "CANARY"), []
    for i in range(n):
        folder = root / f"case-{i}"
        shutil.copytree(seed, folder, symlinks=True)
        MUTATE[KINDS[i % len(KINDS)]](folder, rng, atoms)
        folders.append(folder)
    return folders


def _run_cases(tmp_path: Path, cases: list, warm: Path) -> list[tuple]:
    """[(rc, stdout, stderr)] of `rookworld-debug ARGS` for each ARGS in `cases`, each in a forked child of a
    process warmed on the step folder `warm`."""
    import subprocess

    from cli import ENV, REPO
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run([str(REPO / ".venv/bin/python"), "-c", DRIVER, str(out), json.dumps(cases), str(warm)],
                   env=ENV, stdin=subprocess.DEVNULL, check=True, timeout=60 * len(cases) + 120, cwd=tmp_path)
    read = lambda p: p.read_bytes().decode("utf-8", "backslashreplace")  # noqa: E731
    return [(read(out / f"{i}.rc"), read(out / f"{i}.out"), read(out / f"{i}.err")) for i in range(len(cases))]


def _check_json_commands(tmp_path: Path, seed: Path, folders: list, fuzz_counts: dict) -> None:
    cases = [a for f in folders for a in (["diagnose", str(f), "--json"],
                                          ["whatif", str(f), "--json", "--steps", "1", "--seeds", "1",
                                           "--out", str(f) + "-whatif"])]
    for args, (rc, out, err) in zip(cases, _run_cases(tmp_path, cases, seed)):
        command = args[0]
        where = f"{' '.join(args)}: exit {rc}\nstdout {out[:300]!r}\nstderr {err[-1500:]}"
        assert rc in ("0", "1", "2"), where
        assert PROMPT not in out + err and "Traceback" not in out + err, where
        assert "failure of the tool" not in err and "could not run" not in err, where
        if out.strip():
            assert out.isascii(), where
            _strict(out)                    # the whole of stdout is one strict JSON payload
        else:                               # no payload: a named error, said on stderr
            assert rc == "2" and err.startswith(f"rookworld-debug {command}: error:"), where
        label = f"{command} --json on tampered recorded step folders"
        fuzz_counts[label] = fuzz_counts.get(label, 0) + 1
    assert not list(tmp_path.rglob("CANARY")), "a tampered folder made a reader write a canary file"


def test_json_commands_on_tampered_step_folders_print_strict_json_or_a_named_error(seed, tmp_path, fuzz_counts):
    _check_json_commands(tmp_path, seed, _tampered(seed, tmp_path / "cases", 12, rng_seed=31), fuzz_counts)


@pytest.mark.slow
def test_json_commands_on_120_tampered_step_folders(seed, tmp_path, fuzz_counts):
    _check_json_commands(tmp_path, seed, _tampered(seed, tmp_path / "cases", 120, rng_seed=32), fuzz_counts)


def test_whatif_names_a_trace_json_nested_past_the_parsers_depth(tmp_path):
    """What the slow sample found: whatif's capture probe ended in RecursionError's traceback (exit 1)."""
    from rookworld_debug.cli_whatif import _is_trl_capture
    (tmp_path / "trace.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TraceError, match="nested too deeply"):
        _is_trl_capture(tmp_path)


@pytest.mark.slow
def test_report_on_tampered_and_asking_step_folders_never_asks_nor_tracebacks(seed, tmp_path):
    """`report --trace` renders a step through papermill: on a folder of each of the fuzzer's mutation kinds and on
    one whose tokenizer asks for custom code, it exits with a status (never a traceback or a question) and no
    reader writes the canary (about 30 s a folder)."""
    from test_step_folder_fuzz import KINDS
    folders = _tampered(seed, tmp_path / "cases", len(KINDS), rng_seed=33)
    folders.append(_asking_step(seed, tmp_path / "asking", "auto_map"))
    for i, folder in enumerate(folders):
        got = run_cli("report", "--trace", folder, "--out", tmp_path / f"out-{i}", "--no-progress", timeout=600)
        where = f"report --trace {folder.name}: exit {got.returncode}\n{got.stdout[-600:]}\n{got.stderr[-1500:]}"
        assert got.returncode in (0, 1, 2), where
        assert PROMPT not in got.stdout + got.stderr and "Do you wish" not in got.stdout + got.stderr, where
        assert "Traceback" not in got.stdout + got.stderr, where
    assert not list(tmp_path.rglob("CANARY")), "a tampered folder made a reader write a canary file"
