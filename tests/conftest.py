"""Shared test fixtures."""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The real RookWorld fixtures in ../shared/fixtures (or $ROOKWORLD_SHARED/fixtures)."""
    candidates = [Path(__file__).parents[1].parent / "shared" / "fixtures"]
    if os.environ.get("ROOKWORLD_SHARED"):
        candidates.append(Path(os.environ["ROOKWORLD_SHARED"]) / "fixtures")
    for path in candidates:
        if (path / "rook_p_lines.txt").exists():
            return path
    pytest.skip(f"RookWorld fixtures not found (looked in {', '.join(map(str, candidates))})")


# tests/tinymodels.py is imported as a plain module by the tests
import sys as _sys

_sys.path.insert(0, str(Path(__file__).parent))


# --------------------------------------------------------------------- fuzz-case counts (issue 9)
_FUZZ_COUNTS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def fuzz_counts(request) -> dict:
    """{label: number of generated cases}; tests add to it, the terminal summary prints it."""
    return request.config.stash.setdefault(_FUZZ_COUNTS, {})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = config.stash.get(_FUZZ_COUNTS, None)
    if counts:
        terminalreporter.write_sep("-", "reliability fuzz cases (hypothesis-generated inputs checked)")
        for label, n in sorted(counts.items()):
            terminalreporter.write_line(f"{label:<58} {n:>8,d}")


# --------------------------------------------------------------------- a tiny byte-level model (issue 9)
@pytest.fixture(scope="session")
def tiny_byte_model_dir(tmp_path_factory) -> Path:
    """A 2-layer GPT-2 with a 257-token byte tokenizer saved as a standard HF folder (fast in CI).
    Its EOS logit is raised (~12 % per token at T=0.5) so rollouts hold ended and truncated rows.
    Pass the folder as `StepConfig(model=str(folder))` or to `load_policy_and_reference(folder)`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    eos_text = "<|endoftext|>"
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab[eos_text] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = GPT2TokenizerFast(tokenizer_object=tk, bos_token=eos_text, eos_token=eos_text, unk_token=eos_text)
    eos = tok.eos_token_id
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=256, n_layer=2, n_head=2, n_embd=32,
                                           bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=False))
    with torch.no_grad():  # feature 0 after ln_f is a constant; only EOS reads it -> EOS logit +1.8
        model.transformer.ln_f.weight[0], model.transformer.ln_f.bias[0] = 0.0, 1.8
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[eos, 0] = 1.0
    folder = tmp_path_factory.mktemp("tiny_byte_model")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
