"""A forward over rows packed into one sequence (padding removed, position ids restarting at 0 for each row) given a
plain all-ones attention mask: nothing keeps a row from attending to the rows packed before it, so every row but a
pack's first is scored on a context that holds other rows' tokens. Packs are the loop's micro-batches, or the whole
batch."""
from __future__ import annotations

import torch


@torch.no_grad()
def packed_logps(model, r, packs: list) -> torch.Tensor:
    """(N, T) tempered log-probs of each row's in-mask completion tokens scored in its pack (`packs`: lists of row
    indices), 0 outside the mask."""
    ids, mask = r.completion_ids, r.completion_mask.bool()
    out = torch.zeros(ids.shape, dtype=torch.float32)
    for rows in packs:
        seqs, spans = [], []
        for i in (int(x) for x in rows):
            p, c = r.prompt_ids[i][r.prompt_mask[i].bool()], ids[i][mask[i]]
            start = sum(len(x) for x in seqs) + len(p)
            spans.append((i, start, len(c)))
            seqs.append(torch.cat([p, c]))
        packed = torch.cat(seqs)[None]                                                     # (1, L)
        positions = torch.cat([torch.arange(len(x)) for x in seqs])[None]                  # (1, L)
        logits = model(input_ids=packed, attention_mask=torch.ones_like(packed), position_ids=positions).logits[0]
        for i, start, n in spans:
            lp = (logits[start - 1:start - 1 + n].float() / float(r.temperatures[i])).log_softmax(-1)   # (n, V)
            out[i, :n] = lp.gather(-1, ids[i][mask[i]][:, None]).squeeze(-1)
    return out * mask
