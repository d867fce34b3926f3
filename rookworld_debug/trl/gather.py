"""Multi-process captures: every rank's rows of one step, merged on rank 0 into the global batch.

TRL (accelerate / DDP) gives rank p the rows [p·n, (p+1)·n) of the generation batch (its
``process_slice``); rewards are gathered by TRL itself, advantages are sliced back per rank. The capture
sends each rank's local record (generation tensors, its loss micro-batches) to rank 0 with one
``gather_object`` per recorded step (a collective every rank calls at ``on_step_end``; no disk), and rank
0 stitches them in rank order, which IS generation order: prompts left-padded and completions right-padded
to the widest rank, micro-batch rows offset by the rank's first row and tagged with the rank.
"""
from __future__ import annotations

import torch

# generation tensors with one row per completion: (rows, prompt width) or (rows, completion width)
_PROMPT = ("prompt_ids", "prompt_mask")
_PER_ROW = ("advantages",)
_GLOBAL = ("num_items_in_batch",)                 # already gathered by TRL: the same on every rank


def gather_to_rank0(local: dict, rank: int, world: int, *, pad_id: int) -> dict | None:
    """Rank 0: the merged {"gen", "micro_batches"} of all ranks (`merge_step`); other ranks: None."""
    import torch.distributed as dist
    parts = [None] * world if rank == 0 else None
    dist.gather_object(local, parts, dst=0)
    return merge_step(parts, pad_id=pad_id) if rank == 0 else None


def merge_step(parts: list, *, pad_id: int) -> dict:
    """One optimizer step's global batch from rank-ordered local records ``{"gens": [...], "micro_batches":
    [...]}``, each micro-batch tagged with the index of the generation batch its rows come from (``gen``).

    A step reads one generation batch (steps_per_generation ≥ gradient_accumulation_steps) or several
    (steps_per_generation < gradient_accumulation_steps: one per steps_per_generation micro-batches). Each
    generation batch is merged over ranks first (rank order = generation order), then the generation
    batches are stacked in the order they were generated, so every group stays contiguous."""
    n_gens = len(parts[0]["gens"])
    if n_gens == 0 or any(len(p["gens"]) != n_gens for p in parts):
        return {"gen": None, "micro_batches": []}
    merged = [merge_ranks([{"gen": p["gens"][i], "micro_batches": [m for m in p["micro_batches"] if m["gen"] == i]}
                           for p in parts], pad_id=pad_id) for i in range(n_gens)]
    if len(merged) == 1 or any(m["gen"] is None for m in merged):
        return merged[0] if len(merged) == 1 else {"gen": None, "micro_batches": []}
    return _stack_generations(merged, pad_id)


def _stack_generations(merged: list, pad_id: int) -> dict:
    """Generation batches of one step, one after the other (rows offset); rewards are per generation."""
    gens = [m["gen"] for m in merged]
    gen = _merge_gen(gens, pad_id)
    gen["rewards_per_func"] = torch.cat([g["rewards_per_func"] for g in gens])     # (ΣN, K): each is global
    gen["num_items_in_batch"] = sum(g["num_items_in_batch"] for g in gens)
    gen["local_rows"] = [r for g in gens for r in g.get("local_rows", [g["completion_ids"].shape[0]])]
    gen["generation_batches"] = [g["completion_ids"].shape[0] for g in gens]
    return {"gen": gen, "micro_batches": _offset_micro_batches(merged, gen["completion_ids"].shape[1])}


def _offset_micro_batches(parts: list, t_width: int, tag: str | None = None) -> list:
    """The parts' micro-batches in order, rows offset by the rows of the parts before them and per-token
    tensors right-padded to `t_width`; `tag` names the part's index in each micro-batch (e.g. "rank")."""
    mbs, offset = [], 0
    for i, part in enumerate(parts):
        for mb in part["micro_batches"]:
            m = dict(mb, rows=mb["rows"] + offset, **({tag: i} if tag else {}))
            for key in ("per_token_logps", "entropy", "old_per_token_logps"):
                if isinstance(m.get(key), torch.Tensor):
                    m[key] = _pad(m[key], t_width, 0.0, False)
            mbs.append(m)
        offset += part["gen"]["completion_ids"].shape[0]
    return mbs


def _pad(x: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    fill = torch.full((x.shape[0], extra, *x.shape[2:]), value, dtype=x.dtype)
    return torch.cat([fill, x], 1) if left else torch.cat([x, fill], 1)


def _merge_gen(gens: list, pad_id: int) -> dict:
    first = gens[0]
    out = {k: v for k, v in first.items() if not isinstance(v, torch.Tensor) or k in _GLOBAL}
    p_width = max(g["prompt_ids"].shape[1] for g in gens)
    t_width = max(g["completion_ids"].shape[1] for g in gens)
    for key, value in first.items():
        if not isinstance(value, torch.Tensor) or key in _GLOBAL:
            continue
        if key == "rewards_per_func":                                   # TRL gathered it already
            out[key] = value
        elif key in _PROMPT:
            out[key] = torch.cat([_pad(g[key], p_width, pad_id if key == "prompt_ids" else 0, True) for g in gens])
        elif key in _PER_ROW or value.ndim == 1:
            out[key] = torch.cat([g[key] for g in gens])
        else:                                                           # (rows, T): completion ids/mask, log-probs
            fill = pad_id if key == "completion_ids" else 0
            out[key] = torch.cat([_pad(g[key], t_width, fill, False) for g in gens])
    out["prompts"] = [p for g in gens for p in g["prompts"]]
    out["completions"] = [c for g in gens for c in g.get("completions", [])]
    out["columns"] = {k: [x for g in gens for x in g["columns"].get(k, [])] for k in first.get("columns", {})}
    out["breakdowns"] = [None if any(g["breakdowns"][i] is None for g in gens) else
                         [b for g in gens for b in g["breakdowns"][i]] for i in range(len(first.get("breakdowns", [])))]
    out["local_rows"] = [g["completion_ids"].shape[0] for g in gens]
    return out


def merge_ranks(parts: list, *, pad_id: int) -> dict:
    """The global step from rank-ordered local records (see module doc)."""
    gens = [p["gen"] for p in parts]
    if any(g is None for g in gens):
        return {"gen": None, "micro_batches": []}
    gen = _merge_gen(gens, pad_id)
    return {"gen": gen, "micro_batches": _offset_micro_batches(parts, gen["completion_ids"].shape[1], "rank")}
