"""Where a replay's weights come from: the recorded state beside a trace, or the model a run_step trace names."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch

from rookworld_debug.errors import RookWorldError


@dataclass
class Weights:
    policy: Optional[torch.nn.Module] = None        # the weights before the update
    sampler: Optional[torch.nn.Module] = None       # the weights that sampled the rollout, when recorded apart
    reference: Optional[torch.nn.Module] = None
    tokenizer: object = None
    eos: Optional[int] = None
    state: object = None                             # grpo.trace.state.RecordedState
    trainable: tuple = ()
    have: set = field(default_factory=set)           # which recorded log-probs to hold against the policy
    ref_is_policy: bool = False                      # reference weights = the policy's (cannot tell the two apart)
    source: str = ""
    why: str = ""                                    # why the weight phases are not replayed
    why_update: str = ""
    cache: dict = field(default_factory=dict)       # recomputes of these weights, shared by a replay's passes

    def memo(self, key, compute):
        """`compute()` once per key (log-probs per model; the declared loss's gradient per declaration)."""
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    @staticmethod
    def none(why: str, **kw) -> "Weights":
        return Weights(source=f"none: {why}", why=why, why_update=why, **kw)


def _tokenizer(folder, top_id: int):
    """The recorded tokenizer, which must decode every id of the rollout: read from its tokenizer.json where that
    is what transformers would load (models.tokenizer_file), else transformers' to parse, the types that parse fails
    with named here."""
    from rookworld_debug.errors import TraceError
    from rookworld_debug.models import tokenizer_file
    from rookworld_debug.models.custom_code import refuse_custom_code
    refuse_custom_code(folder, TraceError)
    tok = tokenizer_file.read(folder)
    tok = tok if tok is not None else _auto_tokenizer(folder)
    if len(tok) <= top_id:
        raise TraceError(f"{folder}: the recorded tokenizer has {len(tok)} tokens; the rollout holds id {top_id}")
    return tok


def _auto_tokenizer(folder):
    from transformers import AutoTokenizer
    from rookworld_debug.errors import TraceError
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise TraceError(f"{folder}: the recorded tokenizer is unreadable ({type(err).__name__}: "
                         f"{str(err)[:200]})") from None


def weights_for(trace, path) -> Weights:
    """The weights the step kept (a recorded step's state/, a run_step trace's or a TRL capture's kept weights, in
    memory or beside the trace), else the embedded/local model a run_step trace names at its first update, else none
    (with the reason). TraceError when the step's rows are not inputs of that model (`check_rows_fit`)."""
    w = _weights_for(trace, path)
    if w.policy is not None:
        check_rows_fit(trace.rollout, w.policy)
    return w


def check_rows_fit(rollout, model) -> None:
    """TraceError, before any forward, when the rollout's rows are not inputs of `model`: an id outside its
    vocabulary, or rows longer than its position embeddings (a tampered or foreign trace is named here, not an
    IndexError inside the embedding)."""
    from rookworld_debug.errors import TraceError
    ids = [t for t in (rollout.prompt_ids, rollout.completion_ids) if t.numel()]
    rows = model.get_input_embeddings().num_embeddings
    if ids and (min(int(t.min()) for t in ids) < 0 or max(int(t.max()) for t in ids) >= rows):
        raise TraceError(f"the step's token ids run {min(int(t.min()) for t in ids)} … "
                         f"{max(int(t.max()) for t in ids)}; the recorded model has {rows} ids")
    length = rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
    limit = getattr(model.config, "n_positions", None)
    if isinstance(limit, int) and length > limit:
        raise TraceError(f"the step's rows are {length} tokens (prompt and completion); the recorded model has "
                         f"{limit} positions")


def _weights_for(trace, path) -> Weights:
    from rookworld_debug.grpo.trace.state import read_state
    kept = getattr(trace, "kept", None)
    state = kept if kept is not None else read_state(path) if path is not None else None
    said = trace.recorded.weights if trace.recorded is not None else getattr(trace, "weights", "")
    if state is None and said == "state/" and path is not None:
        return Weights.none("incomplete save: the trace says its weights are in state/, which is missing")
    if trace.recorded is not None:
        if state is None or state.before is None:
            return Weights.none("the loop recorded no weights (StepRecorder.model_before)")
        return _from_state(state, {"policy"} if "policy_logps" in trace.recorded.recorded else set(),
                           "the weights the loop recorded (state/)", trace)
    if kept is not None or (state is not None and said == "state/"):
        return _from_state(state, {"policy"}, "the weights the step kept (state/)" if kept is None else
                           "the weights the step kept (in memory)", trace, trl=trace.capture is not None)
    if trace.capture is not None:
        return Weights.none("the TRL capture kept no weights of its step (capture with keep_weights=True to replay "
                            "its log-probs, gradient and update)")
    return _run_step(trace)


def _from_state(state, have: set, source: str, trace, trl: bool = False) -> Weights:
    """Models of the kept weights. `trl`: they score as TRL 1.16's GRPOTrainer does (the attention mask only, no
    position ids: a left-padded row is scored at the model's default positions), the computation a capture's
    numbers are held to."""
    from rookworld_debug.grpo.trace.state import build_model

    def build(weights):
        return None if weights is None else _plain_positions(build_model(state, weights)) if trl else \
            build_model(state, weights)
    ids = trace.rollout.completion_ids
    tok = state.tokenizer if state.tokenizer is not None else \
        _tokenizer(state.tokenizer_dir, int(ids.max()) if ids.numel() else -1) if state.tokenizer_dir is not None \
        else None
    policy, ref, sampler = build(state.before), build(state.reference), build(state.sampler)
    same = state.reference is not None and all(torch.equal(state.reference[k], state.before[k])
                                               for k in state.before if k in state.reference)
    return Weights(policy=policy, sampler=sampler, reference=ref, tokenizer=tok,
                   eos=None if tok is None else tok.eos_token_id, state=state, trainable=state.trainable, have=have,
                   ref_is_policy=same, source=source)


def scoring_model(trace, model):
    """`model` scoring as the step's trainer did: TRL's captures without position ids, else as built."""
    return _plain_positions(model) if trace.capture is not None else model


def _plain_positions(model):
    """`model` whose transformer body drops `position_ids` (every forward goes through it: the LM's own and the
    scoring's KV-cached one), so positions count the left padding as TRL's forward does. This replay's own model
    instance, never the user's."""
    body = model.base_model
    forward = body.forward

    def plain(*args, position_ids=None, **kw):
        return forward(*args, **kw)
    plain.sampling_forward = forward          # generate() counted positions from the mask while it sampled
    body.forward = plain
    return model


@contextmanager
def sampling_positions(model):
    """`model` as generate() ran it while sampling, positions counted from the attention mask, for the duration:
    a TRL capture's scoring model (`scoring_model`) drops them only for the trainer's forward."""
    body = model.base_model
    plain = body.forward
    original = getattr(plain, "sampling_forward", None)
    if original is None:
        yield model
        return
    body.forward = original
    try:
        yield model
    finally:
        body.forward = plain


@contextmanager
def _quiet_loading():
    """No weight-loading progress bar on the user's terminal from inside a diagnosis (restored after)."""
    from transformers.utils import logging as tl
    was = tl.is_progress_bar_enabled()
    tl.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            tl.enable_progress_bar()


def _run_step(trace) -> Weights:
    """run_step's model, reloaded by name, for a step that kept no weights: it is the step's policy when the
    provenance says the policy had not moved — no start record (init_policy, warm-up), no optimizer step before this
    one — and its hash is the one the step loaded."""
    from rookworld_debug.models.loading import load_policy_and_reference
    from rookworld_debug.models.provenance import weights_sha256
    c, prov = trace.config, trace.setup.provenance
    eos = prov.get("eos_token_id") if isinstance(prov, dict) else None
    if getattr(c, "init_policy", None) or getattr(c, "warmup_steps", 0) or (prov or {}).get("start"):
        return Weights.none("the step started from drifted weights the trace does not keep (keep_weights)", eos=eos)
    moved = (prov or {}).get("optimizer_steps_before")
    if moved is None or moved:
        why = (f"the policy had taken {moved} optimizer step(s) before this one" if moved else
               "the trace does not say whether the policy was updated before this step")
        return Weights.none(f"{why}, and the trace keeps no weights (keep_weights)", eos=eos)
    try:
        with _quiet_loading():
            loaded = load_policy_and_reference(c.model, dtype=c.dtype)
    except RookWorldError as err:
        return Weights.none(f"the model {c.model!r} cannot be loaded here ({err})", eos=eos)
    if prov.get("weights_sha256") and weights_sha256(loaded.policy) != prov.get("weights_sha256"):
        return Weights.none(f"the model {c.model!r} here is not the one the step loaded (weights hash differs)",
                            eos=eos)
    names = tuple(n for n, p in loaded.policy.named_parameters() if p.requires_grad)
    return Weights(policy=loaded.policy.eval(), reference=loaded.reference, tokenizer=loaded.tokenizer,
                   eos=loaded.tokenizer.eos_token_id, trainable=names, have={"policy"}, ref_is_policy=True,
                   source=f"the model {c.model!r}, reloaded (its weights hash matches the step's)",
                   why_update="a run_step trace keeps no weights after the update")
