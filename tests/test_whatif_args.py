"""`rookworld-debug whatif` checks every argument before it loads a model or runs a step, and refuses by name what
it would otherwise get silently wrong: an arm's own seed (arms share seeds), an arm that changes the sampled
rollout (rookworld-rlvr pitfalls, G) without --steps. A run_steps checkpoint whose state.json was altered is one
CheckpointError. A verdict on a symptom neither arm shows says "absent in both". As a user runs it: subprocess,
stdin closed, timeout (a refused command must end long before `--steps 1000` could)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli import run_cli

from rookworld_debug.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A one-step run_steps run of the embedded tiny model with its checkpoint."""
    from rookworld_debug import StepConfig
    from rookworld_debug.grpo.multistep.loop import run_steps
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("whatif_args")
    cfg = StepConfig(reward_mode="dataset", batch_size=2, num_generations=2, max_new_tokens=16,
                     eval_max_new_tokens=8, heldout_n=0, device="cpu", top_k_alternatives=1)
    run_steps(cfg, 1, checkpoint_every=1, checkpoint_dir=out / "ckpt", keep_traces=False)
    return out / "ckpt" / "step_00001"


def _one_line(r, *words):
    err = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and len(err) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    assert all(w in err[0] for w in words), err
    return err[0]


@pytest.mark.parametrize("args, words", [
    (["--set", "beta=0.5", "--steps", "1000", "--out", "{file}"], ("--out", "is a file")),
    (["--set", "beta=0.5", "--steps", "1000", "--symptom", "kl_spik"], ("--symptom", "kl_spik")),
    (["--set", "seed=7", "--seeds", "2", "--steps", "1000"], ("seed", "same seeds")),
    (["--set", "loss_type=rlvr_mini rlvr_pitfalls=prompt_mask_left_pad"], ("--steps", "rlvr_pitfalls")),
    (["--set", "num_generations=8"], ("--steps", "num_generations")),
])
def test_arguments_are_refused_before_any_work(ckpt, tmp_path, args, words):
    (tmp_path / "file").write_text("x")
    args = [a.format(file=tmp_path / "file") for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o")]
    r = run_cli("whatif", ckpt, *args, "--threads", "1", timeout=60)
    _one_line(r, *words)
    assert not (tmp_path / "o").exists()


def test_the_library_refuses_the_same_before_loading(ckpt):
    from rookworld_debug.whatif import arms_from_sets, whatif
    with pytest.raises(ConfigError, match="seed"):
        arms_from_sets([["seed=7"]])
    with pytest.raises(ConfigError, match="--steps"):
        whatif(ckpt.parent / "no-such-folder", arms_from_sets([["num_generations=8"]]))   # before the path is read
    with pytest.raises(ConfigError, match="--symptom"):
        whatif(ckpt.parent / "no-such-folder", arms_from_sets([["beta=0.5"]]), steps=1, symptoms=("nope",))


def _altered(ckpt, tmp_path, change) -> object:
    bad = tmp_path / "bad" / "step_00001"
    shutil.copytree(ckpt, bad)
    st = json.loads((bad / "state.json").read_text())
    change(st)
    (bad / "state.json").write_text(json.dumps(st))
    return bad


def _set(key, value):
    return lambda st: st.__setitem__(key, value)


CHANGES = {
    "next_step text": _set("next_step", "abc"),
    "beta_schedule key missing": lambda st: st["beta_schedule"].pop("clip"),
    "beta_schedule extra key": lambda st: st["beta_schedule"].__setitem__("exec", "os.system"),
    "beta_schedule wrong type": lambda st: st["beta_schedule"].__setitem__("target", "abc"),
    "401-digit int in rows": lambda st: st["rows"][0].__setitem__("loss", 10 ** 400),
    "rows not a list": _set("rows", {"loss": 1}),
    "unknown key": _set("__record__", "os:system"),
    "config wrong type": lambda st: st["config"].__setitem__("seed", 10 ** 400),
    "not an object": lambda st: st.clear(),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_an_altered_checkpoint_is_a_checkpoint_error(ckpt, tmp_path, name):
    from rookworld_debug.grpo.multistep.checkpoint import read_state
    bad = _altered(ckpt, tmp_path, CHANGES[name])
    with pytest.raises(CheckpointError, match="state.json"):
        from rookworld_debug.grpo.multistep.checkpoint import built
        built(read_state(bad), bad)


@pytest.mark.parametrize("name", ["next_step text", "beta_schedule key missing", "401-digit int in rows"])
def test_whatif_and_resume_on_an_altered_checkpoint(ckpt, tmp_path, name):
    bad = _altered(ckpt, tmp_path, CHANGES[name])
    _one_line(run_cli("whatif", bad, "--set", "beta=0.5", "--out", tmp_path / "o", "--threads", "1", timeout=120),
              "CheckpointError", "state.json")
    from rookworld_debug.grpo.multistep.loop import run_steps
    with pytest.raises(CheckpointError, match="state.json"):
        run_steps(None, 2, resume_from=bad)


def test_the_real_checkpoint_fits_its_schema(ckpt):
    from rookworld_debug.grpo.multistep.checkpoint import built, read_state
    cfg, beta, lr = built(read_state(ckpt), ckpt)
    assert cfg.batch_size == 2 and beta.kind and lr.kind


def test_a_symptom_neither_arm_shows_is_absent_in_both():
    from rookworld_debug.whatif.stats import Symptom, verdict
    s = Symptom("kl_spike", "kl", "max", +1, threshold=1.0)
    v = verdict(s, "beta=0.1", [0.1, 0.2, 0.15], [0.3, 0.25, 0.4])
    assert v.verdict == "absent in both" and "either arm" in v.reason
    shown = verdict(s, "beta=0.1", [0.1, 0.2, 0.15], [3.0, 2.5, 4.0])
    assert shown.verdict == "removed"
