"""What TRL's sampler did, named from the GRPOConfig a capture recorded (diagnosis/checks_trl_generation.py): greedy
decoding through generation_kwargs, a temperature that generation_kwargs overrides for sampling only, and sampler
settings that reweight the policy's distribution (a repetition penalty, a forced minimum length). The config of a
real capture is varied for the check; one real TRL run with do_sample=False is diagnosed end to end."""
from __future__ import annotations

import dataclasses
import json

import pytest

from cli import run_cli

from rookworld_debug.diagnosis.checks_trl_generation import check_trl_generation
from rookworld_debug.grpo.step import StepTrace


@pytest.fixture(scope="module")
def capture(trl_checkpointed_run):
    return StepTrace.load(trl_checkpointed_run / "captures" / "step-000002")


def _with(trace, **settings):
    cap = trace.capture
    return dataclasses.replace(trace, capture=dataclasses.replace(cap, grpo_config={**cap.grpo_config, **settings}))


def _codes(trace):
    return {f.code: f for f in check_trl_generation(trace)}


def test_a_healthy_capture_gets_nothing(capture):
    assert check_trl_generation(capture) == []
    # top_k / top_p / min_p filter the distribution the loss scores: TRL's design, no finding
    assert check_trl_generation(_with(capture, top_k=5, top_p=0.9, min_p=0.05)) == []
    # generation_kwargs that repeat what GRPOConfig says change nothing
    t = capture.capture.grpo_config["temperature"]
    assert check_trl_generation(_with(capture, generation_kwargs={"temperature": t, "do_sample": True})) == []


def test_greedy_through_generation_kwargs_is_named_with_its_key(capture):
    f = _codes(_with(capture, generation_kwargs={"do_sample": False, "max_new_tokens": 48}))["sampling_greedy"]
    assert f.severity == "error" and "GRPOConfig.generation_kwargs['do_sample'] = False" in f.cause
    assert f.fix.grpo_config == {"generation_kwargs": {"max_new_tokens": 48}}


def test_a_temperature_overridden_for_sampling_only_is_an_error_naming_both(capture):
    t = capture.capture.grpo_config["temperature"]
    f = _codes(_with(capture, generation_kwargs={"temperature": t / 2}))["sampler_temperature_override"]
    assert f.severity == "error" and f"= {t / 2:g}" in f.cause and f"GRPOConfig.temperature = {t:g}" in f.cause
    assert {e.name: e.value for e in f.evidence} == {"sampling_temperature": t / 2, "loss_temperature": t}


@pytest.mark.parametrize("settings, key", [
    ({"repetition_penalty": 1.3}, "GRPOConfig.repetition_penalty = 1.3"),
    ({"generation_kwargs": {"min_new_tokens": 20}}, "GRPOConfig.generation_kwargs['min_new_tokens'] = 20"),
    ({"generation_kwargs": {"repetition_penalty": 1.2}}, "GRPOConfig.generation_kwargs['repetition_penalty'] = 1.2"),
])
def test_a_reweighting_sampler_setting_is_a_warning_naming_its_key(capture, settings, key):
    f = _codes(_with(capture, **settings))["sampler_distribution_changed"]
    assert f.severity == "warning" and key in f.cause, f.cause


def test_a_budget_in_generation_kwargs_below_max_completion_length_is_named(capture):
    cap = capture.capture.grpo_config["max_completion_length"]
    f = _codes(_with(capture, generation_kwargs={"max_new_tokens": 4, "top_k": 0}))["completion_cut_early"]
    assert f.severity == "error" and "GRPOConfig.generation_kwargs['max_new_tokens'] = 4" in f.cause
    assert f"max_completion_length = {cap}" in f.cause and f.fix.grpo_config == {"generation_kwargs": {"top_k": 0}}
    # a budget at or above the configured one cuts nothing
    assert "completion_cut_early" not in _codes(_with(capture, generation_kwargs={"max_new_tokens": cap}))


def test_stop_ids_in_generation_kwargs_the_trainer_does_not_end_at_are_named(capture):
    trainer_eos = capture.capture.generation_config.get("eos_token_id")
    assert trainer_eos is not None                               # the policy's own: what the trainer cuts at
    row0 = int(capture.rollout.completion_ids[0, 0])             # an id the rows hold: they stopped on it
    f = _codes(_with(capture, generation_kwargs={"eos_token_id": [trainer_eos, row0]}))["stop_token_not_trainer_eos"]
    assert f.severity == "error" and f"[{row0}]" in f.cause and f.fix.grpo_config == {"generation_kwargs": None}
    # the trainer's own EOS listed again changes nothing
    assert "stop_token_not_trainer_eos" not in _codes(_with(capture, generation_kwargs={"eos_token_id": trainer_eos}))


def test_a_checkpoints_generation_config_key_is_named_where_it_comes_from(capture):
    cap = capture.capture
    banned = dataclasses.replace(capture, capture=dataclasses.replace(
        cap, generation_config={**cap.generation_config, "no_repeat_ngram_size": 3, "repetition_penalty": 1.5}))
    f = _codes(banned)["sampler_distribution_changed"]
    assert "the policy's generation_config.no_repeat_ngram_size" in f.cause and "= 3" in f.cause
    assert f.fix.code_change == "model.generation_config.no_repeat_ngram_size = 0 before building the trainer"
    assert f.fix.grpo_config == {} and "repetition_penalty" not in f.cause    # TRL sets that key itself
    # a key generation_kwargs sets goes over the model's: named there
    f = _codes(_with(banned, generation_kwargs={"no_repeat_ngram_size": 2}))["sampler_distribution_changed"]
    assert "GRPOConfig.generation_kwargs['no_repeat_ngram_size'] = 2" in f.cause and f.fix.code_change is None


def test_the_capture_records_the_policys_own_generation_config():
    import transformers
    from rookworld_debug.trl.build import model_generation_config
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16))
    model.generation_config.no_repeat_ngram_size = 3
    model.generation_config.bad_words_ids = [[5], [6, 7]]
    got = model_generation_config(model)
    assert got["no_repeat_ngram_size"] == 3 and got["bad_words_ids"] == [[5], [6, 7]]
    assert "transformers_version" not in got and json.loads(json.dumps(got)) == got


@pytest.mark.timeout(900)
def test_a_greedy_trl_run_is_diagnosed_greedy_first(tmp_path):
    """TRL's GRPOTrainer on the tiny model with generation_kwargs={'do_sample': False}, its step 1 captured."""
    import torch
    torch.set_num_threads(1)
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import make_trainer
    trainer = make_trainer(tmp_path / "run", max_steps=1, max_completion_length=24,
                           generation_kwargs={"do_sample": False})
    cap = capture_steps(trainer, steps=[1], out_dir=tmp_path / "captures")
    trainer.train()
    assert cap.errors == {}
    r = run_cli("diagnose", cap.paths[1], "--json", "--no-replay", timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    first = json.loads(r.stdout)["findings"][0]
    assert first["code"] == "sampling_greedy" and "generation_kwargs['do_sample'] = False" in first["cause"], first
