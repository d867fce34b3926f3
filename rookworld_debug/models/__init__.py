"""Models: policy + frozen reference (dropout off), the offline GPT-2 tokenizer, provenance."""
from .loading import (TINY_DIR, LoadedModels, RandomInitWarning, disable_dropout, dropout_config,
                      load_policy_and_reference, probe_hub)
from .provenance import Provenance, weights_sha256
from .tokenizer import gpt2_tokenizer

__all__ = ["load_policy_and_reference", "LoadedModels", "Provenance", "RandomInitWarning", "gpt2_tokenizer",
           "weights_sha256", "disable_dropout", "dropout_config", "probe_hub", "TINY_DIR"]
