"""A step recorded under torch.distributed (DDP under torchrun): every rank's rows, gathered to rank 0 as the
global step.

Every rank records the same calls with its own rows; at `save()` each rank sends its row pieces (one collective on
the default process group, any backend: gloo on the CPU, NCCL on GPUs), rank 0 stitches them in rank order — rank
0's rows, then rank 1's — and writes the step with its own weights, optimizer state and gradient, which under DDP
are every rank's: DDP's backward all-reduces `.grad` to the mean over ranks. Prompts are left-padded and completions
right-padded (mask 0) to the widest rank. Each rank's rows must be whole groups of G, and every rank the same count
(DistributedSampler's layout): the replay's micro-batches are then exactly the ranks' (see `global_accumulation`).

Shape legend: N_r rows on rank r (N = Σ N_r), T_r / P_r its completion / prompt width, T / P the widest rank's.
Every wait on another rank has a deadline (`deadline_s`) and ends in `RankTimeoutError`, never a hang.
"""
from __future__ import annotations

import datetime
import math
import pickle
from dataclasses import dataclass
from typing import Optional

import torch

from rookworld_debug.errors import DataError, RookWorldError

# the pieces with one entry per row (gathered from every rank); the others are the model's, kept from rank 0
ROW_PIECES = ("batch", "rollout", "sampling_logps", "rewards", "advantages", "policy_logps", "old_logps",
              "ref_logps", "per_token_loss", "loss", "training", "dtype")
TOKEN_PIECES = ("sampling_logps", "policy_logps", "old_logps", "ref_logps", "per_token_loss")   # (N_r, T_r) each
MODEL_PIECES = ("weights_before", "gradient", "weights_after", "reference_weights", "sampler_weights")
# two ranks' copies of one tensor dict agree when their sums of squares agree this closely (DDP: bit-identical)
SAME_REL = 1e-6
DEADLINE_S = 600.0          # rank 0 writes the weights while the others wait: minutes for a large model


class RankTimeoutError(RookWorldError, TimeoutError):
    """Another rank did not reach the recorder's collective within its deadline (a rank that skipped `save`, or
    crashed, or is still writing)."""


@dataclass(frozen=True)
class World:
    rank: int
    size: int


def world() -> Optional[World]:
    """This process's rank and the world size under an initialised torch.distributed of more than one process;
    None otherwise (a single-process loop records as before)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return World(dist.get_rank(), dist.get_world_size())


def unwrap(model):
    """The module a DistributedDataParallel (or DataParallel) wrapper trains; any other model as it is."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    return model.module if isinstance(model, (DistributedDataParallel, DataParallel)) else model


def exchange(obj, w: World, what: str, deadline_s: float) -> list:
    """[every rank's `obj`] in rank order, on every rank (all_gather of the pickled bytes: sizes first, then the
    bytes padded to the largest). RankTimeoutError when a rank does not join within `deadline_s`."""
    import torch.distributed as dist
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(w.size)]
    _wait(dist.all_gather(sizes, size, async_op=True), w, what, deadline_s)
    width = max(int(s) for s in sizes)
    buf = torch.zeros(width, dtype=torch.uint8, device=device)
    buf[:data.numel()] = data.to(device)
    bufs = [torch.empty_like(buf) for _ in range(w.size)]
    _wait(dist.all_gather(bufs, buf, async_op=True), w, what, deadline_s)
    return [pickle.loads(b[:int(s)].cpu().numpy().tobytes()) for b, s in zip(bufs, sizes)]


def _wait(work, w: World, what: str, deadline_s: float) -> None:
    try:
        work.wait(timeout=datetime.timedelta(seconds=deadline_s))
    except RuntimeError as err:
        raise RankTimeoutError(f"{what}: rank {w.rank} waited {deadline_s:g} s for the other {w.size - 1} rank(s) "
                               f"and not every one came (every rank calls StepRecorder.save at the same step, not only "
                               f"rank 0; a rank that crashed or skipped it leaves the others waiting): {err}") from None


def fingerprint(tensors: Optional[dict]) -> Optional[float]:
    """Σ of squares of a tensor dict (float64): equal on ranks that hold the same weights or gradient."""
    if tensors is None:
        return None
    return float(sum(float(v.double().pow(2).sum()) for v in tensors.values()))


def on_rank0(fn, w: World, what: str, deadline_s: float):
    """`fn()` run on rank 0, its result on every rank once it is done (the wait a barrier with a deadline); an error
    on rank 0 is raised there as it is and on the other ranks as a DataError that names it."""
    result, error = None, None
    if w.rank == 0:
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - said to the other ranks, then raised here unchanged
            error = err
    said = exchange((result, None if error is None else f"{type(error).__name__}: {error}"), w, what,
                    deadline_s)[0]
    if error is not None:
        raise error
    if said[1] is not None:
        raise DataError(f"{what} failed there: {said[1]}")
    return said[0]


def local_part(pieces: dict, prints: dict, declared: dict, accumulation: int) -> dict:
    """What one rank sends: its row pieces, its declaration and the fingerprints of its model pieces (of its
    copies on rank 0; `prints`, taken at the call, on the others, which keep no copy)."""
    return {"rows": {k: pieces[k] for k in ROW_PIECES if k in pieces}, "declared": declared,
            "accumulation": accumulation,
            "prints": {k: fingerprint(pieces[k]) if k in pieces else prints.get(k) for k in MODEL_PIECES}}


def check_parts(parts: list, g: int) -> list:
    """Each rank's row count N_r; a DataError naming the rank when the ranks disagree on what they recorded, the
    declaration, or hold rows that are not whole groups of G or not as many as rank 0's."""
    def declared(p):            # each rank may seed its own sampler: the seed is rank 0's
        return {k: v for k, v in p["declared"].items() if k != "seed"}
    for r, p in enumerate(parts[1:], 1):
        for what, mine, theirs in (("recorded pieces", sorted(p["rows"]), sorted(parts[0]["rows"])),
                                   ("declaration", declared(p), declared(parts[0])),
                                   ("gradient_accumulation_steps", p["accumulation"], parts[0]["accumulation"])):
            if mine != theirs:
                raise DataError(f"rank {r}'s {what} differ from rank 0's ({_short(mine)} vs {_short(theirs)}): "
                                "every rank makes the same StepRecorder calls with the same keywords")
    if "rollout" not in parts[0]["rows"]:
        return [0] * len(parts)
    counts = [int(p["rows"]["rollout"]["completion_ids"].shape[0]) for p in parts]
    for r, n in enumerate(counts):
        if n % g:
            raise DataError(f"rank {r} holds {n} rows: not a whole number of groups of num_generations = {g} (a "
                            "group's G completions must stay on one rank, its advantages are computed there)")
    if len(set(counts)) > 1:
        raise DataError(f"the ranks hold {counts} rows: a recorded step needs the same count on every rank "
                        "(DDP averages the ranks' gradients with equal weights; with unequal rows that average is "
                        "not the declared loss over the global batch)")
    for r, p in enumerate(parts):
        _check_rank_shapes(p["rows"], r)
    return counts


def _short(x) -> str:
    return repr(x)[:120]


def _check_rank_shapes(rows: dict, r: int) -> None:
    """A rank's per-token pieces against its own rollout, before padding could hide a mismatch."""
    shape = tuple(rows["rollout"]["completion_ids"].shape)
    for k in TOKEN_PIECES:
        if k in rows and tuple(rows[k].shape) != shape:
            raise DataError(f"rank {r}: {k} has shape {tuple(rows[k].shape)}, but its rollout's completions are "
                            f"{shape}")


def _pad(x: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    fill = torch.full((x.shape[0], extra), value, dtype=x.dtype)
    return torch.cat([fill, x], 1) if left else torch.cat([x, fill], 1)


def _cat_padded(xs: list, value, left: bool) -> torch.Tensor:
    width = max(x.shape[1] for x in xs)
    return torch.cat([_pad(x, width, value, left) for x in xs])


def merge_rollouts(rollouts: list, pad_id: int) -> dict:
    """The ranks' rollouts in rank order: prompts left-padded (mask 0), completions right-padded (mask 0)."""
    return dict(prompt_ids=_cat_padded([r["prompt_ids"] for r in rollouts], pad_id, True),
                prompt_mask=_cat_padded([r["prompt_mask"] for r in rollouts], 0, True),
                completion_ids=_cat_padded([r["completion_ids"] for r in rollouts], pad_id, False),
                completion_mask=_cat_padded([r["completion_mask"] for r in rollouts], 0, False),
                completions=tuple(c for r in rollouts for c in r["completions"]))


def merge_rows(parts: list, counts: list, g: int, pad_id: int) -> dict:
    """The global step's row pieces from rank-ordered parts (checked by `check_parts`)."""
    rows = [p["rows"] for p in parts]
    have = rows[0]
    out: dict = {}
    if "rollout" in have:
        out["rollout"] = merge_rollouts([r["rollout"] for r in rows], pad_id)
    for k in TOKEN_PIECES:
        if k in have:
            out[k] = _cat_padded([r[k] for r in rows], 0.0, False)
    if "advantages" in have:
        out["advantages"] = torch.cat([r["advantages"] for r in rows])
    if "rewards" in have:
        out["rewards"] = _merge_rewards([r["rewards"] for r in rows])
    if "batch" in have:
        out["batch"] = _merge_batch([r["batch"] for r in rows], counts, g)
    if "loss" in have:      # DDP's gradient is ∇ of the mean of the ranks' losses: that mean is the global loss
        out["loss"] = math.fsum(r["loss"] for r in rows) / len(rows)
    for k in ("training", "dtype"):
        if k in have:
            out[k] = have[k]
    return out


def _merge_rewards(rewards: list) -> tuple:
    names = [tuple(cols) for _, cols in rewards]
    if len(set(names)) > 1:
        raise DataError(f"the ranks name different reward functions {names[:4]}: every rank records the same ones")
    total = torch.cat([t for t, _ in rewards])
    return total, {k: torch.cat([cols[k] for _, cols in rewards]) for k in names[0]}


def _merge_batch(batches: list, counts: list, g: int) -> tuple:
    """Prompts, labels, tasks of each rank as N_r rows (a rank may give B_r or N_r), concatenated."""
    from rookworld_debug.record.build import rows_of
    out = []
    for i, what in enumerate(("batch prompts", "batch labels", "batch tasks")):
        given = [b[i] for b in batches]
        if any((x is None) != (given[0] is None) for x in given):
            raise DataError(f"{what}: recorded on some ranks and not on others")
        out.append(None if given[0] is None else
                   tuple(v for r, x in enumerate(given) for v in rows_of(x, counts[r], g, f"rank {r}'s {what}")))
    return tuple(out)


def spans(counts: list) -> tuple:
    """((start, stop), ...) of each rank's rows in the global step."""
    stops = [sum(counts[:i + 1]) for i in range(len(counts))]
    return tuple((stop - n, stop) for n, stop in zip(counts, stops))


def layout_flag(rows_by_rank: tuple, local_accumulation: int) -> str:
    return (f"distributed: {len(rows_by_rank)} ranks, rows {list(rows_by_rank)} (rank order); the loss is the mean "
            f"of the ranks' losses (DDP averages their gradients); micro-batches: {local_accumulation} per rank × "
            f"{len(rows_by_rank)} ranks")


def rank_flags(parts: list) -> tuple:
    """Where a rank's model pieces differ from rank 0's (kept): a gradient that was not all-reduced, weights that
    diverged. Said in the trace's flags; the replay then judges rank 0's pieces against the global rows."""
    out = []
    for k in MODEL_PIECES:
        ref = parts[0]["prints"][k]
        bad = [r for r, p in enumerate(parts) if ref is not None and p["prints"][k] is not None
               and abs(p["prints"][k] - ref) > SAME_REL * max(abs(ref), 1e-30)]
        if bad:
            out.append(f"distributed: rank(s) {bad} hold another {k} than rank 0 (Σ of squares "
                       f"{[parts[r]['prints'][k] for r in bad][:4]} vs {ref:.8g}); the trace keeps rank 0's"
                       + (": a gradient not averaged over the ranks (DDP's backward, outside no_sync, averages it)"
                          if k == "gradient" else ""))
    trained = {p["rows"].get("training") for p in parts}
    if len(trained) > 1:
        out.append(f"distributed: the ranks' loss forwards ran in different modes (training = {sorted(trained)}); "
                   "the trace keeps rank 0's")
    return tuple(out)


def global_accumulation(local: int, size: int) -> int:
    """The micro-batches of the global step: each rank's `local` ones, for every rank. DDP's mean over ranks of
    Σ_micro-batch loss / local is Σ over all of them / (local · size): TRL's accumulation over local · size
    contiguous chunks, which the rank order makes the ranks' own micro-batches (bnpo: each normalised by its own
    tokens, as each rank did)."""
    return local * size
