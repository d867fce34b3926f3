"""The signal-or-noise functions on degenerate input: a named error, or a NaN whose reason is flagged. And the
one-prompt step (batch_size = 1, a common debugging case): the diagnostics that cannot run are skipped with a
note saying why, and the step, its report and a sweep over it complete."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rookworld_debug.errors import ConfigError, DataError
from rookworld_debug.grpo.signal.noise import noise_scale, paired_bootstrap_ci, per_group_grads
from rookworld_debug.grpo.signal.entropy_mechanism import entropy_mechanism, token_covariance
from rookworld_debug.grpo.signal.group_size import group_size_sweep
from rookworld_debug.grpo.signal.sampler_gap import sampler_trainer_gap
from tinymodels import use_spare_cores

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("grads", [torch.tensor(1.0), torch.zeros(5), torch.zeros(1, 5), torch.zeros(2, 3, 4)],
                         ids=["scalar", "1-D", "one group", "3-D"])
def test_noise_scale_refuses_what_is_not_two_or_more_groups(grads):
    with pytest.raises(ConfigError, match="per_group_grads"):
        noise_scale(grads)


@pytest.mark.parametrize("kw,field", [({"n_boot": -1}, "n_boot"), ({"n_boot": 2.5}, "n_boot"),
                                      ({"level": 0.0}, "level"), ({"level": 1.0}, "level"),
                                      ({"level": 1.5}, "level"), ({"level": math.nan}, "level")])
def test_noise_scale_bootstrap_arguments_out_of_range_are_named(kw, field):
    with pytest.raises(ConfigError, match=field):
        noise_scale(torch.randn(4, 6), **kw)


def test_noise_scale_without_resamples_says_why_the_interval_is_nan():
    ns = noise_scale(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), n_boot=0)
    assert all(math.isnan(x) for x in ns.snr_ci) and "n_boot = 0" in ns.note
    two = noise_scale(torch.randn(2, 6, generator=torch.Generator().manual_seed(0)))
    assert all(math.isnan(x) for x in two.snr_ci) and "2 groups" in two.note


@pytest.mark.parametrize("kw,err,match", [({"n_boot": 0}, ConfigError, "n_boot"), ({"level": 0}, ConfigError, "level"),
                                          ({"level": 2.0}, ConfigError, "level")])
def test_paired_bootstrap_arguments_out_of_range_are_named(kw, err, match):
    with pytest.raises(err, match=match):
        paired_bootstrap_ci([0.0, 1.0], [1.0, 1.0], **kw)


def test_paired_bootstrap_bad_sequences_are_named_and_non_finite_pairs_dropped():
    with pytest.raises(DataError, match="equal-length"):
        paired_bootstrap_ci([0.0, 1.0], [1.0])
    with pytest.raises(DataError, match="equal-length"):
        paired_bootstrap_ci(3.0, 4.0)                                     # a scalar
    with pytest.raises(DataError, match="numbers"):
        paired_bootstrap_ci(["a", "b"], [1.0, 2.0])
    lo, hi = paired_bootstrap_ci([0.0, -math.inf, 1.0, math.nan], [1.0, 5.0, 2.0, 0.0], n_boot=200)
    assert lo == hi == pytest.approx(1.0)                                  # only the two finite pairs, both +1
    assert all(math.isnan(x) for x in paired_bootstrap_ci([math.nan], [1.0]))


def test_entropy_mechanism_lengths_that_disagree_are_named():
    lp, m = torch.zeros(4, 3), torch.ones(4, 3)
    with pytest.raises(ConfigError, match="advantages"):
        entropy_mechanism(lp, lp, torch.zeros(3), m, 1e-4)
    with pytest.raises(ConfigError, match="mask"):
        entropy_mechanism(lp, lp, torch.zeros(4), torch.ones(4, 2), 1e-4)
    with pytest.raises(ConfigError, match="entropy"):
        entropy_mechanism(lp, torch.zeros(4, 5), torch.zeros(4), m, 1e-4)
    with pytest.raises(ConfigError, match="logps"):
        token_covariance(torch.tensor(0.5), torch.zeros(1), torch.ones(1))


@pytest.mark.parametrize("bad", [math.nan, -math.inf])
def test_non_finite_log_probs_under_the_mask_give_a_flagged_nan(bad):
    lp = torch.log(torch.full((4, 3), 0.5))
    lp[1, 2] = bad
    em = entropy_mechanism(lp, torch.ones(4, 3), torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.ones(4, 3), 1e-4)
    assert math.isnan(em.cov) and math.isnan(em.predicted_delta_entropy)
    assert any("non-finite" in f and "1 log-prob" in f for f in em.flags)
    mask = torch.ones(4, 3)
    mask[1, 2] = 0                                                        # the bad token is outside the mask
    ok = entropy_mechanism(lp, torch.ones(4, 3), torch.tensor([1.0, -1.0, 0.5, -0.5]), mask, 1e-4)
    assert math.isfinite(ok.cov) and not ok.flags
    gap = sampler_trainer_gap(lp, torch.log(torch.full((4, 3), 0.5)), torch.ones(4, 3))
    assert gap.nan_tokens == 1 and math.isfinite(gap.max_abs) and "TRL's rule" in gap.flags[0]


def test_group_size_sweep_and_per_group_grads_refuse_degenerate_groups():
    with pytest.raises(ConfigError, match="num_generations"):             # G = 1: no G′ to compare with
        group_size_sweep(None, torch.zeros(4), SimpleNamespace(num_generations=1), torch.zeros(3))
    rollout = SimpleNamespace(completion_ids=torch.zeros(6, 2, dtype=torch.long))
    cfg = SimpleNamespace(num_generations=4)
    with pytest.raises(ConfigError, match="groups of G = 4"):              # 6 rows are not groups of 4
        per_group_grads(None, rollout, SimpleNamespace(advantages=torch.zeros(6)), cfg)
    with pytest.raises(ConfigError, match="num_generations"):              # one advantage too few
        per_group_grads(None, SimpleNamespace(completion_ids=torch.zeros(8, 2)),
                        SimpleNamespace(advantages=torch.zeros(7)), cfg)


def _one_prompt_config(fixtures_dir):
    from rookworld_debug.config import StepConfig
    return StepConfig().replace(reward_mode="dataset", dataset=str(fixtures_dir / "rook_p_lines.txt"), batch_size=1,
                                num_generations=4, max_new_tokens=16, eval_max_new_tokens=8, heldout_n=1,
                                diagnostics=True, p_temperature=1.5)


def test_one_prompt_step_skips_the_noise_scale_with_a_note_and_completes(fixtures_dir, tmp_path):
    from rookworld_debug import StepTrace, viz
    from rookworld_debug.grpo.step import run_step
    use_spare_cores()

    def by_row(prompts, completions, **kw):
        return [float(i % 3) for i in range(len(completions))]
    tr = run_step(_one_prompt_config(fixtures_dir), reward_funcs={"by_row": by_row})
    assert tr.update is not None and tr.evaluation is not None              # the step itself ran through
    d = tr.diagnostics
    assert d.noise.num_groups == 1 and math.isnan(d.noise.snr) and "batch_size = 1" in d.noise.note
    assert d.group_grad_norms.shape == (1,) and float(d.group_grad_norms[0]) > 0   # what can run, ran
    assert d.group_size is not None and d.entropy is not None and d.gap is not None
    assert any("batch_size = 1" in f for f in tr.flags)
    tr.save(tmp_path / "t")
    back = StepTrace.load(tmp_path / "t")
    page = viz.signal_noise_from_trace(back)._repr_html_()
    assert "batch_size = 1" in page and "Noise scale across groups" in page


def test_one_prompt_report_and_sweep_complete_from_the_cli(tmp_path):
    """`rookworld-debug report` with batch_size=1 on notebook 01's defaults (diagnostics on): every run ok."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "rookworld_debug.cli", "report", "-p", "batch_size=1", "-p", "max_new_tokens=24",
           "-p", "eval_max_new_tokens=8", "-p", "heldout_n=1", "-p", "reward_mode=dataset", "-p", "warmup_steps=0",
           "--sweep-name", "one", "--out", str(tmp_path), "--no-progress"]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    runs = [p for p in (tmp_path / "one").rglob("summary.json")]
    assert len(runs) == 1
    summary = json.loads(runs[0].read_text())
    assert any("batch_size = 1" in f for f in summary["flags"])
    assert "batch_size = 1" in (runs[0].parent / "report.html").read_text()
