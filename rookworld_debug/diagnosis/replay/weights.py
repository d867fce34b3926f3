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


def _tokenizer(folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def weights_for(trace, path) -> Weights:
    """The recorded state (a recorded step), the embedded/local model a run_step trace names at its first step,
    else none (with the reason)."""
    if trace.recorded is not None:
        return _recorded(trace, path)
    if trace.capture is not None:
        return Weights.none("a TRL capture keeps no weights of its step (the log-probs, gradient and update are "
                            "compared with TRL's own numbers at capture time)")
    return _run_step(trace)


def _recorded(trace, path) -> Weights:
    from rookworld_debug.grpo.trace.state import build_model, read_state
    state = read_state(path) if path is not None else None
    if state is None and trace.recorded.weights == "state/":
        return Weights.none("incomplete save: the trace says its weights are in state/, which is missing")
    if state is None or state.before is None:
        return Weights.none("the loop recorded no weights (StepRecorder.model_before)")
    tok = _tokenizer(state.tokenizer_dir) if state.tokenizer_dir is not None else None
    policy = build_model(state, state.before)
    ref = build_model(state, state.reference) if state.reference is not None else None
    sampler = build_model(state, state.sampler) if state.sampler is not None else None
    same = state.reference is not None and all(torch.equal(state.reference[k], state.before[k])
                                               for k in state.before if k in state.reference)
    have = {"policy"} if "policy_logps" in trace.recorded.recorded else set()
    return Weights(policy=policy, sampler=sampler, reference=ref, tokenizer=tok,
                   eos=None if tok is None else tok.eos_token_id, state=state, trainable=state.trainable, have=have, ref_is_policy=same,
                   source="the weights the loop recorded (state/)")


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
    """run_step's model, reloaded by name; it is this step's policy only when the step's policy and reference
    log-probs agree (the step-0 identity): later steps of a run keep no weights."""
    from rookworld_debug.models.loading import load_policy_and_reference
    from rookworld_debug.models.provenance import weights_sha256
    c, prov = trace.config, trace.setup.provenance
    eos = prov.get("eos_token_id") if isinstance(prov, dict) else None
    if getattr(c, "init_policy", None) or getattr(c, "warmup_steps", 0) or (prov or {}).get("start"):
        return Weights.none("the step started from drifted weights the trace does not keep", eos=eos)
    try:
        with _quiet_loading():
            loaded = load_policy_and_reference(c.model, dtype=c.dtype)
    except RookWorldError as err:
        return Weights.none(f"the model {c.model!r} cannot be loaded here ({err})", eos=eos)
    if prov.get("weights_sha256") and weights_sha256(loaded.policy) != prov.get("weights_sha256"):
        return Weights.none(f"the model {c.model!r} here is not the one the step loaded (weights hash differs)",
                            eos=eos)
    r = trace.rollout
    at_start = r.ref_per_token_logps is not None and bool(
        ((r.per_token_logps - r.ref_per_token_logps).abs() * r.completion_mask).max() <= 1e-4)
    names = tuple(n for n, p in loaded.policy.named_parameters() if p.requires_grad)
    if not at_start:
        return Weights(reference=loaded.reference, tokenizer=loaded.tokenizer, eos=loaded.tokenizer.eos_token_id,
                       source=f"the model {c.model!r} (reference only)", why="the step's policy is not its starting "
                       "weights (its log-probs differ from the reference's) and the trace keeps no weights",
                       why_update="a run_step trace keeps no weights after the update")
    return Weights(policy=loaded.policy.eval(), reference=loaded.reference, tokenizer=loaded.tokenizer,
                   eos=loaded.tokenizer.eos_token_id, trainable=names, have={"policy"}, ref_is_policy=True,
                   source=f"the model {c.model!r}, reloaded (its weights hash matches the step's)",
                   why_update="a run_step trace keeps no weights after the update")
