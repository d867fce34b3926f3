"""Objective families (grpo/families/): every loss type has one; advantages, the loss table's rows, micro-batch
weighting and per-step preparation come from it; no module outside a family compares a loss-type name of that
family, and the core imports no family module; a family registered in this file alone runs a step."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import rookworld_debug
from rookworld_debug.config import LOSS_TYPES, StepConfig
from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.families import Family, LossRule, advantages_from_config, families, family_of, register
from rookworld_debug.grpo.phases import advantages as adv
from rookworld_debug.settings import Rule, section, setting
from tinymodels import tiny_step_config

PACKAGE = Path(rookworld_debug.__file__).parent
FAMILIES = PACKAGE / "grpo" / "families"


def test_every_loss_type_has_a_family_and_an_unknown_one_is_named():
    assert {family_of(lt).name for lt in LOSS_TYPES} == {"TRL GRPOTrainer", "rookworld-trl manual loop",
                                                          "rookworld-rlvr mini"}
    builtin = {lt for f in families() for lt in f.loss_types if f.name != "toy sign"}
    assert builtin == set(LOSS_TYPES)                 # the config's choices are the registered built-ins
    with pytest.raises(ConfigError, match="no registered objective family"):
        family_of("nope")


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batch_weights_add_up_to_the_full_batch(loss_type):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)   # (n=4, T=3)
    fam = family_of(loss_type)
    rule = fam.rules[loss_type]
    for entropy in (False, True):
        ws = [fam.mb_weight(loss_type, slice(i, i + 2), 4, mask, entropy=entropy) for i in (0, 2)]
        kind = rule.entropy_weighting if entropy else rule.weighting
        assert sum(ws) == pytest.approx(2.0 if kind == "global" else 1.0)
        if kind == "tokens":                          # rows 0-1 hold 3 of the 7 tokens
            assert ws == pytest.approx([3 / 7, 4 / 7])


def _owner_paths() -> dict:
    """loss type → the path prefix of its family's own code (its module, or its package)."""
    out = {}
    for fam in families():
        src = Path(fam.advantages.__code__.co_filename)
        own = src.parent if src.name == "family.py" else src
        for lt in fam.loss_types:
            out[lt] = own
    return out


def _compared_loss_types(tree, names) -> list:
    """(line, loss type) for each comparison (==, !=, in, not in) with a loss-type string literal."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for x in (node.left, *node.comparators):
                for v in ([x] if isinstance(x, ast.Constant) else getattr(x, "elts", [])):
                    if isinstance(v, ast.Constant) and v.value in names:
                        hits.append((node.lineno, v.value))
    return hits


def test_no_loss_type_name_is_compared_outside_its_own_family():
    owners = _owner_paths()
    assert {lt: p.relative_to(PACKAGE).as_posix() for lt, p in owners.items() if lt in LOSS_TYPES} == {
        **dict.fromkeys(("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"), "grpo/families/trl.py"),
        "manual": "grpo/families/manual.py", "rlvr_mini": "grpo/families/rlvr_mini"}
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, lt in _compared_loss_types(ast.parse(path.read_text()), owners):
            own = owners[lt]
            if not (path == own or own in path.parents):
                bad.append(f"{path.relative_to(PACKAGE)}:{line} compares {lt!r}")
    assert not bad, bad


def _own(fam) -> list:
    """A family's own code: its module or package, and its diagnosis checks (the diagnosis layer sits above
    grpo, so they cannot live in the family's package)."""
    own = [_owner_paths()[fam.loss_types[0]]]
    return own + [PACKAGE / "diagnosis" / f"{p.stem}.py" for p in own if (PACKAGE / "diagnosis" / f"{p.stem}.py").exists()]


def _setting_uses(tree, names) -> list:
    """(line, name) for each attribute read `x.<name>` and each string literal `<name>` of a family's setting."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            hits.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and node.value in names:
            hits.append((node.lineno, node.value))
    return hits


def test_no_family_s_setting_is_read_outside_its_own_code():
    """The core and the views reach a family's knobs through its section (generic: the glossary, `rollout`,
    `nullable`), never by name."""
    from rookworld_debug import settings
    bad = []
    for fam in families():
        if fam.settings is None:
            continue
        names = {f for f in fam.settings.__dataclass_fields__}
        own = _own(fam)
        for path in sorted(PACKAGE.rglob("*.py")):
            if path == PACKAGE / "grpo" / "__init__.py":      # its table of moved modules names old module files
                continue
            if any(path == o or o in path.parents for o in own):
                continue
            bad += [f"{path.relative_to(PACKAGE)}:{line} {name}" for line, name in
                    _setting_uses(ast.parse(path.read_text()), names)]
    assert not bad, bad
    assert {c.SECTION for c in settings.sections()} == {"manual", "rlvr_mini"}
    assert _setting_uses(ast.parse("c.rlvr_kl_type; d = {'manual_adv_clip': 1}"),
                         {"rlvr_kl_type", "manual_adv_clip"}) == [(1, "rlvr_kl_type"), (1, "manual_adv_clip")]


def test_the_core_config_declares_no_family_s_knob_or_formula():
    """config.py and its rules name no family's loss type or setting; a family's section cannot take a core name."""
    from rookworld_debug import config, config_rules, settings
    text = Path(config.__file__).read_text() + Path(config_rules.__file__).read_text()
    for fam in families():
        if fam.name == "TRL GRPOTrainer":                 # TRL's GRPOConfig is the core's convention
            continue
        said = [lt for lt in fam.loss_types if f"'{lt}'" in text or f'"{lt}"' in text]
        said += [n for n in (fam.settings.__dataclass_fields__ if fam.settings else ()) if n in text]
        assert not said, (fam.name, said)
    assert not set(config.core_field_names()) & {n for c in settings.sections() for n in c.__dataclass_fields__}
    assert len(text.splitlines()) <= 600 and len(Path(config.__file__).read_text().splitlines()) <= 400


def test_each_family_s_own_knobs_are_a_config_section_of_their_own():
    groups = {name: e["group"] for name, e in StepConfig.glossary().items()}
    assert {n for n, g in groups.items() if g == "manual"} == {"manual_std_clamp", "manual_adv_clip"}
    assert {n for n, g in groups.items() if g == "rlvr_mini"} == {n for n in groups if n.startswith("rlvr_")}
    from rookworld_debug.cli_step import config_keys_help
    headers = [line.strip() for line in config_keys_help().splitlines() if line.startswith("  [")]
    assert len(headers) == len(set(headers)) and {"[manual]", "[rlvr_mini]"} <= set(headers)   # each once


def test_the_scan_sees_a_comparison():
    tree = ast.parse("if lo.loss_type == 'manual' or x in ('grpo', 'y'): pass")
    assert _compared_loss_types(tree, {"manual", "grpo"}) == [(1, "manual"), (1, "grpo")]


def test_advantages_come_from_the_family():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    cfg = StepConfig(num_generations=2)
    assert torch.equal(advantages_from_config(r, cfg).advantages,
                       adv.compute_advantages(r, 2, scale_rewards=cfg.scale_rewards, eps=cfg.adv_eps,
                                              std_ddof=cfg.std_ddof, clip=cfg.adv_clip).advantages)
    m = cfg.replace(loss_type="manual")
    assert advantages_from_config(r, m).method == "manual"


def test_a_family_registered_in_test_code_answers_its_loss_type(registry_restored):
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate
    toy = register(Family("toy", {"toy_loss": LossRule("rows", clipped_surrogate, fixed_length)},
                          lambda rewards, config: rewards))
    assert family_of("toy_loss") is toy and toy.mb_weight("toy_loss", slice(0, 1), 4, torch.ones(4, 2)) == 0.25
    with pytest.raises(ValueError, match="weighting"):
        register(Family("bad", {"x": LossRule("per-moon")}, lambda r, c: r))


# ------------------------------------------------------------------ a new family, in test code alone
def _sign_advantages(rewards, config):
    """The toy's advantages: the sign of r − mean_g (what a rank-based trainer would push)."""
    import dataclasses
    a = adv.compute_advantages(rewards, config.num_generations, scale_rewards="none", eps=config.adv_eps,
                               std_ddof=config.std_ddof)
    scale = config.toy_sign_scale                        # its own setting, read flat
    return dataclasses.replace(a, advantages=scale * torch.sign(a.advantages), method="toy_sign",
                               normalization=f"A = {scale:g}·sign(r − mean_g)")


@section("toy_sign")
class ToySettings:
    """The toy's one knob."""
    toy_sign_scale: float = setting(1.0, "toy_sign: the size of every advantage, |A| (0 < it ≤ 10).")
    RULES = (Rule("toy_sign_scale", lambda c: 0 < c.toy_sign_scale <= 10, "must be in (0, 10]"),)


def _sign_text(ob, params, ratio):
    return f"{ratio}; PG = −min(r·sign(A), clip(r)·sign(A))"


def test_a_toy_family_registered_in_test_code_runs_a_step(tiny_byte_model_dir, fixtures_dir, registry_restored, tmp_path):
    import warnings

    from rookworld_debug.grpo.step import run_step

    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate
    # the whole family: PPO's clipped surrogate on sign advantages, Dr. GRPO's constant normaliser, one knob
    register(Family("toy sign", {"toy_sign": LossRule("rows", clipped_surrogate, fixed_length, text=_sign_text,
                                                      help="sign advantages, PPO's clip, Dr. GRPO's normaliser.")},
                    _sign_advantages, settings=ToySettings,
                    metric_definitions={"toy/sign_share": "share of rows whose advantage is not 0 (rollout)."}))
    from rookworld_debug.metrics import definition
    assert definition("toy/sign_share").startswith("share of rows") and definition("rlvr/kl_coef")
    cfg = tiny_step_config(tiny_byte_model_dir, loss_type="toy_sign", dataset=str(fixtures_dir / "rook_p_lines.txt"),
                           eval_max_new_tokens=4, micro_batch_size=2, toy_sign_scale=0.5)
    g = StepConfig.glossary()
    assert g["toy_sign_scale"]["group"] == "toy_sign" and "'toy_sign': sign advantages" in g["loss_type"]["help"]
    assert StepConfig.from_dict(cfg.to_dict()) == cfg and cfg.replace(toy_sign_scale=2.0).toy_sign_scale == 2.0
    with pytest.raises(ConfigError, match="toy_sign_scale: must be in"):
        cfg.replace(toy_sign_scale=11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = run_step(cfg)
    assert t.advantages.method == "toy_sign" and set(t.advantages.advantages.tolist()) <= {-0.5, 0.0, 0.5}
    assert t.loss.loss_type == "toy_sign" and t.update is not None and "sign(A)" in t.loss.definition
    assert t.loss.normalizer.description.startswith("toy_sign: N·L_max")
    assert t.iterations[0].updates[0].loss_record_diff <= 1e-5       # the optimized loss is the displayed one
    from rookworld_debug.grpo.step import StepTrace
    assert StepTrace.load(t.save(tmp_path / "toy")).config.toy_sign_scale == 0.5     # stored flat in the trace
    assert not [f for f in t.flags if "differs from the displayed" in f]


@pytest.mark.parametrize("loss_type,flagged", [("grpo", True), ("sapo", True), ("manual", True), ("dapo", False),
                                               ("dr_grpo", False), ("bnpo", False), ("rlvr_mini", False)])
def test_length_bias_follows_the_aggregation_not_a_list_of_names(loss_type, flagged):
    """The finding fires on loss types whose aggregation averages each row over its own length (the mechanism),
    whatever family they belong to."""
    from types import SimpleNamespace

    from rookworld_debug.diagnosis.checks_update import check_length_bias
    lengths = torch.tensor([2, 9, 3, 12, 4, 10, 2, 11])                              # (N,) varied: cv > 0.2
    mask = (torch.arange(12)[None, :] < lengths[:, None]).float()                    # (N, T)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.7, -0.7])                # (N,)
    loss = SimpleNamespace(loss_type=loss_type, advantages=adv)
    trace = SimpleNamespace(loss=loss, rollout=SimpleNamespace(completion_mask=mask), capture=None)
    found = check_length_bias(trace)
    assert bool(found) is flagged and all(f.code == "length_bias" for f in found)


def _bad_sections():
    @section("bare")
    class Bare:
        x_plain: float = 1.0                                          # no setting(): no help, no checks

    @section("takes_beta")
    class TakesBeta:
        beta: float = setting(0.1, "a core setting, declared again")

    @section("takes_mini")
    class TakesMini:
        rlvr_kl_type: str = setting("forward", "the mini's setting, declared again")

    @section("bad_default")
    class BadDefault:
        y_scale: float = setting(-1.0, "a default its own rule refuses")
        RULES = (Rule("y_scale", lambda c: c.y_scale > 0, "must be > 0"),)

    @section("Bad Name")
    class BadName:
        z_scale: float = setting(1.0, "a fine setting under a name that is not one")

    class NotASection:
        pass
    return [(Bare, "lack setting"), (TakesBeta, "already name other settings"),
            (TakesMini, "already name other settings"), (BadDefault, "defaults do not build"),
            (BadName, "is not a name"), (NotASection, "made with @section")]


@pytest.mark.parametrize("i", range(6))
def test_a_bad_settings_section_is_refused_by_name_and_changes_nothing(i, registry_restored):
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate
    cls, why = _bad_sections()[i]
    before = StepConfig.field_names()
    with pytest.raises(ConfigError, match=f"family 'bad settings'.*{why}"):
        register(Family("bad settings", {"bad_settings_loss": LossRule("rows", clipped_surrogate, fixed_length)},
                        lambda r, c: r, settings=cls))
    from rookworld_debug.settings import loss_types
    assert StepConfig.field_names() == before and "bad_settings_loss" not in loss_types()
    with pytest.raises(ConfigError, match="loss_type"):
        StepConfig(loss_type="bad_settings_loss")
    with pytest.raises(ConfigError, match="no settings section 'nope'"):
        StepConfig().section("nope")


def test_a_family_rule_that_cannot_read_a_value_is_a_named_error(registry_restored):
    """A family's own rule that raises (here 1/0) gives a ConfigError naming the setting, not a bare traceback."""
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate

    @section("inverse")
    class Inverse:
        inv_width: float = setting(1.0, "inverse: a width whose inverse must be below 10.")
        RULES = (Rule("inv_width", lambda c: 1 / c.inv_width < 10, "its inverse must be below 10"),)

    register(Family("inverse", {"inverse_loss": LossRule("rows", clipped_surrogate, fixed_length)},
                    lambda r, c: r, settings=Inverse))
    with pytest.raises(ConfigError, match=r"inv_width: its check could not read 0\.0 \(ZeroDivisionError"):
        StepConfig(loss_type="inverse_loss", inv_width=0)
    assert StepConfig(loss_type="inverse_loss", inv_width=0.5).inv_width == 0.5


def test_a_settings_section_or_a_copied_family_cannot_take_a_built_in_s_place_silently(registry_restored):
    """A new family whose section is named like the mini's, or a copy of TRL's family with one rule changed under
    the same name, is refused without replace=True; the built-in knobs and rules stay."""
    import dataclasses
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.terms import clipped_surrogate

    @section("rlvr_mini")
    class Clash:
        """A section named like a built-in one."""
        clash_knob: float = setting(1.0, "clash_knob: a knob (> 0).")
    with pytest.raises(ConfigError, match="already declared"):
        register(Family("clash", {"clash_loss": LossRule("rows", clipped_surrogate, fixed_length)},
                        lambda r, c: r, settings=Clash))
    assert StepConfig(loss_type="rlvr_mini").rlvr_kl_type            # the mini's knobs are still there
    trl = family_of("grpo")
    copy = dataclasses.replace(trl, rules={**trl.rules, "grpo": dataclasses.replace(trl.rules["grpo"],
                                                                                    aggregation=fixed_length)})
    with pytest.raises(ConfigError, match="already answered"):
        register(copy)
    assert family_of("grpo").rules["grpo"].aggregation is trl.rules["grpo"].aggregation


def test_an_objective_hook_that_returns_nothing_is_named(registry_restored):
    from rookworld_debug.grpo.objective.aggregation import fixed_length
    from rookworld_debug.grpo.objective.loss import compute_loss
    from rookworld_debug.grpo.objective.params import Objective
    register(Family("hollow", {"hollow_loss": LossRule("rows", lambda inputs: None, fixed_length)},
                    lambda rewards, config: rewards))
    ob = Objective.from_config(StepConfig(loss_type="hollow_loss", beta=0.0))
    with pytest.raises(ConfigError, match="hollow.*hollow_loss objective.*PolicyTerm"):
        compute_loss(torch.zeros(2, 3), None, None, torch.zeros(2), torch.ones(2, 3), ob)
