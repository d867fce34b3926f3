"""compute_advantages vs TRL as the oracle.

Oracle: TRL's REAL `GRPOTrainer._generate_and_score_completions` runs on a model-free trainer
(`object.__new__(GRPOTrainer)` + attribute stubs, TRL's own test pattern): `_generate` and
`_calculate_rewards` are stubbed to return fixed completions and our rewards, everything after that
(nanmean/nanstd grouping, scale_rewards, +1e-4, nan_to_num, frac_reward_zero_std, reward/reward_std
metrics) is TRL's own code. `trl.trainer.utils.nanstd` is also compared directly.
"""
import types
from collections import defaultdict

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd as trl_nanstd  # noqa: E402

from rookworld_debug.config import StepConfig  # noqa: E402
from rookworld_debug.errors import ConfigError  # noqa: E402
from rookworld_debug.grpo.families.manual import manual_advantages  # noqa: E402
from rookworld_debug.grpo.phases.advantages import Advantages, compute_advantages, nanstd  # noqa: E402
from rookworld_debug.grpo.families import advantages_from_config  # noqa: E402

NAN = float("nan")


class _Accelerator:
    device = torch.device("cpu")
    num_processes = 1
    process_index = 0

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def trl_advantages(rewards: torch.Tensor, G: int, scale_rewards: str = "group"):
    """Run TRL's real _generate_and_score_completions on stubbed generation/rewards; return
    (advantages (N,), logged metrics)."""
    N = rewards.numel()
    t = object.__new__(GRPOTrainer)
    t.accelerator = _Accelerator()
    t.model = types.SimpleNamespace(training=True, is_gradient_checkpointing=False)
    t.environment_factories = None
    t.environments = None
    t.tools = None
    comp_ids = [[7, 8, 9][: 1 + i % 3] for i in range(N)]
    t._generate = lambda prompts: ([[5, 6]] * N, comp_ids, None, ["c"] * N, None, {}, None, None)
    t._tokenizer = types.SimpleNamespace(pad_token_id=0)
    t.pad_to_multiple_of = None
    t.mask_truncated_completions = False
    t.args = types.SimpleNamespace(per_device_train_batch_size=N, steps_per_generation=1,
                                   gradient_accumulation_steps=1, gradient_checkpointing_kwargs=None)
    t.num_iterations = 1
    t.use_vllm = False
    t.vllm_importance_sampling_correction = False
    t.beta = 0.0
    t._calculate_rewards = lambda inputs, prompts, completions, ids: rewards.view(-1, 1).clone()
    t.num_generations = G
    t.multi_objective_aggregation = "sum_then_normalize"
    t.reward_weights = torch.ones(1)
    t.scale_rewards = scale_rewards
    t.reward_func_names = ["r"]
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t._logs = {"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
               "extra": defaultdict(list), "images": []}
    t._pending_extra_logs = {}
    t._pending_metrics = {}
    t.log_multimodal = False
    out = t._generate_and_score_completions([{"prompt": f"p{i // G}"} for i in range(N)])
    return out["advantages"], {k: v[-1] for k, v in t._metrics["train"].items()}


def _rewards(seed: int, B: int, G: int) -> torch.Tensor:
    """Random rewards with the awkward cases: a constant group (zero std), a group with one NaN, a group with
    a single valid reward, an all-NaN group, discrete RookWorld-like reward levels."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(-2, 3, (B, G), generator=g).float() * 0.25 + torch.rand(B, G, generator=g) * (seed % 2)
    if B > 1:
        r[1] = 0.5                                     # zero-std group
    if B > 2:
        r[2, 0] = NAN                                  # unscorable completion
    if B > 3:
        r[3, 1:] = NAN                                 # one valid reward → std NaN
    if B > 4:
        r[4] = NAN                                     # all unscorable
    return r.reshape(-1)


CASES = [(s, B, G) for s, (B, G) in enumerate([(6, 4), (5, 2), (6, 3), (8, 8), (1, 4), (4, 4)])]


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("seed,B,G", CASES)
def test_matches_trl(scale_rewards, seed, B, G):
    r = _rewards(seed, B, G)
    expected, metrics = trl_advantages(r, G, scale_rewards)
    got = compute_advantages(r, G, scale_rewards=scale_rewards)
    torch.testing.assert_close(got.advantages, expected, rtol=1e-6, atol=1e-6)
    assert got.frac_reward_zero_std == pytest.approx(metrics["frac_reward_zero_std"], abs=1e-7)
    m = got.metrics
    for key in ("reward", "reward_std"):
        assert m[key] == pytest.approx(metrics[key], rel=1e-6, nan_ok=True), key


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_matches_trl_bitwise_on_float32(scale_rewards):
    r = _rewards(11, 6, 4)
    expected, _ = trl_advantages(r, 4, scale_rewards)
    got = compute_advantages(r, 4, scale_rewards=scale_rewards).advantages
    assert torch.equal(got, expected)


def test_zero_std_groups_follow_trl_isclose_rule():
    r = _rewards(0, 6, 4)
    a = compute_advantages(r, 4)
    # TRL's is_std_zero = isclose(group nanstd, 0) per sample: oracle via trl's own nanstd
    std = trl_nanstd(r.view(-1, 4), dim=1)
    expected = tuple(int(i) for i in torch.nonzero(torch.isclose(std, torch.zeros_like(std))).flatten())
    assert a.zero_std_groups == expected == (1,)
    assert torch.all(a.grouped[1] == 0)
    _, metrics = trl_advantages(r, 4, "group")
    assert a.frac_reward_zero_std == pytest.approx(metrics["frac_reward_zero_std"])
    assert any("zero reward std" in f for f in a.flags)


def test_all_groups_zero_std():
    r = torch.tensor([1.0] * 4 + [0.0] * 4)
    a = compute_advantages(r, 4)
    expected, metrics = trl_advantages(r, 4, "group")
    assert torch.equal(a.advantages, expected)
    assert a.zero_std_groups == (0, 1)
    assert a.frac_reward_zero_std == metrics["frac_reward_zero_std"] == 1.0
    assert any("all groups" in f for f in a.flags)


def test_nan_rewards_flagged_and_zeroed():
    r = _rewards(0, 6, 4)
    a = compute_advantages(r, 4)
    nan_rows = tuple(int(i) for i in torch.nonzero(torch.isnan(r)).flatten())
    assert a.nan_reward_indices == nan_rows
    assert torch.all(a.advantages[list(nan_rows)] == 0)
    assert 3 in a.degenerate_groups and 4 in a.degenerate_groups
    assert a.n_nan_advantages_zeroed >= len(nan_rows)
    assert torch.isfinite(a.advantages).all()
    assert any("NaN reward" in f for f in a.flags)


def test_nanstd_equals_trl():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=g)
    x[0, 1] = NAN
    x[2, :4] = NAN
    x[3] = NAN
    torch.testing.assert_close(nanstd(x, dim=1), trl_nanstd(x, dim=1), equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(nanstd(x), trl_nanstd(x), equal_nan=True, rtol=1e-7, atol=0)


def test_record_contents():
    r = torch.tensor([0.0, 1.0, 0.5, 0.5, 1.0, 1.0, 1.0, 0.0])
    a = compute_advantages(r, 4)
    assert isinstance(a, Advantages)
    assert a.advantages.shape == (8,) and a.group_mean.shape == (2,) and a.group_std.shape == (2,)
    torch.testing.assert_close(a.group_mean, r.view(2, 4).mean(1))
    torch.testing.assert_close(a.group_std, r.view(2, 4).std(1))               # unbiased (n−1)
    torch.testing.assert_close(a.denominator, a.group_std.repeat_interleave(4) + 1e-4)
    assert a.normalization == "A=(r-mean_g)/(std_g(ddof=1)+0.0001), scale_rewards=group, NaN→0"
    assert a.method == "trl" and a.flags == ()
    with pytest.raises(Exception):
        a.advantages = None                                                       # frozen
    b = compute_advantages(r, 4, scale_rewards="batch")
    assert "std_batch(ddof=1)" in b.normalization
    assert compute_advantages(r, 4, scale_rewards="none").normalization.startswith("A=r-mean_g")


def test_clip_counts_and_ddof0_extension():
    r = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    expected, _ = trl_advantages(r, 4, "group")
    a = compute_advantages(r, 4, clip=1.0)
    torch.testing.assert_close(a.advantages, expected.clamp(-1.0, 1.0))
    assert a.n_clipped_high == int((expected > 1).sum()) and a.n_clipped_low == int((expected < -1).sum())
    assert a.n_clipped_high + a.n_clipped_low > 0
    d0 = compute_advantages(r, 4, std_ddof=0)
    pop = r.view(2, 4).std(1, unbiased=False).repeat_interleave(4)
    torch.testing.assert_close(d0.advantages, (r - r.view(2, 4).mean(1).repeat_interleave(4)) / (pop + 1e-4))


def test_accepts_lists_and_ints():
    a = compute_advantages([1, 0, 1, 0], 2)
    expected, _ = trl_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), 2)
    torch.testing.assert_close(a.advantages, expected)


def _seeds_manual(r: torch.Tensor, G: int, s_min: float, clip: float) -> torch.Tensor:
    """The seeds' code path (manual_grpo_debug.py §3.4), written as a per-group loop."""
    out = []
    for grp in r.view(-1, G):
        mean, std = grp.mean(), grp.std()                                          # unbiased
        out.append(torch.clamp((grp - mean) / torch.clamp(std, min=s_min), -clip, clip))
    return torch.cat(out)


@pytest.mark.parametrize("s_min,clip", [(0.05, 2.0), (1e-6, 2.0), (0.05, 1.0)])
def test_manual_matches_seeds_formula(s_min, clip):
    g = torch.Generator().manual_seed(5)
    r = torch.rand(5, 4, generator=g)
    r[1] = torch.tensor([0.5, 0.5, 0.5, 0.51])                                     # std < clamp
    r[2] = 0.3                                                                     # zero std
    r[3] = torch.tensor([0.0, 0.0, 0.0, 1.0])                                      # hits the clip
    r = r.reshape(-1)
    a = manual_advantages(r, 4, std_clamp=s_min, clip=clip)
    torch.testing.assert_close(a.advantages, _seeds_manual(r, 4, s_min, clip))
    assert a.method == "manual" and 2 in a.zero_std_groups
    assert a.normalization.startswith(f"A=clip((r-mean_g)/max(std_g(ddof=1),{s_min:g}),±{clip:g})")


def test_manual_nan_reward_zeroed():
    r = torch.tensor([1.0, NAN, 0.0, 0.5])
    a = manual_advantages(r, 4)
    assert a.advantages[1] == 0 and torch.isfinite(a.advantages).all() and a.nan_reward_indices == (1,)


def test_from_config_dispatch():
    r = _rewards(2, 4, 4)
    cfg = StepConfig()
    torch.testing.assert_close(advantages_from_config(r, cfg).advantages, trl_advantages(r, 4)[0])
    m = advantages_from_config(r, cfg.replace(loss_type="manual"))
    assert m.method == "manual"
    b = advantages_from_config(r, cfg.replace(scale_rewards="batch"))
    torch.testing.assert_close(b.advantages, trl_advantages(r, 4, "batch")[0])


@pytest.mark.parametrize("kwargs,field", [
    (dict(scale_rewards="global"), "scale_rewards"),
    (dict(std_ddof=2), "std_ddof"),
    (dict(eps=-1.0), "adv_eps"),
    (dict(clip=0.0), "adv_clip"),
])
def test_bad_arguments(kwargs, field):
    with pytest.raises(ConfigError) as e:
        compute_advantages(torch.zeros(8), 4, **kwargs)
    assert e.value.field == field


def test_bad_group_size():
    with pytest.raises(ConfigError, match="num_generations"):
        compute_advantages(torch.zeros(7), 4)
    with pytest.raises(ConfigError, match="num_generations"):
        manual_advantages(torch.zeros(4), 1)
