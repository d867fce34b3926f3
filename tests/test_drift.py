"""Start the step from a drifted policy: run_steps checkpoint, HF folder, cached warm-up steps."""
import zlib

import pytest
import torch

from rookworld_debug import StepConfig, run_step
from rookworld_debug.errors import ConfigError, ModelLoadError
from rookworld_debug.grpo.multistep.loop import run_steps
from rookworld_debug.grpo.multistep.start import setup
from tinymodels import save_tiny_gpt2

B, G = 2, 4


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny_drift"))
    return StepConfig(model=str(folder), task="P", batch_size=B, num_generations=G, max_new_tokens=16,
                      eval_max_new_tokens=8, heldout_n=0, reward_mode="dataset", lr=3e-3, beta=0.1, seed=5)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOKWORLD_DEBUG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def varied(prompts, completions, **kw):
    """A reward with spread (the random tiny model scores 0 on every real reward): a group never has σ = 0."""
    return [float(zlib.crc32(c.encode()) % 5) for c in completions]


def _kl_and_ratio(trace):
    m = trace.rollout.completion_mask.bool()
    return trace.iterations[0].loss.kl, trace.rollout.ref_per_token_logps[m], trace.rollout.per_token_logps[m]


def test_step_from_a_run_steps_checkpoint_has_kl(base, tmp_path):
    res = run_steps(base, 2, checkpoint_every=2, checkpoint_dir=tmp_path / "ck", keep_traces=False,
                    reward_funcs={"varied": varied})
    ck = res.checkpoints[-1]
    cfg = base.replace(init_policy=str(ck), init_optimizer="checkpoint")
    s = setup(cfg)
    start = s.provenance["start"]
    assert start["init_policy_kind"] == "run_steps checkpoint" and start["init_optimizer"].endswith("optimizer.pt")
    assert start["start_weights_sha256"] != start["base_weights_sha256"]
    assert s.optimizer.state, "AdamW moments restored from the checkpoint"
    tr = run_step(cfg, session=s)
    kl, ref, logp = _kl_and_ratio(tr)
    assert kl > 0 and tr.loss.kl > 0                      # π ≠ π_ref at the FIRST iteration
    assert not torch.equal(ref, logp)
    assert tr.setup.invariants.ok                         # the invariants still describe the base pair


def test_step_from_an_hf_folder(base, tmp_path):
    s0 = setup(base)
    with torch.no_grad():
        for p in s0.policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    s0.policy.save_pretrained(tmp_path / "drifted")
    s = setup(base.replace(init_policy=str(tmp_path / "drifted")))
    assert s.provenance["start"]["init_policy_kind"] == "HF folder"
    tr = run_step(s.config, session=s)
    assert tr.loss.kl > 0


def test_warmup_is_cached_and_regenerable(base, cache):
    # the random tiny model earns 0 on every dataset reward (zero-std groups, no PG signal): the entropy
    # bonus is what moves it here; a trained model's reward spread does it in the main job
    cfg = base.replace(warmup_steps=2, warmup_lr=1e-2, entropy_coef=0.05)
    s1 = setup(cfg)
    st1 = s1.provenance["start"]
    assert st1["warmup_cache"].startswith("computed") and len(st1["warmup"]) == 2 and st1["moved"]
    s2 = setup(cfg)
    st2 = s2.provenance["start"]
    assert st2["warmup_cache"].startswith("hit")
    assert st2["start_weights_sha256"] == st1["start_weights_sha256"] != st1["base_weights_sha256"]
    assert s2.optimizer.param_groups[0]["lr"] == cfg.lr          # the debugged step keeps its own lr
    tr = run_step(cfg, session=s2)
    assert tr.loss.kl > 0
    # the cache is keyed by the config: another warm-up lr is another entry
    s3 = setup(cfg.replace(warmup_lr=5e-3))
    assert s3.provenance["start"]["warmup_cache"].startswith("computed")
    # and so is another number of warm-up steps (a policy warmed for 2 is not one warmed for 1)
    s4 = setup(cfg.replace(warmup_steps=1))
    st4 = s4.provenance["start"]
    assert st4["warmup_cache"].startswith("computed") and len(st4["warmup"]) == 1


def test_bad_start_paths_are_named_errors(base, tmp_path):
    with pytest.raises(ModelLoadError, match="neither a run_steps checkpoint"):
        setup(base.replace(init_policy=str(tmp_path)))
    with pytest.raises(ConfigError) as e:
        StepConfig(init_optimizer="checkpoint")
    assert e.value.field == "init_optimizer"
    with pytest.raises(ConfigError) as e:
        StepConfig(num_iterations=0)
    assert e.value.field == "num_iterations"


def test_warmup_without_signal_says_so(base):
    st = setup(base.replace(warmup_steps=1, warmup_lr=1e-2)).provenance["start"]
    assert not st["moved"] and "did not move" in st["note"]


# ------------------------------------------------------------- damaged or foreign start files
@pytest.mark.parametrize("content", [b"", b"garbage \x00\x01 not a torch file", b"PK\x03\x04truncated-zip"])
def test_damaged_torch_files_are_named(base, tmp_path, content):
    from rookworld_debug.errors import CheckpointError

    (tmp_path / "opt.pt").write_bytes(content)
    with pytest.raises(CheckpointError, match="init_optimizer: .*opt.pt is not a readable torch file"):
        setup(base.replace(init_optimizer=str(tmp_path / "opt.pt")))
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "policy.pt").write_bytes(content)
    with pytest.raises(CheckpointError, match="init_policy: .*policy.pt is not a readable torch file"):
        setup(base.replace(init_policy=str(tmp_path / "ck")))


def test_a_pickle_that_needs_code_is_refused_and_never_runs(base, tmp_path):
    import os
    import pickle

    from rookworld_debug.errors import CheckpointError

    canary = tmp_path / "canary"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))

    torch.save({"x": Evil()}, tmp_path / "opt.pt", pickle_module=pickle)
    with pytest.raises(CheckpointError):
        setup(base.replace(init_optimizer=str(tmp_path / "opt.pt")))
    assert not canary.exists()


def test_state_of_another_model_is_named(base, tmp_path, tmp_path_factory):
    from rookworld_debug.errors import CheckpointError

    other = save_tiny_gpt2(tmp_path_factory.mktemp("other"), n_embd=16)
    s_other = setup(base.replace(model=str(other)))
    loss = sum(p.sum() for p in s_other.policy.parameters())
    loss.backward()
    s_other.optimizer.step()
    torch.save(s_other.optimizer.state_dict(), tmp_path / "opt.pt")
    torch.save(s_other.policy.state_dict(), tmp_path / "policy.pt")
    with pytest.raises(CheckpointError, match="does not fit"):
        setup(base.replace(init_optimizer=str(tmp_path / "opt.pt")))
    (tmp_path / "ck").mkdir()
    (tmp_path / "policy.pt").rename(tmp_path / "ck" / "policy.pt")
    with pytest.raises(CheckpointError, match="does not fit"):
        setup(base.replace(init_policy=str(tmp_path / "ck")))


@pytest.mark.parametrize("damage", ["empty", "garbage", "meta"])
def test_a_damaged_warmup_cache_entry_is_recomputed(base, cache, damage):
    cfg = base.replace(warmup_steps=1, warmup_lr=1e-2, entropy_coef=0.05)
    first = setup(cfg).provenance["start"]
    entry = next(cache.glob("drift/*"))
    if damage == "meta":
        (entry / "meta.json").write_text("[1, 2")
    else:
        (entry / "policy.pt").write_bytes(b"" if damage == "empty" else b"\x80\x04garbage")
    again = setup(cfg).provenance["start"]
    assert again["warmup_cache"].startswith("computed")
    assert again["start_weights_sha256"] == first["start_weights_sha256"]
    assert setup(cfg).provenance["start"]["warmup_cache"].startswith("hit")   # and the entry is whole again
