"""StepConfig: defaults, TRL conventions, validation naming the field, dict round-trips, glossary."""
import dataclasses
import json

import pytest

from rookworld_debug.config import StepConfig
from rookworld_debug.errors import ConfigError


def test_defaults_follow_the_seeds_debug_run():
    c = StepConfig()
    assert (c.batch_size, c.num_generations, c.beta, c.lr) == (4, 4, 0.1, 1e-6)
    assert (c.adam_betas, c.adam_eps, c.weight_decay, c.max_grad_norm) == ((0.9, 0.999), 1e-8, 0.0, 1.0)
    assert c.sampling_for("P") == (0.5, 0.9, 0)
    assert c.sampling_for("A") == (0.95, 0.95, 0)
    assert (c.manual_std_clamp, c.manual_adv_clip) == (0.05, 2.0)
    assert c.num_completions == 16 and c.gradient_accumulation_steps == 1


def test_conventions_default_to_trl():
    """Every convention StepConfig shares with TRL's GRPOConfig has TRL's installed default."""
    trl = pytest.importorskip("trl")
    fields = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    c = StepConfig()
    assert c.loss_type == fields["loss_type"]
    assert c.scale_rewards == fields["scale_rewards"]
    assert c.importance_sampling_level == fields["importance_sampling_level"]
    assert c.epsilon_low == fields["epsilon"]
    assert c.epsilon_high == (fields["epsilon_high"] if fields["epsilon_high"] is not None else fields["epsilon"])
    assert c.delta == fields["delta"]
    assert c.top_k == fields["top_k"]
    assert c.entropy_coef == fields["entropy_coef"]
    assert c.mask_truncated_completions == fields["mask_truncated_completions"]
    assert c.use_bias_correction_kl == fields["use_bias_correction_kl"]
    assert c.max_grad_norm == fields["max_grad_norm"]
    assert c.lr == fields["learning_rate"]
    assert (c.adam_betas, c.adam_eps, c.weight_decay) == (
        (fields["adam_beta1"], fields["adam_beta2"]), fields["adam_epsilon"], fields["weight_decay"])


def test_frozen_and_replace():
    c = StepConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.beta = 0.0
    d = c.replace(beta=0.0, loss_type="grpo")
    assert (d.beta, d.loss_type, c.beta) == (0.0, "grpo", 0.1)
    with pytest.raises(ConfigError, match="betta"):
        c.replace(betta=0.0)
    with pytest.raises(ConfigError) as e:
        c.replace(num_generations=1)                                  # validated like construction
    assert e.value.field == "num_generations"


def test_dict_round_trip_is_json_and_papermill_friendly():
    c = StepConfig(prompt_indices=(3, 1, 4, 5), delta=1.5, micro_batch_size=8, task="mixed", seed=7)
    d = c.to_dict()
    assert list(d) == list(StepConfig.field_names())
    assert d["prompt_indices"] == [3, 1, 4, 5] and d["adam_betas"] == [0.9, 0.999]
    back = StepConfig.from_dict(json.loads(json.dumps(d)))
    assert back == c and back.to_dict() == d
    assert StepConfig.from_dict({}) == StepConfig()
    assert StepConfig.from_dict({"beta": 0, "lr": 1}).beta == 0.0              # ints accepted for floats
    assert isinstance(StepConfig.from_dict({"beta": 0}).beta, float)


def test_from_dict_rejects_unknown_keys_naming_them():
    with pytest.raises(ConfigError) as e:
        StepConfig.from_dict({"beta": 0.1, "temprature": 1.0, "kl_coef": 0.2})
    assert "kl_coef" in str(e.value) and "temprature" in str(e.value)
    assert "beta" not in e.value.field


def test_trl_bool_scale_rewards_is_mapped():
    assert StepConfig(scale_rewards=True).scale_rewards == "group"
    assert StepConfig(scale_rewards=False).scale_rewards == "none"


def test_a_family_refuses_what_it_cannot_run_before_anything_loads():
    from rookworld_debug.grpo.families import check_settings
    cfg = StepConfig(num_generations=1, scale_rewards="none", loss_type="manual")     # fine for StepConfig
    with pytest.raises(ConfigError, match="num_generations.*manual advantages"):
        check_settings(cfg)                      # rookworld-trl's manual advantages divide by the group std
    with pytest.raises(ConfigError, match="rlvr_pitfalls.*only rookworld-rlvr mini"):
        check_settings(StepConfig(loss_type="grpo", rlvr_pitfalls=("train_past_eos",)))
    check_settings(StepConfig(loss_type="rlvr_mini", reward_mode="rlvr", rlvr_pitfalls=("train_past_eos",)))


# a knob of each family's own section, away from its default
OTHER_FAMILY_KNOBS = [("manual_std_clamp", 0.5, "manual"), ("manual_adv_clip", None, "manual"),
                      ("rlvr_kl_type", "reverse", "rlvr_mini"), ("rlvr_baseline", "ema", "rlvr_mini"),
                      ("rlvr_pitfalls", ("train_past_eos",), "rlvr_mini")]


@pytest.mark.parametrize("knob,value,own", OTHER_FAMILY_KNOBS)
def test_a_knob_of_another_family_is_refused_the_same_way_for_every_family(knob, value, own):
    from rookworld_debug.grpo.families import check_settings
    from rookworld_debug.settings import loss_types
    for lt in [t for t in loss_types() if t != own and not (own == "rlvr_mini" and t == "rlvr_mini")]:
        with pytest.raises(ConfigError, match=f"{knob}.*only .* reads it.*loss_type='{lt}' would ignore it"):
            check_settings(StepConfig(loss_type=lt, **{knob: value}))


BAD = [
    ("num_generations", dict(num_generations=1)),                     # G < 2 with std scaling
    ("num_generations", dict(num_generations=1, scale_rewards="batch")),
    ("num_generations", dict(num_generations=0, scale_rewards="none")),
    ("max_new_tokens", dict(max_new_tokens=0)),
    ("max_new_tokens", dict(max_new_tokens=-5)),
    ("max_new_tokens", dict(max_new_tokens=2.5)),
    ("loss_type", dict(loss_type="ppo")),
    ("kl_estimator", dict(kl_estimator="k4")),
    ("scale_rewards", dict(scale_rewards="global")),
    ("importance_sampling_level", dict(importance_sampling_level="group")),
    ("task", dict(task="B")),
    ("reward_mode", dict(reward_mode="oracle")),
    ("dtype", dict(dtype="int8")),
    ("p_temperature", dict(p_temperature=0.0)),
    ("a_temperature", dict(a_temperature=-1.0)),
    ("p_top_p", dict(p_top_p=0.0)),
    ("a_top_p", dict(a_top_p=1.01)),
    ("top_k", dict(top_k=-1)),
    ("lr", dict(lr=-1e-6)),
    ("lr", dict(lr=float("nan"))),
    ("epsilon_low", dict(epsilon_low=-0.1)),
    ("epsilon_high", dict(epsilon_high=-0.1)),
    ("beta", dict(beta=-0.01)),
    ("beta", dict(beta="0.1")),
    ("delta", dict(delta=0.0)),
    ("batch_size", dict(batch_size=0)),
    ("batch_size", dict(batch_size=True)),
    ("adv_eps", dict(adv_eps=-1e-4)),
    ("std_ddof", dict(std_ddof=2)),
    ("adv_clip", dict(adv_clip=0.0)),
    ("manual_std_clamp", dict(manual_std_clamp=-0.05)),
    ("manual_adv_clip", dict(manual_adv_clip=-2.0)),
    ("adam_betas", dict(adam_betas=(0.9,))),
    ("adam_betas", dict(adam_betas=(0.9, 1.0))),
    ("adam_eps", dict(adam_eps=0.0)),
    ("weight_decay", dict(weight_decay=-0.1)),
    ("max_grad_norm", dict(max_grad_norm=0.0)),
    ("micro_batch_size", dict(micro_batch_size=0)),
    ("micro_batch_size", dict(micro_batch_size=5)),                    # does not divide N = 16
    ("micro_batch_size", dict(micro_batch_size=32)),
    ("prompt_indices", dict(prompt_indices=(1, 2))),                   # length ≠ batch_size
    ("prompt_indices", dict(prompt_indices=(1, 2, 3, -1))),
    ("prompt_indices", dict(prompt_indices=("a", 2, 3, 4))),
    ("seed", dict(seed=-1)),
    ("engine_depth", dict(engine_depth=0)),
    ("engine_multipv", dict(engine_multipv=0)),
    ("engine_workers", dict(engine_workers=0)),
    ("heldout_n", dict(heldout_n=-1)),
    ("eval_max_new_tokens", dict(eval_max_new_tokens=0)),
    ("top_k_alternatives", dict(top_k_alternatives=-1)),
    ("device", dict(device="gpu")),
    ("model", dict(model="")),
    ("use_bias_correction_kl", dict(use_bias_correction_kl="yes")),
    ("mask_truncated_completions", dict(mask_truncated_completions=1)),
]


@pytest.mark.parametrize("field,kwargs", BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_impossible_values_rejected_naming_the_field(field, kwargs):
    with pytest.raises(ConfigError) as e:
        StepConfig(**kwargs)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ")
    with pytest.raises(ConfigError):                                  # the papermill path too
        StepConfig.from_dict(kwargs)


def test_valid_edge_values_accepted():
    StepConfig(num_generations=1, scale_rewards="none")               # mean-only baseline is legal
    StepConfig(epsilon_low=0.0, epsilon_high=0.0, beta=0.0, lr=0.0, top_k=50, p_top_p=1.0)
    StepConfig(delta=None, adv_clip=None, max_grad_norm=None, micro_batch_size=4, device="cuda:1")
    StepConfig(entropy_coef=-0.01)                                     # an entropy penalty is allowed


def test_sampling_for_rejects_mixed():
    with pytest.raises(ConfigError) as e:
        StepConfig(task="mixed").sampling_for("mixed")
    assert e.value.field == "task"


def test_glossary_documents_every_field():
    g = StepConfig.glossary()
    assert list(g) == list(StepConfig.field_names())
    for name, entry in g.items():
        assert len(entry["help"]) > 15, name
        assert entry["group"], name
    assert g["loss_type"]["choices"] == ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo", "manual",
                                         "rlvr_mini")
    md = StepConfig.glossary_markdown()
    assert md.count("\n") == len(g) + 1 and "`max_new_tokens`" in md
