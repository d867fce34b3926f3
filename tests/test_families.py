"""Objective families (grpo/families.py): every loss type has one; advantages, micro-batch weighting, loss record
and per-step preparation come from it; the step's modules test no family's loss-type name; a family registered
in this file alone runs a step."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from rookworld_debug.config import LOSS_TYPES, StepConfig
from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.phases import advantages as adv
from rookworld_debug.grpo.families import Family, advantages_from_config, family_of, register
from tinymodels import tiny_step_config

GRPO = Path(adv.__file__).parent


def test_every_loss_type_has_a_family_and_an_unknown_one_is_named():
    assert {family_of(lt).name for lt in LOSS_TYPES} == {"TRL GRPOTrainer", "rookworld-trl manual loop",
                                                          "rookworld-rlvr mini"}
    with pytest.raises(ConfigError, match="no registered objective family"):
        family_of("nope")


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batch_weights_add_up_to_the_full_batch(loss_type):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)   # (n=4, T=3)
    fam = family_of(loss_type)
    for entropy in (False, True):
        ws = [fam.mb_weight(loss_type, slice(i, i + 2), 4, mask, entropy=entropy) for i in (0, 2)]
        kind = (entropy and fam.entropy_weighting) or fam.pg_weighting[loss_type]
        assert sum(ws) == pytest.approx(2.0 if kind == "global" else 1.0)
        if kind == "tokens":                          # rows 0-1 hold 3 of the 7 tokens
            assert ws == pytest.approx([3 / 7, 4 / 7])


def test_advantages_come_from_the_family():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    cfg = StepConfig(num_generations=2)
    assert torch.equal(advantages_from_config(r, cfg).advantages,
                       adv.compute_advantages(r, 2, scale_rewards=cfg.scale_rewards, eps=cfg.adv_eps,
                                              std_ddof=cfg.std_ddof, clip=cfg.adv_clip).advantages)
    m = cfg.replace(loss_type="manual")
    assert advantages_from_config(r, m).method == "manual"


def test_a_family_registered_in_test_code_answers_its_loss_type():
    toy = register(Family("toy", ("toy_loss",), lambda rewards, config: rewards, {"toy_loss": "rows"}))
    assert family_of("toy_loss") is toy and toy.mb_weight("toy_loss", slice(0, 1), 4, torch.ones(4, 2)) == 0.25
    with pytest.raises(ValueError, match="weighting"):
        register(Family("bad", ("x",), lambda r, c: r, {"x": "per-moon"}))


@pytest.mark.parametrize("module", ["update.py", "advantages.py", "step.py", "phases.py", "iterations.py"])
def test_the_step_modules_test_no_family_name(module):
    src = (GRPO / module).read_text()
    hits = re.findall(r"loss_type\s*(?:==|!=|in)\s*[(\"']", src)
    assert not hits, f"{module} tests loss-type names: {hits}"


# ------------------------------------------------------------------ a new family, in test code alone
def _sign_advantages(rewards, config):
    """The toy's advantages: the sign of r − mean_g (what a rank-based trainer would push)."""
    import dataclasses
    a = adv.compute_advantages(rewards, config.num_generations, scale_rewards="none", eps=config.adv_eps,
                               std_ddof=config.std_ddof)
    return dataclasses.replace(a, advantages=torch.sign(a.advantages), normalization="A = sign(r − mean_g)",
                               method="toy_sign")


def _toy_loss(logps, old, ref, advantages, mask, objective, batch):
    """dr_grpo's loss table on the sign advantages, recorded under the toy's name."""
    import dataclasses

    from rookworld_debug.grpo.objective.loss import compute_loss
    rec = compute_loss(logps, old, ref, advantages, mask, objective.replace(loss_type="dr_grpo"), batch)
    return dataclasses.replace(rec, loss_type="toy_sign")


def test_a_toy_family_registered_in_test_code_runs_a_step(tiny_byte_model_dir, fixtures_dir):
    import warnings

    from rookworld_debug.grpo.step import run_step

    register(Family("toy sign", ("toy_sign",), _sign_advantages, {"toy_sign": "rows"}, loss=_toy_loss))
    cfg = tiny_step_config(tiny_byte_model_dir, loss_type="toy_sign", dataset=str(fixtures_dir / "rook_p_lines.txt"),
                           eval_max_new_tokens=4, micro_batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = run_step(cfg)
    assert t.advantages.method == "toy_sign" and set(t.advantages.advantages.tolist()) <= {-1.0, 0.0, 1.0}
    assert t.loss.loss_type == "toy_sign" and t.update is not None
    assert t.iterations[0].updates[0].loss_record_diff <= 1e-5       # the optimized loss is the displayed one
    assert not [f for f in t.flags if "differs from the displayed" in f]
