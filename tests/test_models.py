"""models/: offline GPT-2 tokenizer, policy + frozen reference loading, dropout, provenance, hub errors."""
import time

import pytest
import torch

from rookworld_debug.errors import ModelLoadError
from rookworld_debug.models import (LoadedModels, RandomInitWarning, gpt2_tokenizer, load_policy_and_reference,
                                    weights_sha256)
from rookworld_debug.models import loading
from tinymodels import save_tiny_bpe_gpt2

DROPOUT = {"resid_pdrop": 0.1, "embd_pdrop": 0.2, "attn_pdrop": 0.3}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random GPT-2 (real GPT-2 vocab) + the GPT-2 tokenizer saved as an HF folder."""
    return save_tiny_bpe_gpt2(tmp_path_factory.mktemp("tiny_gpt2"), n_positions=128, n_layer=2, **DROPOUT)


@pytest.fixture(scope="module")
def loaded(tiny_folder) -> LoadedModels:
    return load_policy_and_reference(tiny_folder)


def test_gpt2_tokenizer_offline():
    tok = gpt2_tokenizer()
    assert tok("Hello world").input_ids == [15496, 995]
    assert len(tok) == 50257 and tok.eos_token_id == 50256
    assert tok.decode(tok(" M: e2e4").input_ids) == " M: e2e4"


def test_folder_load_zeroes_dropout_and_reports_original(loaded):
    prov = loaded.provenance
    assert prov.source == "local" and not prov.is_random_init
    assert {k: prov.dropout_original[k] for k in DROPOUT} == DROPOUT
    assert all(v == 0.0 for v in prov.dropout_now.values())
    for model in (loaded.policy, loaded.reference):
        assert not model.training
        assert all(getattr(model.config, k) == 0.0 for k in DROPOUT)
        assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_tokenizer_pad_and_padding_side(loaded):
    tok, prov = loaded.tokenizer, loaded.provenance
    assert tok.pad_token_id == tok.eos_token_id == 50256 and prov.pad_was_missing
    assert tok.padding_side == "left" == prov.padding_side
    assert loaded.policy.generation_config.pad_token_id == 50256
    assert prov.tokenizer_len == prov.tokenizer_vocab_size == prov.embedding_rows == 50257


def test_reference_is_separate_frozen_and_identical(loaded):
    pol, ref = loaded.policy, loaded.reference
    assert all(p.requires_grad for p in pol.parameters())
    assert not any(p.requires_grad for p in ref.parameters())
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(pol.parameters(), ref.parameters()))
    ids = torch.tensor([[15496, 995, 13, 50256, 11, 12]])
    with torch.no_grad():
        assert torch.equal(pol(ids).logits, ref(ids).logits)
    pol.train()  # dropout is zeroed in the modules, so even train mode is deterministic
    try:
        with torch.no_grad():
            assert torch.equal(pol(ids).logits, ref(ids).logits)
    finally:
        pol.eval()


def test_provenance_record(loaded, tiny_folder):
    prov = loaded.provenance
    d = prov.to_dict()
    assert d["resolved"] == str(tiny_folder.resolve()) and d["dtype"] == "torch.float32" and d["device"] == "cpu"
    assert prov.num_parameters == sum(p.numel() for p in loaded.policy.parameters())
    assert prov.weights_sha256 == weights_sha256(loaded.reference) and len(prov.weights_sha256) == 64
    assert set(d["versions"]) >= {"torch", "transformers", "chess", "rookworld_debug", "python"}
    assert d["timestamp"].endswith("+00:00") and isinstance(d["notes"], list)
    with pytest.raises(AttributeError):
        prov.model = "x"  # frozen


def test_hash_changes_with_weights_and_dtype(tiny_folder):
    a = load_policy_and_reference(tiny_folder)
    b = load_policy_and_reference(str(tiny_folder), dtype="bfloat16")
    assert b.policy.dtype == torch.bfloat16 and b.provenance.dtype == "torch.bfloat16"
    assert a.provenance.weights_sha256 != b.provenance.weights_sha256
    with torch.no_grad():
        a.policy.transformer.wte.weight[0, 0] += 1.0
    assert weights_sha256(a.policy) != a.provenance.weights_sha256


def test_folder_without_tokenizer_falls_back_to_gpt2(tmp_path, tiny_folder):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tiny_folder).save_pretrained(tmp_path)
    m = load_policy_and_reference(tmp_path)
    assert len(m.tokenizer) == 50257 and any("stock GPT-2 tokenizer" in n for n in m.provenance.notes)


@pytest.mark.parametrize("bad", ["./does/not/exist", "/no/such/folder", "not a model id!"])
def test_bad_names_raise_model_load_error(bad):
    with pytest.raises(ModelLoadError):
        load_policy_and_reference(bad)


def test_folder_without_config_raises(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_policy_and_reference(tmp_path)


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_unreachable_hub_fails_fast(monkeypatch, env):
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="jrahn/RookWorld-LM-124M"):
        load_policy_and_reference("jrahn/RookWorld-LM-124M")
    assert time.perf_counter() - t0 < 5.0


def test_tiny_falls_back_to_random_init_loudly(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "TINY_DIR", tmp_path / "tiny")  # as before the bundled model exists
    with pytest.warns(RandomInitWarning):
        m = load_policy_and_reference("tiny")
    prov = m.provenance
    assert prov.is_random_init and prov.source == "random" and any("RANDOMLY" in n for n in prov.notes)
    assert prov.dropout_original["resid_pdrop"] == 0.1 and prov.dropout_now["resid_pdrop"] == 0.0
    assert m.tokenizer("Hello world").input_ids == [15496, 995]
    with pytest.warns(RandomInitWarning):
        again = load_policy_and_reference("tiny")  # seeded: same weights every time
    assert again.provenance.weights_sha256 == prov.weights_sha256


def test_tiny_loads_bundled_or_random():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomInitWarning)
        m = load_policy_and_reference("tiny")
    prov = m.provenance
    assert prov.source == ("random" if prov.is_random_init else "bundled")
    ids = m.tokenizer("P: 8/8/8/8/8/8/8/K6k w - - 0 1", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(m.policy(ids).logits).all()
