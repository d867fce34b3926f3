"""Device placement without a GPU: the phases and whole steps on a simulated second device (tests/device_guard.py),
where a CPU tensor that meets a device tensor raises as CUDA does. Records come back on the CPU; the numbers match
the CPU run's."""
from __future__ import annotations

import math
import unittest.mock as um

import pytest
import torch

import rookworld_debug.models.devices as devices
from device_guard import SIM, DeviceMixError, simulated_device

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
_check_device = devices.check_device


def _cuda_is_the_simulated_device():
    """`device='cuda'` (and 'cuda:0') resolve to the simulated device; 'cpu' stays the CPU."""
    return um.patch.object(devices, "check_device", lambda d, field="device":
                           SIM if str(d).startswith("cuda") else _check_device(d, field))


def _small(**kw):
    from rookworld_debug import StepConfig
    # task A: no engine; 24 tokens keep the simulated run short (each op goes through Python)
    base = dict(task="A", batch_size=2, num_generations=2, max_new_tokens=24, eval_max_new_tokens=4, heldout_n=1,
                beta=0.04, seed=1)
    return StepConfig(**{**base, **kw})


def _tensors(obj, seen=None):
    """Every tensor reachable from a record (dataclass fields, tuples, dicts)."""
    import dataclasses
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            if f.name not in ("setup", "policy", "reference", "optimizer", "tokenizer", "engine", "session"):
                yield from _tensors(getattr(obj, f.name), seen)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _tensors(x, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, seen)


# ------------------------------------------------------------------------------------------------ the guard itself
def test_the_simulated_device_computes_and_raises_on_mixing():
    with simulated_device():
        a = torch.arange(6.0).reshape(2, 3).to(SIM)
        assert a.device == SIM and float((a * 2).sum()) == 30.0
        assert (a + torch.tensor(1.0)).device == SIM                # a 0-dim CPU scalar may meet it (as on CUDA)
        assert a[torch.tensor([True, False])].shape == (1, 3)      # CPU indices may index it (as on CUDA)
        assert a.cpu().device.type == "cpu"
        with pytest.raises(DeviceMixError, match="same device"):
            a + torch.ones(2, 3)
        lin = torch.nn.Linear(3, 1).to(SIM)
        lin(a).sum().backward()
        torch.optim.AdamW(lin.parameters(), lr=0.1).step()
        assert lin.weight.device == SIM and lin.weight.grad.device == SIM


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo",
                                       "manual"])
def test_the_loss_runs_where_its_inputs_are(loss_type):
    """compute_loss allocates nothing on the CPU: every input on the device → every output there."""
    from rookworld_debug import StepConfig
    from rookworld_debug.grpo.objective.loss import compute_loss
    from rookworld_debug.grpo.objective.params import LossBatch, Objective
    g = torch.Generator().manual_seed(0)
    n, t = 4, 5
    logps = -torch.rand(n, t, generator=g)
    ref, old = logps - 0.1 * torch.rand(n, t, generator=g), logps - 0.05
    adv, mask = torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.ones(n, t)
    objective = Objective.from_config(StepConfig(loss_type=loss_type, beta=0.04))
    cpu = compute_loss(logps, old, ref, adv, mask, objective, LossBatch(num_items_in_batch=float(n * t)))
    with simulated_device():
        dev = compute_loss(*(x.to(SIM) for x in (logps, old, ref, adv, mask)), objective,
                           LossBatch(num_items_in_batch=float(n * t)))
        assert dev.loss.device == SIM
        assert math.isclose(float(dev.loss), float(cpu.loss), rel_tol=1e-6, abs_tol=1e-9)


# ----------------------------------------------------------------------------------------------- whole steps
@pytest.mark.parametrize("kw", [
    dict(diagnostics=True, num_generations=3),       # the update + signal-or-noise diagnostics, G′ sweep included
    dict(diagnostics=True, beta=0.0, max_new_tokens=2),   # no gradient anywhere: the diagnostics' zero paths
    dict(kl_estimator="full", reference_device="cpu", num_iterations=2),   # the reference on another device
    dict(loss_type="rlvr_mini", reference_device="cpu"),
    # a sampler that cannot be replayed exactly: the evaluation's own resample loop and Δlogp forward (the path a
    # bf16 step on a GPU takes)
    dict(loss_type="rlvr_mini", rlvr_pitfalls=("train_past_eos",)),
], ids=["diagnostics", "no-signal", "reference-on-cpu", "rlvr-mini", "no-replay"])
def test_a_step_on_a_second_device_matches_the_cpu_step(kw):
    from rookworld_debug import run_step
    torch.set_num_threads(1)
    cpu = run_step(_small(device="cpu", **kw))
    with simulated_device(_cuda_is_the_simulated_device()):
        dev = run_step(_small(device="cuda", **kw))
    assert dev.update is not None and dev.evaluation is not None, dev.flags
    assert not [f for f in dev.flags if "skipped" in f or "failed" in f or "refused" in f], dev.flags
    # records live on the CPU, where traces and views read them
    assert {x.device.type for x in _tensors(dev)} == {"cpu"}
    for key in ("loss", "kl", "grad_norm_pre_clip", "reward_after", "corr_adv_delta_logp"):
        a, b = cpu.summary()[key], dev.summary()[key]
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), key
    assert torch.equal(cpu.rollout.completion_ids, dev.rollout.completion_ids)   # same draws from the same seed


def test_runs_checkpoints_and_whatif_on_a_second_device(tmp_path):
    from rookworld_debug.grpo.multistep.loop import run_steps
    from rookworld_debug.whatif.overrides import arms_from_sets
    from rookworld_debug.whatif.run import whatif
    torch.set_num_threads(1)
    with simulated_device(_cuda_is_the_simulated_device()):
        cfg = _small(device="cuda", heldout_n=0, warmup_steps=1)               # a drifted start: one warm-up step
        res = run_steps(cfg, 2, checkpoint_every=1, checkpoint_dir=tmp_path / "ck", lr_schedule="cosine")
        assert len(res.table) == 2 and res.table["grad_norm_pre_clip"].notna().all()
        resumed = run_steps(cfg, 2, resume_from=tmp_path / "ck" / "step_00001")
        assert list(resumed.table["step"]) == [0, 1]
        out = whatif(tmp_path / "ck" / "step_00001", arms_from_sets([["beta=0.1"]]), steps=1, seeds=1,
                     device="cuda")
    assert out.self_check.passed is not False
    assert len(out.one_step) == 2 and all(a.refused is None for a in out.one_step)
    assert len(out.branches) == 2


# ------------------------------------------------------------------------------------------ memory and errors
def test_the_memory_budget_follows_the_device():
    """The CPU keeps its fixed rule; a CUDA card plans for half of what is free on it (its own reading)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from rookworld_debug.grpo.phases.scoring import TRAIN_BUDGET_BYTES, auto_micro_batch_size
    from rookworld_debug.models.memory import memory_budget
    assert memory_budget("cpu", TRAIN_BUDGET_BYTES) == TRAIN_BUDGET_BYTES
    with torch.device("meta"):
        big = GPT2LMHeadModel(GPT2Config())                    # GPT-2 124M's shapes, no memory
    assert auto_micro_batch_size(big, 192, 170) == 4           # the CPU rule: 1 GiB → 4 rows of 170 tokens
    free = {"h200": 140 * 2**30, "12gb": 11 * 2**30}
    with um.patch("torch.cuda.mem_get_info", lambda d=None: (free["h200"], free["h200"])):
        assert memory_budget("cuda:0", TRAIN_BUDGET_BYTES) == 70 * 2**30
        assert auto_micro_batch_size(big, 192, 170, memory_budget("cuda:0", TRAIN_BUDGET_BYTES)) == 192
    with um.patch("torch.cuda.mem_get_info", lambda d=None: (free["12gb"], free["12gb"])):
        k = auto_micro_batch_size(big, 192, 170, memory_budget("cuda:0", TRAIN_BUDGET_BYTES))
        assert 4 < k < 192 and 192 % k == 0


def test_out_of_device_memory_names_the_phase_and_a_setting_that_fits(monkeypatch):
    import rookworld_debug.grpo.step as step
    from rookworld_debug import run_step
    from rookworld_debug.errors import DeviceMemoryError

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
    monkeypatch.setattr(step, "run_iterations", oom)
    with pytest.raises(DeviceMemoryError) as e:
        run_step(_small(device="cpu", heldout_n=0))
    assert e.value.phase == "update"
    assert "micro_batch_size=" in str(e.value) and "9.00 GiB" in str(e.value)


def test_a_missing_gpu_is_one_line_and_exit_2():
    from cli import run_cli
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the missing-GPU path cannot be shown here")
    for args in (["step", "--set", "device=cuda"], ["step", "--set", "reference_device=cuda:3"]):
        r = run_cli(*args, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        assert len(lines) == 1 and "CUDA" in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_scoring_runs_on_the_model_and_returns_where_the_record_is(tiny_byte_model_dir):
    """The teacher-forced forward runs on the model's device and hands its log-probs back on the device of the ids
    it scored: a CPU rollout gets CPU results (the post-update evaluation and the what-if self-check compare them
    with CPU records), a device batch keeps them there (the update's graph)."""
    from transformers import AutoModelForCausalLM

    from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_byte_model_dir).eval()
    g = torch.Generator().manual_seed(0)
    prompt, completion = torch.randint(0, 250, (2, 5), generator=g), torch.randint(0, 250, (2, 4), generator=g)
    args = (prompt, torch.ones_like(prompt), completion, torch.ones_like(completion), torch.ones(2))
    cpu_lp, _ = per_token_logps_and_entropy(model, *args)
    with simulated_device():
        model.to(SIM)
        lp, ent = per_token_logps_and_entropy(model, *args)                   # CPU record, model on the device
        assert lp.device.type == "cpu" and ent.device.type == "cpu"
        assert torch.allclose(lp, cpu_lp, atol=1e-5)
        on_dev, _ = per_token_logps_and_entropy(model, *(x.to(SIM) for x in args), with_grad=True)
        assert on_dev.device == SIM and on_dev.requires_grad
