"""Run-level invariants: what every healthy run keeps, checked on the per-step records a log holds (TRL's
log_history, `rookworld-debug run`'s table.csv) and on the captured steps of a run folder.

* the optimizer applied what the gradient asked: lr > 0 and a non-zero gradient move the weights
  (table: param_delta_norm; captures: the weights' hash changes between captured steps);
* the reference stays frozen: once the policy has moved, KL to the reference is not exactly 0 while β > 0
  (TRL logs `kl` only when β ≠ 0);
* the training reward and an independent score of the same task (held-out greedy reward, the built-in task
  reward, format validity) move together: the reward rising while the task score falls is a misspecified or
  hacked reward;
* no logged setting inverts the objective (a negative learning rate or β).
Each needs the step it holds at and the steps before it only, so it names the fault at the first step it can.
"""
from __future__ import annotations

import math

from rookworld_debug.diagnosis.checks_invariants import MIN_GRAD, NO_STEP
from rookworld_debug.diagnosis.checks_run import _ols, series
from rookworld_debug.diagnosis.evidence import LOG, ev
from rookworld_debug.diagnosis.findings import Finding, Fix

# KL of a reference that is the policy: ℓ − ℓ^ref is 0 to the last bit on one device (k3 of 0 is 0); a policy one
# AdamW step away has KL ≥ ~1e-8 even at lr 1e-7 (k3 ≈ ½·Δℓ², Δℓ ≳ 1e-4)
KL_ZERO = 1e-10
# independent scores of the task the training reward is meant to measure (table.csv names; TRL: format/legal keys)
TASK_SCORES = ("heldout_reward", "task_score", "format_valid")
MIN_TREND_POINTS = 5


def _f(row, key):
    v = row.get(key)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _moved(row) -> bool:
    """This step's update asked for a move: lr > 0 and a non-zero gradient (NaN/absent: unknown → False)."""
    lr, g = _f(row, "learning_rate"), _f(row, "grad_norm")
    return lr is not None and g is not None and lr > 0 and g > MIN_GRAD


def check_optimizer_run(rows) -> list[Finding]:
    """A step with lr > 0 and a non-zero gradient whose weights did not move (param_delta_norm logged)."""
    for r in rows:
        pdn = _f(r, "param_delta_norm")
        if pdn is None or not _moved(r):
            continue
        lr, g = _f(r, "learning_rate"), _f(r, "grad_norm")
        bound = NO_STEP * lr * min(1.0, g)
        if pdn <= bound:
            return [Finding(
                code="optimizer_no_op", severity="error",
                cause=f"The optimizer applied nothing at step {r['step']}: lr = {lr:.3g} and a gradient of norm "
                      f"{g:.3g}, yet the weights moved by {pdn:.3g}.",
                evidence=(ev("param_delta_norm", pdn, "‖θ_after − θ_before‖₂ of the step", LOG, "run table"),
                          ev("learning_rate", lr, "the step's learning rate", LOG),
                          ev("grad_norm", g, "the step's gradient norm before clipping", LOG),
                          ev("smallest_expected_step", bound, f"{NO_STEP:g} × lr × min(1, ‖g‖)", LOG)),
                fix=Fix("Build the optimizer over the policy's own parameters and call step() after backward.",
                        code_change="optimizer over policy.parameters(); backward → step → zero_grad"),
                alternatives=("frozen parameters or an optimizer over a copy of the model",), score=10.8,
                step=r["step"])]
    return []


def check_kl_zero_run(rows) -> list[Finding]:
    """KL exactly 0 at a step after an update that asked to move the policy, with β > 0 (or a logged `kl`)."""
    moved_at = None
    for r in rows:
        kl, beta = _f(r, "kl"), _f(r, "beta")
        if moved_at is not None and kl is not None and kl <= KL_ZERO and (beta is None or beta > 0):
            pdn = [x for x in (_f(q, "param_delta_norm") for q in rows if moved_at <= q["step"] < r["step"])
                   if x is not None]
            if pdn and max(pdn) <= 0:
                return []                       # the weights never moved: check_optimizer_run names it
            evs = (ev("kl", kl, "logged `kl`: token-mean KL estimate to the reference", LOG, "triage: kl curve"),
                   ev("first_update_step", moved_at, "the first step whose update had lr > 0 and a non-zero gradient",
                      LOG),
                   ev("beta", beta if beta is not None else math.nan, "β of the step (TRL logs kl only when β ≠ 0)",
                      LOG),
                   ev("param_delta_norm_max", max(pdn) if pdn else math.nan, "largest ‖Δθ‖ of the steps between "
                      "(NaN: not logged)", LOG))
            return [Finding(
                code="reference_tracks_policy", severity="error",
                cause=f"KL to the reference is exactly 0 at step {r['step']} although the policy was updated from "
                      f"step {moved_at} on: the reference is (or moves with) the policy, so β·KL never acts.",
                evidence=evs, fix=Fix("Create the reference as a separate, frozen copy of the start weights.",
                                      code_change="reference = copy.deepcopy(policy).eval() before the first update"),
                alternatives=() if pdn else ("optimizer_no_op: a policy that never moved keeps KL 0 as well",),
                score=10.1, step=r["step"])]
        if moved_at is None and _moved(r):
            moved_at = r["step"]
    return []


def _score_keys(rows) -> list[str]:
    keys = {k for r in rows for k in r if isinstance(k, str)}
    named = [k for k in TASK_SCORES if k in keys]
    return named + sorted(k for k in keys if k not in named and k != "reward" and ("format" in k or "legal" in k))


def check_reward_task_diverge(rows) -> list[Finding]:
    """The training reward's trend and an independent task score's trend both exclude 0, in opposite directions."""
    rw = series(rows, "reward")
    fit_r = _ols(rw) if len(rw) >= MIN_TREND_POINTS else None
    if fit_r is None or abs(fit_r[0]) <= fit_r[1]:
        return []
    for key in _score_keys(rows):
        pts = series(rows, key)
        fit = _ols(pts) if len(pts) >= MIN_TREND_POINTS else None
        if fit is None or abs(fit[0]) <= fit[1] or (fit[0] > 0) == (fit_r[0] > 0):
            continue
        up = fit_r[0] > 0
        return [Finding(
            code="reward_task_diverge", severity="error" if up else "warning",
            cause=f"The training reward {'rises' if up else 'falls'} while `{key}`, an independent score of the "
                  f"same task, {'falls' if up else 'rises'}: the reward does not measure the task (misspecified "
                  "or hacked).",
            evidence=(ev("reward_trend", fit_r[0], "OLS change of the training reward over the run (slope × span)",
                         LOG, "triage: reward curve"),
                      ev("reward_trend_ci95", fit_r[1], "half-width of its 95 % t-interval", LOG),
                      ev(f"{key}_trend", fit[0], f"OLS change of {key} over the run", LOG),
                      ev(f"{key}_trend_ci95", fit[1], "half-width of its 95 % t-interval", LOG),
                      ev("steps", min(len(rw), len(pts)), "logged steps with both", LOG)),
            fix=Fix("Make the reward pay for what the task score measures (a format/legality gate, the engine's "
                    "or the arbiter's truth).", code_change="score the task's own truth in the reward"),
            alternatives=("a held-out set too small or too different to track the training prompts",),
            score=9.0, step=pts[0][0])]
    return []


def check_objective_run(rows) -> list[Finding]:
    """A logged learning rate or β below 0."""
    for key, why in (("learning_rate", "a negative learning rate climbs the loss"),
                     ("beta", "a negative β pays the policy for leaving the reference")):
        bad = [(s, v) for s, v in series(rows, key) if v < 0]
        if bad:
            return [Finding(
                code="objective_inverted", severity="error",
                cause=f"{key} is {bad[0][1]:g} at step {bad[0][0]}: {why}.",
                evidence=(ev(key, bad[0][1], f"logged {key}", LOG), ev("steps_negative", len(bad), "steps", LOG)),
                fix=Fix(f"Use a positive {key}."), score=10.9, step=bad[0][0])]
    return []


def check_captured_weights(traces: dict) -> list[Finding]:
    """Captured steps t < t' with the same weights hash at their starts although step t asked to move them; or
    weights that did move while a later capture's reference log-probs still equal the policy's (β > 0)."""
    return _no_op_captures(traces) or _reference_follows(traces)


def check_captured_rewards(traces: dict) -> list[Finding]:
    """Consecutive captured steps whose later rewards are the earlier step's rows' — its recorded rewards, or the
    project's RookWorld reward of its completions against their labels (a reward the replay cannot call is compared
    through that candidate) — row for row, on other completions: a reward function one batch late."""
    from rookworld_debug.diagnosis.replay.consecutive import late_by_one, new_batch
    steps = sorted(traces)
    for a, b in zip(steps, steps[1:]):
        ta, tb = traces[a], traces[b]
        if not new_batch(ta, tb):
            continue                                    # no candidate computed for one rollout seen twice
        rb = tb.rewards.rewards
        for what, ra in _earlier_rewards(ta):
            if late_by_one(ta, tb, ra):
                return [Finding(
                    code="rewards_other_batch", severity="error",
                    cause=f"The rewards are one batch late: step {b}'s {rb.numel()} rewards are {what}, row for "
                          f"row, although step {b} scored other completions; every advantage of step {b} belongs "
                          "to another completion.",
                    evidence=(ev("rows_equal", float(rb.numel()), f"rows of step {b} whose reward equals {what} "
                                 "(to 1e-5 × max(1, |r|))", "captures"),
                              ev("distinct_values", float(rb.double().unique().numel()), f"distinct rewards of step "
                                 f"{b} (3 or more: their equality is no chance)", "captures")),
                    fix=Fix("Return the rewards of the completions the reward function was called with.",
                            code_change="no cache, queue or asynchronous result in the reward function carried "
                                        "from one call to the next"),
                    alternatives=("reward_has_memory",), score=10.2, step=b)]
    return []


def _earlier_rewards(trace):
    """(what, (N,) rewards) a lagged reward would hand the next step: the step's recorded rewards, then the
    project's RookWorld reward of its completions against their recorded labels (when it has them)."""
    from rookworld_debug.diagnosis.replay.data_phases import rookworld_candidate
    yield f"step {_step_label(trace)}'s recorded rewards", trace.rewards.rewards
    candidate = rookworld_candidate(trace)
    if candidate is not None:
        yield f"the RookWorld reward of step {_step_label(trace)}'s completions", candidate


def _step_label(trace) -> str:
    cap = trace.capture
    return str(int(cap.global_step)) if cap is not None else "k"


def _reference_follows(traces: dict) -> list[Finding]:
    steps = sorted(traces)
    start = _hash(traces[steps[0]]) if steps else None
    for s in steps[1:]:
        t = traces[s]
        h, r = _hash(t), t.rollout
        if start is None or h is None or h == start or r.ref_per_token_logps is None or not float(t.loss.beta) > 0:
            continue
        m = r.completion_mask.bool()
        gap = (r.per_token_logps.float() - r.ref_per_token_logps.float())[m]
        if gap.numel() and float(gap.abs().max()) <= 1e-6:
            return [Finding(
                code="reference_tracks_policy", severity="error",
                cause=f"The reference moves with the policy: at step {s} the weights differ from the run's start "
                      "(their hash changed) yet the reference's log-probs equal the policy's on every token.",
                evidence=(ev("max_abs_logp_gap", float(gap.abs().max()), "max |ℓ − ℓ^ref| on the masked sampled "
                             "tokens of the captured step", "captures"),
                          ev("weights_changed", 1.0, f"the weights' sha256 at step {s} differs from step "
                             f"{steps[0]}'s", "captures"),
                          ev("beta", float(t.loss.beta), "β of the KL term", "config")),
                fix=Fix("Create the reference as a separate, frozen copy of the start weights.",
                        code_change="reference = copy.deepcopy(policy).eval() (TRL: never ref_model = model)"),
                score=10.1, step=s)]
    return []


def _no_op_captures(traces: dict) -> list[Finding]:
    steps = sorted(traces)
    for a, b in zip(steps, steps[1:]):
        ta, tb = traces[a], traces[b]
        ha, hb = _hash(ta), _hash(tb)
        cap = ta.capture
        if ha is None or ha != hb or cap is None:
            continue
        lr, g = float(cap.learning_rate), float(cap.grad_norm)
        if not (lr > 0 and math.isfinite(g) and g > MIN_GRAD):
            continue
        return [Finding(
            code="optimizer_no_op", severity="error",
            cause=f"The optimizer applied nothing: the weights at the start of step {b} hash the same as at the start "
                  f"of step {a}, although step {a} had lr = {lr:.3g} and a gradient of norm {g:.3g}.",
            evidence=(ev("same_weights_hash", 1.0, f"sha256 of the weights at the starts of captured steps {a} and "
                         f"{b} are equal", "captures"),
                      ev("learning_rate", lr, f"step {a}'s learning rate", "captures"),
                      ev("grad_norm", g, f"step {a}'s gradient norm before clipping", "captures")),
            fix=Fix("Make the optimizer step the trained model's parameters.",
                    code_change="optimizer over the model's own parameters; check requires_grad and the step call"),
            alternatives=("frozen parameters", "a learning-rate schedule at 0"), score=10.8, step=a)]
    return []


def _hash(trace):
    prov = getattr(trace.setup, "provenance", None) if trace.setup is not None else None
    h = prov.get("weights_sha256") if isinstance(prov, dict) else None
    return h if isinstance(h, str) and h else None
