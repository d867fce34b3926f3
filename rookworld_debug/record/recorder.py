"""`StepRecorder`: a hand-written GRPO loop hands the debugger one step, phase by phase, in a few added lines.

    rec = StepRecorder(tokenizer, trainer="my loop", loss_type="grpo", num_generations=8, beta=0.04,
                       temperature=1.0, reward="rookworld", reward_mode="dataset")
    rec.batch(prompts, labels=labels)                      # the B prompts (or N rows) and their dataset labels
    rec.model_before(model, optimizer, reference=ref)      # weights + optimizer state before the update
    rec.rollout(prompt_ids=..., prompt_mask=..., completion_ids=..., completion_mask=..., sampling_logps=...)
    rec.rewards(rewards, per_func={"rookworld": rewards})
    rec.advantages(advantages)
    rec.logprobs(per_token_logps=logps, old=old_logps, ref=ref_logps, training=model.training)
    rec.loss(loss, per_token_loss=per_token_loss)          # what the loop backpropagated
    rec.gradient(model)                                     # after backward, BEFORE clipping and step
    rec.model_after(model)                                  # after optimizer.step()
    rec.save("runs/mine/step-3")                            # a trace every view, diagnose and the replay open

Every call is optional: what was not recorded is listed in the trace (`trace.recorded.missing`) with what cannot
be checked without it. Rows are the loop's: N = B·G, the G completions of prompt b in rows b·G … b·G+G−1.
Tensors are copied to the CPU at the call, so the loop may go on changing its own.

Under torch.distributed (DDP under torchrun, world size > 1) every rank makes the same calls with its own rows and
the same keywords, and every rank calls `save(path)`: the rows are gathered to rank 0 — rank 0's rows, then rank
1's, … — and rank 0 writes the GLOBAL step (trace.recorded.rows_by_rank says which rows each rank held). Groups stay
whole: each rank's rows are whole groups of G (refused by name otherwise), the same count on every rank. The weights,
optimizer state and gradient are rank 0's (a DistributedDataParallel model is unwrapped): after DDP's backward its
.grad is the mean over the ranks, every rank's. The loss kept is the mean of the ranks' recorded losses — the loss
that gradient is the gradient of — and `gradient_accumulation_steps` becomes ranks × the local count: the replay
normalises each rank's micro-batches as that rank did. So "grpo" (per-sequence means, equal rows) is the global mean,
and a token-normalised loop is judged as it computed: per-rank token means (Σ over the rank's tokens ÷ its count) are
"bnpo" over ranks × micro-batches; "dapo" is the token mean of the GLOBAL batch (TRL divides by the token count
gathered over ranks), which a loop dividing by its own rank's count does not compute — the replay says so.
"""
from __future__ import annotations

import inspect
import math
import secrets
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch

from rookworld_debug.errors import ConfigError, DataError
from rookworld_debug.grpo.trace.recorded import PIECES, RecordedStep, RECORD_FORMAT
from rookworld_debug.grpo.trace import state as S
from rookworld_debug.record import distributed as D

PRECISIONS = ("float32", "bfloat16", "float16", "float64")
# the call that records each model piece (what an error about the piece names)
CALL_OF = {"weights_before": "model_before", "reference_weights": "model_before: reference",
           "sampler_weights": "sampler", "gradient": "gradient", "weights_after": "model_after"}
# what each piece lets the replay check (said in the trace when the piece is missing)
WITHOUT = {
    "batch": "the prompts and labels: rewards cannot be recomputed",
    "rollout": "the completion ids and mask: nothing can be replayed",
    "sampling_logps": "the sampler's log-probs: the sampler is not compared with the policy",
    "rewards": "the rewards: the reward join and the advantages are not checked",
    "advantages": "the advantages: the advantage formula is not checked (the record shows the declared objective's)",
    "old_logps": "π_old's log-probs: the ratio is taken against ℓ.detach() (μ = 1)",
    "ref_logps": "the reference's log-probs: the KL term is not checked",
    "policy_logps": "the loss forward's log-probs: the scoring is not checked",
    "loss": "the backpropagated loss: the loss is not checked",
    "per_token_loss": "the per-token loss: the loss is checked as a total only",
    "weights_before": "the weights before the update: log-probs and the gradient cannot be recomputed",
    "reference_weights": "the reference's weights: its log-probs cannot be recomputed",
    "optimizer_state": "the optimizer's state: the update cannot be re-run",
    "gradient": "the gradient: neither the gradient nor the update is checked",
    "weights_after": "the weights after the update: the update is not checked",
    "sampler_weights": "the weights that sampled the rollout: taken to be the weights before the update (one pass "
                       "per rollout, the sampler the policy itself)",
}


def _cpu(x, what: str, dtype=None) -> torch.Tensor:
    if not torch.is_tensor(x):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise DataError(f"{what}: a tensor expected, got {type(x).__name__}") from None
    _has_data({what: x}, what)
    try:
        x = x.detach().to("cpu", copy=True)
    except (NotImplementedError, RuntimeError) as err:      # a device whose values the CPU cannot copy
        raise DataError(f"{what}: the tensor's values cannot be copied from {x.device} ({str(err)[:200]})") from None
    if x.dtype == torch.bool or x.is_complex():
        raise DataError(f"{what}: a real-valued tensor expected, got {x.dtype}")
    return x.to(dtype) if dtype is not None else x


def _has_data(tensors: Mapping, what: str) -> None:
    """DataError naming the first of `tensors` on the meta device: a shape without values (a model built under
    `torch.device("meta")` or not yet materialised), nothing a step can be replayed from."""
    empty = next((name for name, t in tensors.items() if torch.is_tensor(t) and t.is_meta), None)
    if empty is not None:
        which = "the tensor" if empty == what else f"{empty}"
        raise DataError(f"{what}: {which} has no data (it is on the meta device); record the tensors the loop "
                        "computed with, on a device that holds their values")


def _piece_has_data(key: str, model, grad: bool = False) -> None:
    """`_has_data` of a model piece's tensors (its parameters, or their .grad), named by the call that records it."""
    _has_data({f"{'the .grad of ' if grad else 'parameter '}{n}": p.grad if grad else p
               for n, p in model.named_parameters()}, CALL_OF[key])


def _rows(x, what: str) -> tuple:
    """A per-row argument as a tuple: a lone string, or something that is not a sequence, is refused."""
    if isinstance(x, (str, bytes)):
        raise DataError(f"{what}: a sequence of strings expected, got one {type(x).__name__}")
    try:
        return tuple(x)
    except TypeError:
        raise DataError(f"{what}: a sequence of strings expected, got {type(x).__name__}") from None


def _ids(x, what: str, vocab: int) -> torch.Tensor:
    """Token ids: whole numbers in [0, vocab) (a float id with a fraction, a negative id or one past the
    tokenizer's vocabulary is refused, not truncated or wrapped)."""
    x = _cpu(x, what)
    if x.is_floating_point():
        if not bool(torch.isfinite(x).all()) or not bool((x == x.round()).all()):
            raise DataError(f"{what}: token ids must be whole numbers, got fractional or non-finite values")
    x = x.to(torch.long)
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab):
        raise DataError(f"{what}: token ids must lie in [0, {vocab}) (the tokenizer's vocabulary), got "
                        f"[{int(x.min())}, {int(x.max())}]")
    return x


def _mask(x, what: str) -> torch.Tensor:
    x = _cpu(x, what)
    if x.numel() and not bool(((x == 0) | (x == 1)).all()):
        raise DataError(f"{what}: a 0/1 mask expected, got values {sorted(set(x.unique().tolist()))[:6]}")
    return x.to(torch.long)


def _finite(x: torch.Tensor, what: str, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`x`, refused when a value the step uses is ±inf or NaN (outside `mask`, −inf and NaN are allowed)."""
    used = torch.isfinite(x) if mask is None or mask.shape != x.shape else torch.isfinite(x) | (mask == 0)
    if not bool(used.all()):
        raise DataError(f"{what}: {int((~used).sum())} non-finite value(s) where the step uses them")
    return x


@dataclass(frozen=True)
class DeclarationCheck:
    """What `StepRecorder.check()` found: the keywords the loop's numbers fit instead of the declared ones, and the
    first phase that disagrees even under them (None: every replayed phase agrees)."""
    keywords: dict                      # {keyword: the value the loop computes}: pass these to StepRecorder
    declared: dict                      # {keyword: the value it was told}
    first_disagreement: object          # diagnosis.replay.PhaseCheck or None
    replayed: tuple                     # the phases that were replayed

    @property
    def ok(self) -> bool:
        return not self.keywords and self.first_disagreement is None

    def __str__(self) -> str:
        lines = [f"declare {k}={v!r} (declared {self.declared[k]!r}): the loop computes it"
                 for k, v in self.keywords.items()]
        c = self.first_disagreement
        if c is not None:
            lines.append(f"{c.phase} disagrees even so: {c.quantity} by {c.max_abs_diff:.4g} (tolerance "
                         f"{c.tolerance:.3g}){': ' + c.explanation if c.explanation else ''}")
        return "\n".join(lines) or f"the declaration holds: {', '.join(self.replayed)} agree"


class StepRecorder:
    """Collects one step of any GRPO loop; `build()` makes the `StepTrace`, `save(path)` writes it with its weights."""

    def __init__(self, tokenizer, **keywords):
        self._declare(tokenizer, **keywords)
        # the keywords the loop passed itself: a computation that contradicts one of them is the loop's own claim
        # broken (an error), one that contradicts a default it never passed is a declaration to add (a warning)
        self.explicit = tuple(sorted(k for k, v in keywords.items() if v is not None))   # None: "not said"

    def _declare(self, tokenizer, *, trainer: str = "your own training loop", loss_type: str = "grpo",
                 num_generations: int, beta: float = 0.0, epsilon: float = 0.2, epsilon_high: Optional[float] = None,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, precision: Optional[str] = None,
                 sampler_precision: Optional[str] = None,
                 reward: str = "rookworld", reward_mode: str = "dataset",
                 scale_rewards: str = "group", adv_eps: float = 1e-4, kl_estimator: str = "k3",
                 use_bias_correction_kl: bool = True, mask_truncated_completions: bool = False,
                 entropy_coef: float = 0.0, importance_sampling_level: str = "token",
                 max_grad_norm: Optional[float] = None, gradient_accumulation_steps: int = 1,
                 num_iterations: int = 1, iteration: int = 0, seed: int = 0, step: Optional[int] = None,
                 notes: Sequence[str] = (), deadline_s: float = D.DEADLINE_S, **settings):
        """Declare the objective the loop computes. Every keyword that changes the math, with its default:

        loss_type "grpo"                 the aggregation (grpo, dapo, bnpo, dr_grpo, … as TRL 1.16's GRPOTrainer)
        beta 0.0, epsilon 0.2, epsilon_high = epsilon     the KL coefficient and the PPO clip range
        kl_estimator "k3"                the per-token KL estimator (k1, k2, k3), d = ℓ_ref − ℓ
        use_bias_correction_kl True      the KL estimate × the importance ratio (TRL 1.16's default); False: plain
        scale_rewards "group", adv_eps 1e-4   A = (r − mean_g) / (std_g + adv_eps); "batch": the batch std;
                                         "none": no division
        mask_truncated_completions False rows with no EOS get a 0 loss mask (TRL's option of that name)
        entropy_coef 0.0                 − c_H · mean entropy in the loss
        importance_sampling_level "token"   "sequence": one ratio per row (GSPO)
        temperature 1.0, top_k 0, top_p 1.0   the sampler's (log-probs of the tempered distribution before top-k/p)
        precision None                   the dtype the loop's forwards ran in ('bfloat16' under autocast); None:
                                         the model's parameter dtype
        sampler_precision None           the dtype the sampler ran in, when not `precision` (a bf16 rollout engine)
        max_grad_norm None               the clip between backward and step (None: no clip)
        gradient_accumulation_steps 1    micro-batches (contiguous, equal chunks of the N rows) in the gradient;
                                         each micro-batch's loss normalised as TRL does (bnpo: by its own tokens)
        num_iterations 1, iteration 0    μ optimizer passes over one rollout (PPO epochs) and which pass this is
                                         (0 = the first, where π_old is the weights before the update); on a later
                                         pass, record the weights that sampled with `sampler()`

        `StepRecorder.check()` on a first healthy step says which of these the loop's numbers disagree with.
        deadline_s (600) bounds each wait on the other ranks under torch.distributed (RankTimeoutError past it).
        """
        self.tokenizer = tokenizer
        self.trainer = str(trainer)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
            raise ConfigError("step", f"the loop's optimizer step is an int ≥ 1 (1 = its first update), got {step!r}")
        self.step = step
        num_generations = _count("num_generations", num_generations, 1)
        self.iteration = _count("iteration", iteration, 0)
        num_iterations = _count("num_iterations", num_iterations, 1)
        if self.iteration >= num_iterations:
            raise ConfigError("iteration", f"pass {iteration} of num_iterations = {num_iterations}: the pass index "
                                           "counts from 0 and is below num_iterations")
        self.declared = dict(loss_type=loss_type, num_generations=num_generations, beta=float(beta),
                             epsilon_low=float(epsilon), epsilon_high=float(epsilon if epsilon_high is None
                                                                           else epsilon_high),
                             p_temperature=float(temperature), a_temperature=float(temperature),
                             top_k=int(top_k), p_top_p=float(top_p), a_top_p=float(top_p),
                             reward_mode=reward_mode, scale_rewards=scale_rewards, adv_eps=adv_eps,
                             kl_estimator=kl_estimator, use_bias_correction_kl=use_bias_correction_kl,
                             mask_truncated_completions=mask_truncated_completions, entropy_coef=entropy_coef,
                             importance_sampling_level=importance_sampling_level, max_grad_norm=max_grad_norm,
                             num_iterations=num_iterations, seed=int(seed), **settings)
        _check_declared(self.declared)
        self.reward = str(reward)
        if precision is not None and precision not in PRECISIONS:
            raise ConfigError("precision", f"{precision!r}: one of {PRECISIONS} (the dtype the loop's forwards ran "
                                           "in, e.g. 'bfloat16' under autocast)")
        self.precision = precision
        if sampler_precision is not None and sampler_precision not in PRECISIONS:
            raise ConfigError("sampler_precision", f"{sampler_precision!r}: one of {PRECISIONS} (the dtype the "
                                                   "sampler's forwards ran in)")
        self.sampler_precision = sampler_precision
        self.gradient_accumulation_steps = _count("gradient_accumulation_steps", gradient_accumulation_steps, 1)
        self.notes = tuple(str(n) for n in notes)
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not 0 < deadline_s < math.inf:
            raise ConfigError("deadline_s", f"a positive number of seconds expected, got {deadline_s!r}")
        self.deadline_s = float(deadline_s)
        self.pieces: dict = {}
        self.prints: dict = {}          # Σ of squares of the model pieces a rank other than 0 does not keep
        self.rows_by_rank: tuple = ()   # the global step's (start, stop) per rank (set on rank 0 at save)
        self.rank_flags: tuple = ()     # where a rank's model pieces differ from rank 0's

    # ---------------------------------------------------------------- the loop's calls, in step order
    def batch(self, prompts: Sequence[str], labels: Optional[Sequence[str]] = None,
              tasks: Optional[Sequence[str]] = None) -> None:
        """The step's prompts (B, or N rows repeated per group) and their dataset completions (labels)."""
        prompts = _rows(prompts, "batch: prompts")
        if not all(isinstance(p, str) for p in prompts):
            raise DataError("batch: prompts must be a sequence of strings")
        self.pieces["batch"] = (prompts, None if labels is None else tuple(map(str, _rows(labels, "batch: labels"))),
                                None if tasks is None else tuple(map(str, _rows(tasks, "batch: tasks"))))

    def model_before(self, model, optimizer=None, reference=None, scheduler=None) -> None:
        """The policy (and its optimizer's state, the reference model, and the learning-rate scheduler's count and
        rate) before the update."""
        model = _model(model, "model")
        ref = None if reference is None else _model(reference, "reference")
        if optimizer is not None and not (hasattr(optimizer, "param_groups") and hasattr(optimizer, "state")):
            raise DataError(f"model_before: optimizer must be a torch.optim optimizer, got {type(optimizer).__name__}")
        if optimizer is not None:
            _has_data({k: v for st in optimizer.state.values() for k, v in st.items()}, "model_before: optimizer state")
        _piece_has_data("reference_weights", ref) if ref is not None else None    # before anything is kept
        sched = None if scheduler is None else _scheduler_state(scheduler, optimizer)
        self._model_piece("weights_before", model)
        self.pieces["model_config"] = model.config.to_dict()
        self.pieces["dtype"] = self.precision or str(next(model.parameters()).dtype).removeprefix("torch.")
        if optimizer is not None and _keeper():
            self.pieces["optimizer_state"] = S.optimizer_snapshot(model, optimizer)
        if ref is not None:
            self._model_piece("reference_weights", ref)
        if sched is not None:
            self.pieces["scheduler"] = sched

    def sampler(self, model) -> None:
        """The weights that sampled the rollout, when they are not the weights before this update: a later pass of
        num_iterations > 1 (the weights of the rollout's first pass), or a separate sampler copy (then a stale copy
        shows). π_old and the sampler's log-probs are replayed from them."""
        self._model_piece("sampler_weights", _model(model, "sampler"))

    def rollout(self, *, prompt_ids, prompt_mask, completion_ids, completion_mask,
                completions: Optional[Sequence[str]] = None, sampling_logps=None) -> None:
        """The sampled rows: (N, P) prompt ids and mask (right padding is moved to the left), (N, T) completion ids and
        the loss mask, the decoded completions the rewards read (decoded here when not given), the sampler's
        log-probs (N, T) of the tempered distribution before any top-k / top-p (TRL's convention)."""
        vocab = len(self.tokenizer)
        ids = _ids(completion_ids, "rollout: completion_ids", vocab)
        mask = _mask(completion_mask, "rollout: completion_mask")
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise DataError(f"rollout: completion_ids {tuple(ids.shape)} and completion_mask {tuple(mask.shape)} "
                            "must both be (N, T)")
        if completions is None:
            completions = [self.tokenizer.decode(ids[i][mask[i].bool()], skip_special_tokens=True)
                           for i in range(ids.shape[0])]
        completions = _rows(completions, "rollout: completions")
        if len(completions) != ids.shape[0] or not all(isinstance(c, str) for c in completions):
            raise DataError(f"rollout: completions must be {ids.shape[0]} strings, one per row")
        p_ids, p_mask = left_padded(_ids(prompt_ids, "rollout: prompt_ids", vocab),
                                    _mask(prompt_mask, "rollout: prompt_mask"))
        lp = None if sampling_logps is None else \
            _finite(_cpu(sampling_logps, "rollout: sampling_logps", torch.float32), "rollout: sampling_logps", mask)
        # stored only once every argument is accepted: a refused call records nothing
        self.pieces["rollout"] = dict(prompt_ids=p_ids, prompt_mask=p_mask,
                                      completion_ids=ids, completion_mask=mask, completions=completions)
        if lp is not None:
            self.pieces["sampling_logps"] = lp

    def rewards(self, rewards, per_func: Optional[Mapping[str, object]] = None) -> None:
        """The (N,) rewards the advantages were computed from, and each reward function's (N,) column."""
        total = _cpu(rewards, "rewards", torch.float64).reshape(-1)
        if bool(torch.isinf(total).any()):                 # NaN: a row the reward function could not score
            raise DataError("rewards: ±inf is not a reward (NaN marks a row the reward function could not score)")
        if per_func is not None and not isinstance(per_func, Mapping):
            raise DataError(f"rewards: per_func must map reward-function names to columns, got "
                            f"{type(per_func).__name__}")
        cols = {str(k): _cpu(v, f"rewards[{k!r}]", torch.float64).reshape(-1) for k, v in (per_func or {}).items()}
        self.pieces["rewards"] = (total, cols or {self.reward: total})

    def advantages(self, advantages) -> None:
        """The (N,) advantages the loss used."""
        self.pieces["advantages"] = _finite(_cpu(advantages, "advantages", torch.float32).reshape(-1), "advantages")

    def logprobs(self, per_token_logps=None, *, old=None, ref=None, training: Optional[bool] = None) -> None:
        """(N, T) log-probs the loss used: the policy's (the loss forward), π_old's and the reference's."""
        if training is not None and not isinstance(training, bool):
            raise DataError(f"logprobs: training must be True or False (model.training), got {type(training).__name__}")
        got = {key: _cpu(value, key, torch.float32) for key, value in
               (("policy_logps", per_token_logps), ("old_logps", old), ("ref_logps", ref)) if value is not None}
        self.pieces.update(got)
        if training is not None:
            self.pieces["training"] = training

    def loss(self, loss, per_token_loss=None) -> None:
        """The scalar the loop called backward() on (summed over micro-batches as the loop logs it)."""
        value = _cpu(loss, "loss", torch.float64)
        if value.numel() != 1:
            raise DataError(f"loss: the scalar backward() was called on, got a tensor of shape {tuple(value.shape)}")
        value = float(_finite(value.reshape(()), "loss"))
        per_token = None if per_token_loss is None else _cpu(per_token_loss, "per_token_loss", torch.float32)
        self.pieces["loss"] = value
        if per_token is not None:
            self.pieces["per_token_loss"] = per_token

    def gradient(self, model) -> None:
        """The parameters' .grad after backward (all micro-batches) and BEFORE clipping and optimizer.step(); under
        DDP, after its backward (outside no_sync): the mean over the ranks."""
        self._model_piece("gradient", _model(model, "model"), grad=True)

    def model_after(self, model) -> None:
        self._model_piece("weights_after", _model(model, "model"))

    def _model_piece(self, key: str, model, grad: bool = False) -> None:
        """Rank 0 (or the one process) keeps a CPU copy of the parameters (or their .grad); another rank of a
        distributed loop only their Σ of squares, to say at save whether it held the same (the copy is rank 0's)."""
        _piece_has_data(key, model, grad)
        if _keeper():
            self.pieces[key] = (S.gradient_of if grad else S.snapshot)(model)
        else:
            self.prints[key] = D.fingerprint({n: (p.grad if grad else p).detach() for n, p in model.named_parameters()
                                              if not grad or p.grad is not None})

    # ---------------------------------------------------------------- out
    def recorded_pieces(self) -> tuple:
        have = set(self.pieces)
        return tuple(p for p in PIECES if p in have)

    def build(self):
        """The `StepTrace` of the recorded step (a DataError names a piece whose shape disagrees with the others)."""
        from rookworld_debug.record.build import build_trace
        return build_trace(self)

    def save(self, path) -> Path:
        """trace.json + trace.safetensors (+ state/ with the weights when they were recorded, and a manifest of their
        hashes); returns the folder. Written to a temporary folder beside `path` and renamed into place: a save that
        is interrupted leaves no half step, and a step saved over an earlier one replaces it whole. A folder that
        holds anything but a recorded step is refused.

        Under torch.distributed every rank calls it: the ranks' rows are gathered, rank 0 writes the global step to
        ITS `path` and every rank returns that folder once it is written (the others write nothing). A rank that
        does not come within `deadline_s` ends the wait in RankTimeoutError; rank 0's failure to write is raised on
        every rank."""
        w = D.world()
        if w is None:
            return self._save_here(Path(path))
        parts = D.exchange(D.local_part(self.pieces, self.prints, self.declared, self.gradient_accumulation_steps),
                           w, "StepRecorder.save: gathering every rank's rows", self.deadline_s)
        counts = D.check_parts(parts, self.declared["num_generations"])     # the same DataError on every rank
        return D.on_rank0(lambda: self._global(parts, counts, w.size)._save_here(Path(path)), w,
                          "StepRecorder.save: rank 0 writing the global step", self.deadline_s)

    def _global(self, parts: list, counts: list, size: int) -> "StepRecorder":
        """Rank 0's recorder of the global step: every rank's rows in rank order, rank 0's model pieces."""
        import copy
        out = copy.copy(self)
        tok = self.tokenizer
        pad = next((i for i in (tok.pad_token_id, tok.eos_token_id) if i is not None), 0)
        rows = D.merge_rows(parts, counts, self.declared["num_generations"], pad)
        out.pieces = {**{k: v for k, v in self.pieces.items() if k not in D.ROW_PIECES}, **rows}
        out.gradient_accumulation_steps = D.global_accumulation(self.gradient_accumulation_steps, size)
        out.rows_by_rank = D.spans(counts) if "rollout" in rows else ()
        out.rank_flags = (D.layout_flag(out.rows_by_rank, self.gradient_accumulation_steps), *D.rank_flags(parts))
        return out

    def _save_here(self, path: Path) -> Path:
        """`save` in this process (one process, or rank 0 with the gathered step): the trace with its weights,
        saved as every writer of a step saves (StepTrace.save: atomic, state/ and trace.json together)."""
        from dataclasses import replace
        return replace(self.build(), kept=self.kept_state()).save(path)

    def kept_state(self) -> Optional[S.RecordedState]:
        """The recorded weights as the state a step keeps (None when `model_before` was not called)."""
        p = self.pieces
        if "weights_before" not in p:
            return None
        kind, settings, opt_state, trainable, groups = p.get("optimizer_state", ("", {}, None, (), ()))
        cfg = p["model_config"]
        return S.RecordedState(model_type=str(cfg.get("model_type", "")), model_config=cfg,
                               before=p["weights_before"], after=p.get("weights_after"), gradient=p.get("gradient"),
                               reference=p.get("reference_weights"), optimizer_state=opt_state,
                               optimizer=kind if kind in S.OPTIMIZERS else "", optimizer_settings=dict(settings), trainable=trainable or tuple(p["weights_before"]),
                               tokenizer_dir=None, sampler=p.get("sampler_weights"), tokenizer=self.tokenizer,
                               optimizer_groups=groups)

    def check(self) -> "DeclarationCheck":
        """Replay this step against its declaration now: on a first healthy step, which keywords the loop computes
        other than declared (each with the value to pass), and the first phase that still disagrees. Pass
        `result.keywords` to the StepRecorder of later steps; `print(result)` says it in words."""
        import tempfile
        w = D.world()
        with tempfile.TemporaryDirectory(prefix="rookworld-check-") as tmp:
            saved = self.save(Path(tmp) / "step")        # under torch.distributed: rank 0's folder, on every rank
            if w is None:
                return _declaration_check(saved)
            return D.on_rank0(lambda: _declaration_check(saved), w, "StepRecorder.check: rank 0 replaying the step",
                              self.deadline_s)

    def recorded_record(self, config, loss_value: float) -> RecordedStep:
        p = self.pieces
        kind, settings, *_ = p.get("optimizer_state", ("", {}, None, (), ()))
        have = self.recorded_pieces()
        return RecordedStep(
            format=RECORD_FORMAT, trainer=self.trainer, step=self.step, recorded=have,
            missing=tuple(f"{k}: {WITHOUT[k]}" for k in PIECES if k not in have),
            loss=loss_value, per_token_loss=p.get("per_token_loss"), old_per_token_logps=p.get("old_logps"),
            policy_training_mode=p.get("training"), dtype=p.get("dtype", "float32"),
            sampler_dtype=self.sampler_precision or "", optimizer=kind,
            optimizer_settings=dict(settings), max_grad_norm=config.max_grad_norm,
            gradient_accumulation_steps=self.gradient_accumulation_steps, iteration=self.iteration,
            weights="state/" if "weights_before" in p else "", notes=self.notes, rows_by_rank=self.rows_by_rank,
            explicit=self.explicit, scheduler=dict(p.get("scheduler", {})))


# help(StepRecorder) and inspect show the keywords and their defaults, as the loop writes them
StepRecorder.__init__.__doc__ = StepRecorder._declare.__doc__
StepRecorder.__init__.__signature__ = inspect.signature(StepRecorder._declare)


def _declaration_check(saved: Path) -> "DeclarationCheck":
    from rookworld_debug.diagnosis.replay import replay_path
    rep = replay_path(saved)
    return DeclarationCheck(keywords={d.keyword: d.fitted for d in rep.declarations},
                            declared={d.keyword: d.declared for d in rep.declarations},
                            first_disagreement=rep.first_disagreement,
                            replayed=tuple(p["phase"] for p in rep.phases() if p["status"] != "not replayed"))


def _scheduler_state(scheduler, optimizer) -> dict:
    """What the update reads from a torch learning-rate scheduler: how often it stepped, the rate it last set, and
    the rate the optimizer holds (the two differ when something else sets it)."""
    epoch, last = getattr(scheduler, "last_epoch", None), getattr(scheduler, "get_last_lr", None)
    opt = optimizer if optimizer is not None else getattr(scheduler, "optimizer", None)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not callable(last) or opt is None:
        raise DataError(f"model_before: scheduler must be a torch.optim.lr_scheduler scheduler (last_epoch, "
                        f"get_last_lr) with its optimizer, got {type(scheduler).__name__}")
    try:
        rates = [float(x) for x in last()]
        group = float(opt.param_groups[0]["lr"])
    except (TypeError, ValueError, AttributeError, IndexError, KeyError) as err:
        raise DataError(f"model_before: the scheduler's or optimizer's learning rate cannot be read: {err}") from None
    if not rates or not all(math.isfinite(x) for x in (*rates, group)):
        raise DataError(f"model_before: the scheduler's learning rates {rates} or the optimizer's {group} are not "
                        "finite numbers")
    instance = _instance(scheduler)
    return {"last_epoch": float(epoch), "last_lr": rates[0], "group_lr": group,
            **({"instance": instance} if instance is not None else {})}


_INSTANCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _instance(obj) -> Optional[float]:
    """A number naming this Python object for the life of the process (52 random bits, exact as a float): two
    records of one scheduler carry the same number, a scheduler created anew between them another. Kept beside the
    object, never on it, so the loop's own checkpoints stay as they were."""
    try:
        return _INSTANCES.setdefault(obj, float(secrets.randbits(52)))
    except TypeError:                          # an object that takes no weak reference: no identity to record
        return None


def _keeper() -> bool:
    """Whether this process keeps the model pieces: one process, or rank 0 of a distributed loop."""
    w = D.world()
    return w is None or w.rank == 0


def _count(name: str, value, least: int) -> int:
    """An integer setting ≥ `least`, refused by name (a bool, a float with a fraction, a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or int(value) < least:
        raise ConfigError(name, f"an integer ≥ {least} expected, got {value!r}")
    return int(value)


def _model(model, what: str):
    """A transformers model (what the replay rebuilds: it has a config and named parameters); a
    DistributedDataParallel model is unwrapped to the module it trains."""
    model = D.unwrap(model)
    if not (isinstance(model, torch.nn.Module) and hasattr(getattr(model, "config", None), "to_dict")):
        raise DataError(f"{what}: a transformers model (torch.nn.Module with a .config) expected, got "
                        f"{type(model).__name__}")
    if next(model.parameters(), None) is None:
        raise DataError(f"{what}: the model has no parameters (nothing of it can be recorded)")
    return model


def _check_declared(declared: dict) -> None:
    """The declared objective, refused by name at construction (not when the step is saved): a loss type no
    registered family answers, a setting StepConfig does not have, a value its rules refuse."""
    from rookworld_debug.config import StepConfig
    StepConfig(**declared)          # names an unknown key, a loss type no family answers, a value its rules refuse


def left_padded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, P) prompts with their padding moved to the left (a right-padded loop's prompts, row by row): the same
    tokens at the same positions once position ids count real tokens, and the last prompt token at the right edge,
    where the completion starts."""
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise DataError(f"rollout: prompt_ids {tuple(ids.shape)} and prompt_mask {tuple(mask.shape)} must both be "
                        "(N, P)")
    trailing = (mask.flip(1).cumsum(1) == 0).sum(1)                                  # (N,) pads after the prompt
    if not bool(trailing.any()):
        return ids, mask
    idx = (torch.arange(ids.shape[1])[None] - trailing[:, None]) % ids.shape[1]     # (N, P) roll right per row
    return ids.gather(1, idx), mask.gather(1, idx)
