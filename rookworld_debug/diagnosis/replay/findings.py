"""A replay as findings: the first phase that disagrees (an error, ranked above everything downstream of it), the
later disagreements, and what agreed or could not be replayed."""
from __future__ import annotations

from rookworld_debug.diagnosis.findings import Evidence, Finding, Fix

from .ranks import with_ranks
from .records import PHASES, SUSPECT, Replay

# what to look at in a loop when a phase disagrees and no known mechanism names the cause
FIXES = {
    "generation": "Check how the rows are built: G consecutive rows per prompt (repeat_interleave), the loss mask "
                  "1 through the first EOS and 0 after it, the texts decoded from the same ids.",
    "rewards": "Check the join between completions and rewards: the row order the reward function saw, the labels "
               "it was given, and the weights and signs of the reward functions.",
    "advantages": "Check the advantage formula against the declared objective: the grouping (view(B, G)), the mean "
                  "and std per group, the std's ddof and ε, the sign.",
    "scoring": "Check the forward that computes log-probs: eval mode (no dropout), logits[:, P−1:−1] for the "
               "completion tokens, ÷ temperature before log_softmax, position ids counted from the attention mask, "
               "and the reference's own frozen weights.",
    "loss": "Check the loss against the declared objective: the advantage's sign, β and the KL estimator's sign, "
            "the aggregation (per-sequence mean, token sum ÷ tokens, …).",
    "gradient": "Check the backward: zero_grad before the step's first micro-batch, each micro-batch's loss ÷ the "
                "accumulation steps, backward on the loss that is logged.",
    "update": "Check the optimizer step: built over the policy's own parameters, clip_grad_norm_ before step(), "
              "one optimizer kept across steps, the learning rate it was given.",
}
# where a mechanism names the cause, what removes that mechanism (else the phase's FIXES)
CAUSE_FIXES = {
    "sampler_distribution_changed": "Sample from the distribution the loss scores: remove the sampler's filter, "
                                    "penalty, n-gram ban, forced minimum length or other temperature (a key of the "
                                    "model's generation_config, of generation_kwargs, or the sampling code), or "
                                    "declare the filter (top_p / top_k) the loop means to use.",
    "sampling_greedy": "Sample the rollout (do_sample=True at a temperature > 0): greedy decoding makes a group's G "
                       "completions one, so its rewards are equal and its advantages 0.",
    "sampling_draws_shared": "Give each row of a group its own random numbers: one generator for the batch, or one "
                             "per request seeded differently (seed + row), never one seed per group.",
}
REPLAY_SCORE = 100.0


def _fix(c) -> Fix:
    said = CAUSE_FIXES.get(c.cause) or FIXES[c.phase]
    return Fix(said, code_change=said)


def _evidence(c) -> tuple:
    out = (Evidence(name=f"replay/{c.phase}/difference", value=float(c.max_abs_diff),
                    definition=f"{c.measure} of {c.quantity}; tolerance {c.tolerance:.3g} (from the recorded "
                               f"precision); recorded {c.recorded or '—'}, recomputed {c.recomputed or '—'}",
                    batch="the recorded step", where=c.where or ""),)
    if c.fit:
        params = ", ".join(f"{k} = {_short(v)}" for k, v in c.fit.get("params", {}).items())
        out += (Evidence(name=f"replay/{c.phase}/fit_residual", value=_float(c.fit.get("residual")),
                         definition=f"residual of the fitted transformation ({c.fit.get('kind')}: {params}) against "
                                    f"the recorded values; it counts when within the tolerance "
                                    f"{c.tolerance:.3g}", batch="the recorded step"),)
    return out


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _short(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_short(x)}" for k, x in v.items()) + "}"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_short(x) for x in v[:8]) + (", …" if len(v) > 8 else "") + "]"
    return str(v)


def declaration_finding(fit, explicit: tuple = (), trl: bool = False) -> Finding:
    """The loop computes another declaration than the one it gave. A keyword the loop passed itself is its own
    claim, contradicted by its computation: an error (a CI gate must stop it). A default it never passed is a
    declaration to add: a warning naming the keyword. `trl`: a TRL capture, whose GRPOConfig holds every keyword:
    the trainer contradicts its own config (an error)."""
    if trl:
        return _trainer_contradicts_config(fit)
    kw = f"{fit.keyword}={fit.fitted!r}"
    said = fit.keyword in explicit
    return Finding(
        code="declaration_mismatch", severity="error" if said else "warning",
        cause=f"Your loop computes {kw}; you " + (f"passed {fit.keyword}={fit.declared!r} to StepRecorder yourself"
                                                  if said else f"left {fit.keyword} at its default "
                                                               f"{fit.declared!r}") +
              f". Under the declaration its {fit.phase} ({fit.quantity}) differs from the trusted recomputation by "
              f"{fit.difference:.4g} (tolerance {fit.tolerance:.3g}); under {kw} it agrees, and every other finding "
              f"is replayed under {kw}. " + (f"On this step {' and '.join(repr(v) for v in fit.equivalent)} "
                                             f"give{'s' if len(fit.equivalent) == 1 else ''} the same {fit.phase} "
                                             f"(the step cannot tell {fit.keyword}={fit.fitted!r} from "
                                             f"{'them' if len(fit.equivalent) > 1 else 'it'}). "
                                             if fit.equivalent else "") + (f"The loop contradicts what it declared: either it has a bug in its "
                                             f"{fit.phase}, or the declaration is wrong." if said else
                                             f"If {kw} is what you meant, the loop is not at fault: declare it."),
        evidence=(Evidence(name=f"replay/declaration/{fit.keyword}", value=float(fit.difference),
                           definition=f"{fit.phase} difference under the declared {fit.keyword}={fit.declared!r} "
                                      f"(it agrees under {kw}); tolerance {fit.tolerance:.3g}",
                           batch="the recorded step"),),
        fix=Fix(f"Pass {kw} to StepRecorder (or change the loop if {fit.keyword}={fit.declared!r} is the objective "
                "you meant).", code_change=f"StepRecorder(tokenizer, ..., {kw})"),
        alternatives=(f"a fault in the {fit.phase} phase that happens to compute {kw}",), score=REPLAY_SCORE)


def _trainer_contradicts_config(fit) -> Finding:
    """A TRL capture whose step computes another GRPOConfig value than its config holds."""
    kw = f"{fit.keyword}={fit.fitted!r}"
    return Finding(
        code="declaration_mismatch", severity="error",
        cause=f"TRL's GRPOTrainer computed this step as {kw}, while its GRPOConfig says {fit.keyword}="
              f"{fit.declared!r}: under the config its {fit.phase} ({fit.quantity}) differs from the trusted "
              f"recomputation by {fit.difference:.4g} (tolerance {fit.tolerance:.3g}); under {kw} it agrees, and every "
              f"other finding is replayed under {kw}. The trainer reads its own attribute (trainer.{fit.keyword}), "
              "copied from the config when it was built: something set it apart since (an assignment after "
              "construction, a subclass, a patched method).",
        evidence=(Evidence(name=f"replay/declaration/{fit.keyword}", value=float(fit.difference),
                           definition=f"{fit.phase} difference under GRPOConfig's {fit.keyword}={fit.declared!r} "
                                      f"(it agrees under {kw}); tolerance {fit.tolerance:.3g}",
                           batch="the recorded step"),),
        fix=Fix(f"Find what sets trainer.{fit.keyword} after the GRPOConfig (or overrides it in a subclass) and "
                f"remove it, or set {kw} in GRPOConfig if that is the objective you meant.",
                code_change=f"del the assignment to trainer.{fit.keyword} (or GRPOConfig({kw}))"),
        alternatives=(f"a fault in the {fit.phase} phase that happens to compute {kw}",), score=REPLAY_SCORE)


def pass_finding(note) -> Finding:
    """num_iterations > 1 declared without which pass: what the records show, and the two calls that make π_old's
    and the sampler's log-probs checkable. A note about the declaration, never an error about the loop."""
    which = {0: "the first pass", 1: "a later pass (π_old is not the weights before the update)",
             None: "a pass the records cannot tell"}[note.inferred]
    if note.mu_inferred:
        said = ("Your loop left num_iterations at its default 1 and did not say which pass over the rollout this step "
                f"is, but its records show {which}: {note.why}. The replay takes it as a later pass of a loop that "
                "takes several optimizer steps per rollout (num_iterations ≥ 2): π_old's and the sampler's log-probs "
                "are not replayed. If your loop takes one pass per rollout, π_old should equal the loss forward's "
                "log-probs: then it is computed from other weights than the policy's (a stale π_old or sampler).")
    else:
        said = (f"Your loop declares num_iterations={note.num_iterations} but not which pass over the rollout this "
                f"step is; its records show {which}: {note.why}. The replay takes it so: π_old's and the sampler's "
                "log-probs are not replayed (the weights that sampled the rollout were not recorded).")
    return Finding(
        code="declaration_incomplete", severity="warning", cause=said,
        evidence=(Evidence(name="replay/declaration/iteration", value=float(note.num_iterations),
                           definition=("num_iterations and iteration not passed" if note.mu_inferred else
                                       "num_iterations declared without iteration") + f"; {note.why}",
                           batch="the recorded step"),),
        fix=Fix("Pass iteration=k (0 for the rollout's first optimizer pass) to StepRecorder and record the weights "
                "that sampled the rollout with rec.sampler(model_that_sampled) on later passes.",
                code_change="StepRecorder(tokenizer, ..., num_iterations=mu, iteration=k); rec.sampler(sampler)"),
        score=REPLAY_SCORE / 4)


def _finding(c, first: bool, upstream: str = "") -> Finding:
    code = c.cause or f"replay_{c.phase}"
    what = c.explanation or "no known mechanism reproduces the recorded values; the place is the finding"
    if first:
        cause = (f"The first phase that disagrees with its replay is {c.phase}: {c.quantity} differs from the "
                 f"trusted recomputation by {c.max_abs_diff:.4g} (tolerance {c.tolerance:.3g}) at {c.where}. {what}.")
    else:
        cause = (f"{c.phase} also disagrees with its replay ({c.quantity}: {c.max_abs_diff:.4g} at {c.where}); it "
                 f"comes after {upstream}, which may explain it. {what}.")
    return Finding(code=code, severity="error" if first else "warning", cause=cause, evidence=_evidence(c),
                   fix=_fix(c),
                   alternatives=() if not c.cause else (f"replay_{c.phase}: another bug in the {c.phase} phase that "
                                                        "happens to reproduce the same values",),
                   score=REPLAY_SCORE if first else REPLAY_SCORE / 2 - PHASES.index(c.phase))


def _suspect_finding(c) -> Finding:
    """A warning: the recorded step is unlikely under the declaration, by the stated probability, but not beyond
    doubt (a statistical test past its warning bound only), or it has a reading that is no fault (a check whose
    tolerance is 0: the sentence names both readings)."""
    said = (f"A test of the recorded values' statistics, not a recomputation: {c.measure} = {c.max_abs_diff:.3g}, "
            f"past its warning bound {c.tolerance:.3g} but not its error bound." if c.tolerance else
            f"{c.measure}: {c.max_abs_diff:.3g}.")
    return Finding(code=c.cause or f"replay_{c.phase}", severity="warning",
                   cause=f"{c.phase[0].upper() + c.phase[1:]}: {c.explanation}. {said}",
                   evidence=_evidence(c), fix=_fix(c),
                   score=REPLAY_SCORE / 2)


FIX_COMMAND = " Then `rookworld-debug whatif STEP --fix` shows what the fix changes in this step's update."


def _with_fix_command(f: Finding, replay: Replay) -> Finding:
    """The fix line names the corrected step's command where it can run: a first disagreement in a phase it
    recomputes from, and the update replayed (the weights before and after, the gradient and the optimizer's state
    kept)."""
    import dataclasses
    from .records import CORRECTABLE
    first = replay.first_disagreement
    if first is None or first.phase not in CORRECTABLE or not any(
            c.phase == "update" and c.quantity.startswith("update: θ_after") and c.status != "not replayed"
            for c in replay.checks):
        return f
    return dataclasses.replace(f, fix=dataclasses.replace(f.fix, description=f.fix.description + FIX_COMMAND))


def replay_findings(replay: Replay) -> list[Finding]:
    first = replay.first_disagreement
    explicit = getattr(getattr(replay.trace, "recorded", None), "explicit", ())
    trl = getattr(replay.trace, "capture", None) is not None
    out = [declaration_finding(d, explicit, trl) for d in replay.declarations]
    if replay.pass_note is not None:
        out.append(pass_finding(replay.pass_note))
    spans = getattr(getattr(replay.trace, "recorded", None), "rows_by_rank", ())   # a distributed loop's ranks
    if first is not None:
        out.append(with_ranks(_with_fix_command(_finding(first, True), replay), first, spans))
        out += [with_ranks(_finding(c, False, first.phase), c, spans) for c in replay.checks
                if c.status == "disagree" and c is not first]
    elif not any(c.status == SUSPECT for c in replay.checks):
        agreed = sorted({c.phase for c in replay.checks if c.status == "agree"}, key=PHASES.index)
        said = "".join(f" {c.phase}: {c.explanation}." for c in replay.checks
                       if c.status == "agree" and c.explanation)        # how an agreement was reached, where it says
        out.append(Finding(code="replay_agrees", severity="info",
                           cause=f"Every replayed phase agrees with the trusted recomputation ({', '.join(agreed)}); "
                                 f"weights: {replay.weights}.{said}",
                           evidence=tuple(e for c in replay.checks if c.status == "agree" for e in _evidence(c)),
                           fix=Fix("Nothing to fix in the phases that were replayed."), score=0.0))
    out += [_suspect_finding(c) for c in replay.checks if c.status == SUSPECT]
    if replay.skipped:
        out.append(Finding(code="replay_incomplete", severity="info",
                           cause="Not replayed: " + "; ".join(f"{c.phase} ({c.quantity}): {c.explanation}"
                                                              for c in replay.skipped) + ".",
                           evidence=(Evidence("replay/not_replayed", len(replay.skipped), "quantities the replay "
                                              "could not recompute", "the recorded step"),),
                           fix=Fix("Keep or record the missing pieces to check them (StepConfig.keep_weights, "
                                   "capture_steps(keep_weights=True), rookworld_debug.record.StepRecorder)."),
                           score=0.0))
    return out

