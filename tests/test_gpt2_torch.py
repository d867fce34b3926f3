"""The replay's plain-torch GPT-2 and tokenizer reader against transformers' own classes, bit for bit; and a
diagnosis of the example trainer's recorded step, as a user runs it, importing no transformers at all."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rookworld_debug.grpo.phases.scoring import _forward_completion_hidden, per_token_logps_and_entropy
from rookworld_debug.grpo.trace.state import RecordedState, _build_transformers, _gpt2_config, build_model
from rookworld_debug.models import gpt2_torch, tokenizer_file

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4)


def _state(config: dict) -> RecordedState:
    return RecordedState(model_type="gpt2", model_config=config, before=None, after=None, gradient=None,
                         reference=None, optimizer_state=None, optimizer="", optimizer_settings={}, trainable=(),
                         tokenizer_dir=None)


def _pair(**config):
    """(transformers' model, the plain one) holding the same random weights."""
    config = {**CONFIG, **config}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = _build_transformers(_state(config), _gpt2_config(config), _random_weights(config))
    weights = {k: v.clone() for k, v in hf.state_dict().items()}
    plain = build_model(_state(config), weights)
    assert isinstance(plain, gpt2_torch.GPT2LM)
    return hf, plain


def _random_weights(config: dict) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", **config))
    with torch.no_grad():
        for p in model.parameters():            # LayerNorms and biases away from their 1/0 inits too
            p.add_(torch.randn_like(p) * 0.05)
    return model.state_dict()


def _rows(n=6, p=7, t=9, vocab=97, seed=1):
    """Left-padded prompts (rows 0–3 share one: the cached path), completions with a masked tail."""
    g = torch.Generator().manual_seed(seed)
    pid, cid = torch.randint(0, vocab, (n, p), generator=g), torch.randint(0, vocab, (n, t), generator=g)
    pm, cm = torch.ones(n, p, dtype=torch.long), torch.ones(n, t, dtype=torch.long)
    pm[0, :3] = 0
    pm[4, :1] = 0
    pid[1:4], pm[1:4] = pid[0], pm[0]
    cm[0, 5:] = 0
    return pid, pm, cid, cm


CASES = [dict(), dict(activation_function="gelu_pytorch_tanh"), dict(activation_function="gelu"),
         dict(activation_function="relu"), dict(scale_attn_by_inverse_layer_idx=True),
         dict(scale_attn_weights=False), dict(tie_word_embeddings=False), dict(n_inner=48)]


@pytest.mark.parametrize("config", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "gpt2")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_plain_gpt2_computes_transformers_forward_bit_for_bit(config, dtype):
    hf, plain = _pair(**config)
    hf, plain = hf.to(dtype), plain.to(dtype)
    pid, pm, cid, cm = _rows()
    ids, mask = torch.cat([pid, cid], 1), torch.cat([pm, cm], 1)
    with torch.no_grad():
        for kw in (dict(attention_mask=mask), dict(), dict(attention_mask=torch.ones_like(mask))):
            assert torch.equal(hf(input_ids=ids, **kw).logits, plain(input_ids=ids, **kw).logits), kw
        # the scoring forward: a shared prompt's KV cache re-indexed to its rows, then the completions on it
        assert torch.equal(_forward_completion_hidden(hf, pid, pm, cid, cm),
                           _forward_completion_hidden(plain, pid, pm, cid, cm))
    assert sorted(hf.state_dict()) == sorted(plain.state_dict())


def test_gradients_and_dropout_draws_are_transformers_own():
    hf, plain = _pair()
    pid, pm, cid, cm = _rows()
    grads = []
    for model in (hf, plain):
        lp, ent = per_token_logps_and_entropy(model, pid, pm, cid, cm, 0.7, with_grad=True, entropy_grad=True)
        grads.append(torch.autograd.grad([(lp * cm).sum() + ent.sum()], list(model.parameters())))
    assert [n for n, _ in hf.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    draws = []
    for model in (hf, plain):
        model.train()
        with torch.random.fork_rng():
            torch.manual_seed(3)
            draws.append(model(input_ids=torch.cat([pid, cid], 1), attention_mask=torch.cat([pm, cm], 1)).logits)
        model.eval()
    assert torch.equal(*draws) and not torch.equal(draws[0], hf(input_ids=torch.cat([pid, cid], 1),
                                                                 attention_mask=torch.cat([pm, cm], 1)).logits)


def test_a_config_it_does_not_compute_is_built_with_transformers():
    config = {**CONFIG, "activation_function": "silu"}
    assert gpt2_torch.supports(config) == "activation_function 'silu'"
    with torch.random.fork_rng():
        model = build_model(_state(config), _random_weights(config))
    assert type(model).__name__ == "GPT2LMHeadModel"


def test_the_built_model_never_writes_into_the_recorded_weights():
    _, plain = _pair()
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    weights = {k: v.clone() for k, v in before.items()}
    model = build_model(_state(CONFIG), weights)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert all(torch.equal(weights[k], before[k]) for k in before)


# ------------------------------------------------------------------------------------------ the tokenizer
def _same_tokenizer(folder: Path, vocab: int, sequences: int = 300):
    from transformers import AutoTokenizer
    ours, theirs = tokenizer_file.read(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert ours is not None
    assert (len(ours), ours.eos_token, ours.eos_token_id) == (len(theirs), theirs.eos_token, theirs.eos_token_id)
    rng = random.Random(0)
    rows = [[i] for i in range(0, vocab, max(1, vocab // 2000))] + \
        [[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] for _ in range(sequences)] + \
        [[theirs.eos_token_id, 5, theirs.eos_token_id]]
    for skip in (True, False):
        assert [ours.decode(r, skip_special_tokens=skip) for r in rows] == \
            [theirs.decode(r, skip_special_tokens=skip) for r in rows]
    return ours


def test_the_tokenizer_reader_decodes_as_transformers_does(tmp_path):
    from tinymodels import byte_tokenizer

    from rookworld_debug.models.tokenizer import GPT2_VOCAB_SIZE, gpt2_tokenizer
    byte_tokenizer().save_pretrained(tmp_path / "byte")
    _same_tokenizer(tmp_path / "byte", 257)
    gpt2_tokenizer().save_pretrained(tmp_path / "gpt2")
    ours = _same_tokenizer(tmp_path / "gpt2", GPT2_VOCAB_SIZE)
    ours.save_pretrained(tmp_path / "copy")
    _same_tokenizer(tmp_path / "copy", GPT2_VOCAB_SIZE, sequences=20)


def test_the_tokenizer_reader_leaves_what_transformers_could_load_otherwise_to_it(tmp_path):
    from tinymodels import byte_tokenizer
    byte_tokenizer().save_pretrained(tmp_path)
    assert tokenizer_file.read(tmp_path) is not None
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    for change in ({"tokenizer_class": "BertTokenizer"}, {"eos_token": "<|not-in-the-vocabulary|>"},
                   {"eos_token": None}, {"added_tokens_decoder": {}}):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
        assert tokenizer_file.read(tmp_path) is None, change
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "special_tokens_map.json").write_text("{}")
    assert tokenizer_file.read(tmp_path) is None
    (tmp_path / "special_tokens_map.json").unlink()
    (tmp_path / "tokenizer.json").write_text("{not json")
    assert tokenizer_file.read(tmp_path) is None


# ------------------------------------------------------------------------------------------ as a user runs it
@pytest.fixture(scope="module")
def example_step(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("manual") / "step-2"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "manual_loop.py"), "--out", str(out)], cwd=ROOT,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def test_diagnosing_the_example_step_imports_no_transformers(example_step):
    """The replay rebuilds the recorded GPT-2 and tokenizer without transformers: the import alone is ~3 s of a
    diagnosis meant to take under 5 s."""
    code = ("import sys; from rookworld_debug.cli_diagnose import main; rc = main([sys.argv[1], '--json']); "
            "print(json.dumps({'rc': rc, 'loaded': sorted(m for m in sys.modules if m.split('.')[0] == "
            "'transformers')}), file=sys.stderr)").replace("import sys;", "import sys, json;")
    r = subprocess.run([sys.executable, "-c", code, str(example_step)], cwd=ROOT, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300)
    said = json.loads(r.stderr.strip().splitlines()[-1])
    assert said == {"rc": 0, "loaded": []}, r.stderr[-2000:]
    replay = json.loads(r.stdout)["replays"][0]
    assert replay["first_disagreement"] is None
    assert {c["phase"] for c in replay["checks"] if c["status"] == "agree"} >= {"scoring", "gradient", "update"}


def test_a_saved_plain_model_loads_in_transformers_as_the_same_model(tmp_path):
    from transformers import AutoModelForCausalLM
    for config in (dict(), dict(tie_word_embeddings=False)):
        hf, plain = _pair(**config)
        plain.save_pretrained(tmp_path / str(len(config)))
        loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / str(len(config))), local_files_only=True)
        ids = _rows()[0]
        with torch.no_grad():
            assert torch.equal(loaded(input_ids=ids).logits, hf(input_ids=ids).logits)


def test_the_tokenizer_reader_never_opens_a_fifo_or_a_link(tmp_path):
    import os
    from tinymodels import byte_tokenizer
    byte_tokenizer().save_pretrained(tmp_path / "real")
    for kind in ("fifo", "link"):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "tokenizer_config.json").write_bytes((tmp_path / "real" / "tokenizer_config.json").read_bytes())
        if kind == "fifo":
            os.mkfifo(folder / "tokenizer.json")
        else:
            (folder / "tokenizer.json").symlink_to(tmp_path / "real" / "tokenizer.json")
        assert tokenizer_file.read(folder) is None           # returns at once: the FIFO is never opened


def test_position_ids_without_a_mask_read_as_packed_sequences_as_transformers_reads_them():
    # a forward given position ids from the mask but no attention mask: left pads restart the positions, which
    # transformers takes for packed sequences (each pad a segment of its own); plain ones are one sequence
    hf, plain = _pair()
    pid, pm, cid, cm = _rows()
    ids, mask = torch.cat([pid, cid], 1), torch.cat([pm, cm], 1)
    for pos in ((mask.cumsum(1) - 1).clamp(min=0), torch.arange(ids.shape[1])[None]):
        for use_cache in (None, False, True):     # transformers reads packing only without a cache
            with torch.no_grad():
                a = hf(input_ids=ids, position_ids=pos, use_cache=use_cache).logits
                b = plain(input_ids=ids, position_ids=pos, use_cache=use_cache).logits
            assert torch.equal(a, b), use_cache
    assert gpt2_torch.packed_mask((mask.cumsum(1) - 1).clamp(min=0), ids.shape[0]) is not None
