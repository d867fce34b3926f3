"""grpo.phases.replay: the after-update resample and greedy rows decode only the rows an update changed, and give the
texts a full decode loop gives."""
import pytest
import torch

from rookworld_debug.errors import NumericalError
from rookworld_debug.grpo.phases.decoding import SamplingParams, decode
from rookworld_debug.grpo.phases.evaluation import _resample_loop, greedy_prompts
from rookworld_debug.grpo.phases.generation import generate, generate_with_greedy, per_token_logps_and_entropy
from rookworld_debug.grpo.phases.generation import row_sampling
from rookworld_debug.grpo.phases.replay import replay_rows, resample_after_update
from rookworld_debug.models import load_policy_and_reference
from tinymodels import save_tiny_gpt2

P_PROMPT = "P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
A_PROMPT = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
PROMPTS, TASKS = [P_PROMPT, A_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1"], ["P", "A", "P"]
SAMPLING = {"P": (0.5, 0.9, None), "A": (0.95, 0.95, 20)}
GREEDY = [P_PROMPT, "P: 8/8/8/8/8/8/8/K6k w - - 0 1", A_PROMPT + "e2e4+"]


@pytest.fixture()
def models(tmp_path):
    """A fresh tiny random GPT-2 per test: the tests move its weights."""
    return load_policy_and_reference(save_tiny_gpt2(tmp_path, n_positions=256))


def _before(models):
    pol, ref, tok, _ = models
    return generate_with_greedy(pol, ref, tok, PROMPTS, TASKS, num_generations=4, max_new_tokens=24,
                                sampling=SAMPLING, seed=7, greedy_prompts=GREEDY, greedy_max_new_tokens=30)


def _nudge(policy, scale: float, seed: int = 0) -> None:
    """An 'update': every weight moved by N(0, scale²)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def test_decode_with_noise_rows_gives_the_full_batch_tokens_of_those_rows(models):
    """A subset of rows, each reading its own row of the full batch's draws, samples what the full batch did."""
    pol, _, tok, _ = models
    enc = tok([p for p in PROMPTS for _ in range(4)], padding=True, padding_side="left", return_tensors="pt")
    temps = torch.tensor([0.5] * 4 + [0.95] * 4 + [0.5] * 4)
    full = decode(pol, enc.input_ids[::4], enc.attention_mask[::4], expand=4, max_new_tokens=20, eos_id=tok.eos_token_id,
                  pad_id=tok.pad_token_id, sampling=SamplingParams(temps, generator=torch.Generator().manual_seed(3)))
    rows = torch.tensor([1, 5, 6, 11])
    part = decode(pol, enc.input_ids[rows], enc.attention_mask[rows], expand=1, max_new_tokens=20,
                  eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                  sampling=SamplingParams(temps[rows], generator=torch.Generator().manual_seed(3), noise=(rows, 12)))
    t = part.tokens.shape[1]
    assert torch.equal(part.tokens, full.tokens[rows, :t])
    assert (full.tokens[rows, t:] == tok.pad_token_id).all()      # the subset stopped where its rows ended


@pytest.mark.parametrize("scale, changed", [(0.0, "none"), (1e-3, "some"), (0.3, "most")])
def test_replay_gives_the_full_loops_resample_and_greedy_texts(models, scale, changed):
    """After a small, a medium and a large weight change: the same resample and greedy completions as decoding
    every row; it decodes only the changed rows, and none when nothing changed."""
    pol, ref, tok, _ = models
    rollout, greedy = _before(models)
    _nudge(pol, scale)
    texts, g_texts, replayed, counts = resample_after_update(pol, tok, rollout, GREEDY, greedy, 30)
    batch = (GREEDY, ["P"] * 3, [""] * 3)
    full, full_greedy, _ = _resample_loop(pol, ref, tok, rollout, batch, None, 30, None)
    assert texts == full and list(g_texts) == list(full_greedy)
    decoded = counts["decoded_sampled_rows"] + counts["decoded_greedy_rows"]
    assert counts["replayed_rows"] == 12 + 3
    if changed == "none":
        assert decoded == 0 and texts == list(rollout.completions) and list(g_texts) == list(greedy)
    elif changed == "some":
        assert 0 < decoded < 15
    else:
        assert counts["decoded_sampled_rows"] >= 6 and texts != list(rollout.completions)
    assert int((~replayed.same).sum()) == counts["decoded_sampled_rows"]


def test_replay_logps_and_entropy_are_the_teacher_forced_ones(models):
    """The replay's own forward gives the after-update log-probs and entropies of the old tokens (the Δlogp)."""
    pol, _, tok, _ = models
    rollout, _ = _before(models)
    _nudge(pol, 1e-2)
    _, top_p, top_k = row_sampling(rollout.sampling, rollout.tasks)
    r = replay_rows(pol, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
                    temperatures=rollout.temperatures, top_k=top_k, top_p=top_p, seed=rollout.seed)
    lp, ent = per_token_logps_and_entropy(pol, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                          rollout.completion_mask, rollout.temperatures)
    assert torch.allclose(r.logps, lp, atol=1e-5) and torch.allclose(r.entropy, ent, atol=1e-5)
    assert r.first_diff.shape == (12,) and bool((r.first_diff[r.same] == rollout.completion_ids.shape[1]).all())


def test_replay_of_nan_weights_is_a_named_error(models):
    pol, ref, tok, _ = models
    rollout = generate(pol, ref, tok, PROMPTS, TASKS, num_generations=2, max_new_tokens=8, sampling=SAMPLING,
                       seed=1)
    with torch.no_grad():
        pol.get_output_embeddings().weight.fill_(float("nan"))
    with pytest.raises(NumericalError, match="NaN"):
        replay_rows(pol, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
                    temperatures=rollout.temperatures, seed=rollout.seed)
