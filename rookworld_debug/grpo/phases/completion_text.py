"""The text side of a rollout: cutting sampled ids at the first EOS, completion texts and byte-level token
strings for the views, distinct completions per group, and the greedy prompts decoded beside the samples.

Shape legend: n rows, L sampled tokens, T completion tokens, K top-k alternatives, E greedy prompts.
"""
from __future__ import annotations

import torch

from rookworld_debug.models.tokenizer import token_strings
from .decoding import GreedyRows


def _cut_after_eos(generated: torch.Tensor, eos_id: int, pad_id: int):
    """(n, L) raw generated ids → (ids with pad after the first EOS (n, L), mask incl. EOS (n, L), has_eos (n,))."""
    is_eos = generated == eos_id                                                        # (n, L)
    has_eos = is_eos.any(1)                                                             # (n,)
    length = torch.where(has_eos, is_eos.int().argmax(1) + 1, generated.shape[1])       # (n,)
    mask = torch.arange(generated.shape[1], device=generated.device)[None] < length[:, None]  # (n, L)
    return generated.masked_fill(~mask, pad_id), mask.long(), has_eos


def _unique_per_group(ids: torch.Tensor, mask: torch.Tensor, g: int) -> torch.Tensor:
    """Distinct completions per group, vectorised: a row counts if no earlier row of its group equals it."""
    key = ids.masked_fill(mask == 0, -1).view(-1, g, ids.shape[1])                       # (B, G, T)
    same = (key[:, :, None, :] == key[:, None, :, :]).all(-1)                            # (B, G, G)
    earlier = torch.ones(g, g, dtype=torch.bool, device=ids.device).tril(-1)             # (G, G) j < i
    return (~(same & earlier).any(-1)).sum(-1)                                           # (B,)


def _token_strings(tokenizer, ids: torch.Tensor, lengths: list[int], topk_ids: torch.Tensor):
    """Byte-level token strings (models.tokenizer.token_strings: exact bytes, specials verbatim) of each
    completion and of its top-k alternatives, one tokenizer call per unique id. Not decoded text: a
    token can hold half a UTF-8 character, which only its bytes show."""
    uniq = torch.unique(torch.cat([ids.flatten(), topk_ids.flatten()])).tolist()
    raw = token_strings(tokenizer, uniq)
    id_rows, topk_rows = ids.tolist(), topk_ids.tolist()
    completion_tokens = tuple(tuple(raw[i] for i in row[:n]) for row, n in zip(id_rows, lengths))
    topk_tokens = tuple(tuple(tuple(raw[i] for i in alts) for alts in row[:n])
                        for row, n in zip(topk_rows, lengths))
    return completion_tokens, topk_tokens


def completion_texts(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> tuple[str, ...]:
    """Completion texts as a rollout writes them: each row's ids (n, T) up to its mask's length (through the first
    EOS), special tokens skipped."""
    return tuple(tokenizer.batch_decode([row[:k] for row, k in zip(ids.tolist(), mask.sum(1).tolist())],
                                        skip_special_tokens=True))


class GreedyTexts(list):
    """Greedy completions (text after the prompt, up to the first EOS) with `.ids`, their token ids (E, L') (pad
    after the first EOS; None when not kept): `replay` checks those tokens, not a re-tokenization of the text."""

    def __init__(self, texts=(), ids: torch.Tensor | None = None):
        super().__init__(texts)
        self.ids = ids


def _greedy_kw(tokenizer, greedy_prompts, greedy_max_new_tokens) -> GreedyRows | None:
    """The greedy prompts, left-padded, as `decode`'s extra greedy rows (None when there are none)."""
    if not greedy_prompts:
        return None
    enc = tokenizer(list(greedy_prompts), padding=True, padding_side="left", add_special_tokens=False,
                    return_tensors="pt")
    return GreedyRows(enc["input_ids"], enc["attention_mask"], greedy_max_new_tokens)
