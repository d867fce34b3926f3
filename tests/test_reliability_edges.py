"""Bad and hostile input at the edges: the families registry, traces that are not what they claim, the CLI's numbers,
closed schemas, and a GPU check on a machine without a GPU. Each gets a named error or a flagged result, never a
silent wrong answer or a bare traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
CLI = str(ROOT / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _cli(*args, timeout=120):
    return subprocess.run([CLI, *map(str, args)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=ROOT)


# ------------------------------------------------------------------------------------------- the registry
@pytest.fixture(autouse=True)
def _registry_restored(registry_restored):
    """Each test's registrations are undone after it (conftest.registry_restored)."""


def _family(name="edge", rules=None, **kw):
    from rookworld_debug.grpo.families import Family, LossRule
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate
    return Family(name, rules if rules is not None else {"edge_loss": LossRule("rows", clipped_surrogate,
                                                                               fixed_length)},
                  kw.pop("advantages", lambda r, c: r), **kw)


@pytest.mark.parametrize("loss_type", ["", None, 5, "Has Space", "x" * 80, "ünï"])
def test_register_refuses_a_loss_type_that_is_not_a_name(loss_type):
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.grpo.families import LossRule, register
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate
    with pytest.raises(ConfigError, match=r"family 'edge'.*not a name"):
        register(_family(rules={loss_type: LossRule("rows", clipped_surrogate, fixed_length)}))


def test_a_built_in_loss_type_cannot_be_shadowed_by_load_order():
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.grpo.families import LossRule, family_of, register
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate
    impostor = _family("impostor", {"grpo": LossRule("rows", clipped_surrogate, fixed_length)})
    with pytest.raises(ConfigError, match=r"family 'impostor'.*'grpo'.*already answered.*replace=True"):
        register(impostor)
    assert family_of("grpo").name != "impostor"


def test_replace_true_replaces_on_purpose_and_the_built_in_can_come_back():
    from rookworld_debug.grpo.families import family_of, register
    from rookworld_debug.grpo.registry import FAMILIES
    own = _family("own edge", {"edge_replaced": _family().rules["edge_loss"]})
    register(own)
    other = _family("other edge", {"edge_replaced": _family().rules["edge_loss"]})
    register(other, replace=True)
    assert family_of("edge_replaced") is other and FAMILIES["edge_replaced"] is other


def test_a_rule_without_an_objective_is_refused_at_registration():
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.grpo.families import LossRule, register
    with pytest.raises(ConfigError, match=r"family 'edge'.*no objective"):
        register(_family(rules={"edge_noobj": LossRule("rows")}))


def test_a_hook_that_returns_the_wrong_type_is_named_with_its_family():
    from rookworld_debug.config import StepConfig
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.grpo.families import advantages_from_config, register
    register(_family("edge hook", {"edge_hook": _family().rules["edge_loss"]}, advantages=lambda r, c: [0.0]))
    with pytest.raises(ConfigError, match=r"family 'edge hook': its advantages returned a list, not an Advantages"):
        advantages_from_config(torch.zeros(4), StepConfig(loss_type="edge_hook", num_generations=2, batch_size=2))


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=20), st.integers(), st.none(), st.floats(allow_nan=True)))
def test_register_never_fails_other_than_by_name(loss_type):
    """A fuzzed loss type either registers (a valid name) or is refused with a ConfigError naming the family."""
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.grpo.families import register
    from rookworld_debug.grpo.registry import FAMILIES
    try:
        register(_family("fuzz", {loss_type: _family().rules["edge_loss"]}))
    except ConfigError as err:
        assert "family 'fuzz'" in str(err)
    else:
        assert isinstance(loss_type, str) and FAMILIES.pop(loss_type).name == "fuzz"     # (hypothesis: one fixture)


def _setting_names() -> tuple:
    from rookworld_debug.config import StepConfig
    return StepConfig.field_names()


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=12), st.lists(st.text(max_size=8), max_size=3))


@settings(max_examples=600, deadline=None, derandomize=True)          # the same cases on every run
@given(st.dictionaries(st.sampled_from(sorted(_setting_names()) + ["family_settings"]), _VALUES, max_size=4))
def test_a_setting_of_any_value_builds_or_is_named(values):
    """Papermill parameters or a --config file may hold anything in any setting, a family's included: the config
    builds with those values, read back flat, or a ConfigError names the key (the hidden family_settings field is
    refused)."""
    from rookworld_debug.config import StepConfig
    from rookworld_debug.errors import ConfigError
    try:
        cfg = StepConfig.from_dict(dict(values))
    except ConfigError as err:
        named = err.field in values or any(k in str(err) for k in values)    # a cross-field rule names both
        assert named or err.field.startswith("family_settings"), (str(err), values)
    else:
        assert "family_settings" not in values
        assert StepConfig.from_dict(cfg.to_dict()) == cfg              # what was accepted reads back flat
        g = StepConfig.glossary()
        for key in values:
            got, default = getattr(cfg, key), g[key]["default"]
            if got is None or default is None:                      # an optional setting: its kind checked above
                assert g[key]["nullable"], (key, got)
            else:
                assert isinstance(got, type(default)), (key, got)


# ------------------------------------------------------------------------------------------- traces
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A recorded step (small, no weights): a real trace folder to corrupt."""
    from tinymodels import saved_minimal_step
    return saved_minimal_step(tmp_path_factory.mktemp("t") / "step")[0]


def _with(saved, tmp_path, edit):
    import shutil
    out = tmp_path / "edited"
    shutil.copytree(saved, out)
    payload = json.loads((out / "trace.json").read_text())
    edit(payload)
    (out / "trace.json").write_text(json.dumps(payload))
    return out


@pytest.mark.parametrize("version", [0, -7])
def test_a_trace_version_no_package_wrote_is_refused(saved, tmp_path, version):
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.step import StepTrace
    out = _with(saved, tmp_path, lambda p: p["fields"].__setitem__("version", version))
    with pytest.raises(TraceError, match=rf"trace version {version} is no version"):
        StepTrace.load(out)


def test_a_record_of_another_type_in_a_typed_field_is_refused(saved, tmp_path):
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.step import StepTrace
    out = _with(saved, tmp_path, lambda p: p["fields"].__setitem__("config", p["fields"]["setup"]["fields"]["batch"]))
    with pytest.raises(TraceError, match="config holds a Batch, not a StepConfig"):
        StepTrace.load(out)
    r = _cli("diagnose", out)
    assert r.returncode == 2 and "config holds a Batch" in r.stderr and "Traceback" not in r.stderr


def test_diagnose_exits_2_naming_a_check_that_could_not_run(saved, monkeypatch, capsys):
    from rookworld_debug import cli_diagnose
    from rookworld_debug.diagnosis import registry

    def broken(trace):
        raise RuntimeError("boom")
    monkeypatch.setattr(registry, "STEP_CHECKS", registry.STEP_CHECKS + (broken,))
    assert cli_diagnose.main([str(saved), "--no-replay"]) == 2
    err = capsys.readouterr().err
    assert "check(s) could not run" in err and "check broken failed: RuntimeError: boom" in err


def test_a_trace_with_300000_flags_gives_a_bounded_list_of_notes():
    from types import SimpleNamespace

    from rookworld_debug.diagnosis.flags import MAX_NOTES, check_phase_flags
    found = check_phase_flags(SimpleNamespace(flags=tuple(f"note {i}" for i in range(300_000))))
    assert len(found) == MAX_NOTES + 1 and "300000 notes in all" in found[-1].cause


# ------------------------------------------------------------------------------------------- schemas
@pytest.mark.parametrize("field,value", [("evidence", 0), ("alternatives", ""), ("evidence", {}),
                                         ("alternatives", 0)])
def test_a_finding_s_falsy_wrong_types_are_refused(field, value):
    from rookworld_debug.diagnosis.findings import Finding
    from rookworld_debug.errors import DataError
    d = {"code": "x", "severity": "info", "cause": "c", "evidence": [], "fix": {"description": "d"},
         "alternatives": [], field: value}
    with pytest.raises(DataError, match=field):
        Finding.from_dict(d)


def test_a_crashed_benchmark_result_without_its_error_is_refused_by_name(tmp_path):
    from rookworld_debug.errors import DataError
    from rookworld_debug.lab.faults import load_results
    (tmp_path / "results.jsonl").write_text(json.dumps({"id": "a", "kind": "crash"}) + "\n")
    with pytest.raises(DataError, match="crashed case's result has no 'error'"):
        load_results(tmp_path)


def test_a_document_cache_with_ids_outside_the_vocabulary_is_refused(tmp_path):
    import numpy as np

    from rookworld_debug.errors import DataError
    from rookworld_debug.lab.tiny_data import CACHE_KEYS, load_docs
    arrays = {"key": np.array("k"), "p_len": np.array([3]), "p_ids": np.array([1, 2, 99999]),
              "p_w": np.array([1.0, 1.0]), "a_len": np.array([2]), "a_ids": np.array([1, 2]), "a_w": np.array([1.0])}
    assert set(arrays) == CACHE_KEYS
    np.savez(tmp_path / "c.npz", **arrays)
    with pytest.raises(DataError, match="outside the tokenizer's 257"):
        load_docs(tmp_path / "c.npz", "k", vocab_size=257)


# ------------------------------------------------------------------------------------------- the CLI's numbers
@pytest.mark.parametrize("argv", [
    ["whatif", "runs/x", "--set", "beta=0", "--threads", 10 ** 20],
    ["whatif", "runs/x", "--set", "beta=0", "--steps", 1_000_000_000],
    ["bench", "--threads", 10 ** 20], ["measure", "--threads", 10 ** 20], ["train-tiny", "--threads", 10 ** 20]])
def test_integer_options_out_of_range_are_a_usage_error(argv):
    r = _cli(*argv)
    assert r.returncode == 2 and "is outside" in r.stderr and "Traceback" not in r.stderr, r.stderr[-800:]


def test_a_documented_choice_spelled_none_stays_that_choice():
    from rookworld_debug.cli_step import config_from_args
    from rookworld_debug.whatif.overrides import parse_sets
    assert config_from_args(None, ["scale_rewards=none"]).scale_rewards == "none"
    assert parse_sets(["scale_rewards=none", "max_grad_norm=none"]) == {"scale_rewards": "none",
                                                                        "max_grad_norm": None}


def test_whatif_names_a_bad_value_before_loading_anything(saved):
    r = _cli("whatif", saved, "--set", "lr=abc")
    assert r.returncode == 2 and "lr: 'abc' is not a number" in r.stderr and "Traceback" not in r.stderr


def test_bench_on_a_device_this_machine_lacks_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    r = _cli("bench", "--device", "cuda", "--variants", "a", "--out", "/tmp/rw-bench-nocuda")
    assert r.returncode == 2 and "no CUDA support" in r.stderr and "Traceback" not in r.stderr


def test_the_gpu_check_refuses_to_write_a_measurement_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(tmp_path)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no CUDA GPU" in r.stderr
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------- devices
def test_on_device_moves_tensors_at_any_depth():
    import dataclasses

    from rookworld_debug.models.devices import on_device

    @dataclasses.dataclass(frozen=True)
    class Inner:
        a: object

    @dataclasses.dataclass(frozen=True)
    class Outer:
        t: tuple
        d: dict
    rec = Outer(t=(Inner(torch.zeros(2)),), d={"x": {"y": torch.zeros(1)}, "z": [torch.ones(1)]})
    moved = on_device(rec, "meta")
    assert moved.t[0].a.device.type == "meta" and moved.d["x"]["y"].device.type == "meta"
    assert moved.d["z"][0].device.type == "meta" and on_device(rec, "cpu") is rec


def test_a_reused_session_applies_autocast_and_refuses_a_reload_by_name(tiny_byte_model_dir, fixtures_dir):
    import warnings

    from rookworld_debug.errors import ConfigError
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import run_step
    from tinymodels import tiny_step_config
    cfg = tiny_step_config(tiny_byte_model_dir, dataset=str(fixtures_dir / "rook_p_lines.txt"), eval_max_new_tokens=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = setup(cfg)
        t = run_step(cfg.replace(autocast="bf16"), session=s)
    assert t.setup.provenance["precision"]["policy"]["autocast"] == "bfloat16"     # what ran is what is recorded
    assert t.config.autocast == "bf16"
    with pytest.raises(ConfigError, match=r"dtype.*loaded with 'float32'.*new session"):
        run_step(cfg.replace(dtype="bfloat16"), session=s)


def test_a_step_saved_on_a_gpu_branches_on_this_machine_with_a_note():
    from rookworld_debug.config import StepConfig
    from rookworld_debug.models.devices import usable
    from rookworld_debug.whatif.state import here
    if usable("cuda"):
        pytest.skip("this machine has CUDA: the fallback is for machines without it")
    kw, notes = here(StepConfig(device="cuda", reference_device="cuda:1"), None)
    assert kw == {"device": "cpu", "reference_device": "same"}
    assert len(notes) == 2 and "this machine lacks it" in notes[0]
    assert here(StepConfig(device="cuda"), "cpu") == ({"device": "cpu"}, ())


def test_auto_keeps_a_small_model_on_the_cpu_and_says_why(monkeypatch):
    """device='auto' on a machine with a GPU: the embedded 4.9 M model stays on the CPU (its GPU step is launch-bound),
    with a note; an explicit device is never second-guessed."""
    import warnings

    from rookworld_debug.models import devices
    from rookworld_debug.models.loading import load_policy_and_reference
    real = devices.check_device
    monkeypatch.setattr(devices, "check_device",
                        lambda d, field="device": torch.device("cuda") if d == "auto" else real(d, field))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_policy_and_reference("tiny", device="auto")
    assert next(loaded.policy.parameters()).device.type == "cpu"
    assert any("device='auto' chose the CPU over cuda" in n for n in loaded.provenance.notes)
