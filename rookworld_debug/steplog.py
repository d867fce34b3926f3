"""The phase-by-phase text log (the layout of rookworld-trl's manual debug run), rendered from a StepTrace (a view: no GRPO math here)."""
from __future__ import annotations

import math


def _kl_knob(config) -> str:
    """The config field naming the KL estimator of the step's objective family."""
    from rookworld_debug.grpo.families import family_of
    return family_of(config.loss_type).kl_knob


def _f(x, nd=4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _num(x, unit: str = "", signed: bool = False) -> str:
    """A loss-scale number a reader can trust: exact zero (either sign) as 0, tiny or huge values in
    scientific notation (never 'loss=-0.000000'), else 4 significant digits; `unit` appended."""
    if x is None:
        return "—"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if x == 0:
        text = "0"
    elif 1e-3 <= abs(x) < 1e5:
        text = f"{x:+.4g}" if signed else f"{x:.4g}"
    else:
        text = f"{x:+.3e}" if signed else f"{x:.3e}"
    return text + (f" {unit}" if unit else "")


def _engine_line(stats: dict) -> str:
    """The reward phase's Stockfish use in words (not the raw dict)."""
    if not stats or not stats.get("calls") and not stats.get("cache_hits"):
        return "engine: not used (reward_mode dataset / rlvr / rlvr_gt, or nothing to score)"
    calls, hits, misses = stats.get("calls", 0), stats.get("cache_hits", 0), stats.get("cache_misses", 0)
    sec = float(stats.get("seconds", 0.0) or 0.0)
    return (f"engine (Stockfish, this reward phase): {calls} searches, cache {hits} hits / {misses} misses, "
            f"{sec * 1e3:.1f} ms searching" + (f", {stats['restarts']} restarts" if stats.get("restarts") else ""))


def _clip(text: str, n: int = 72) -> str:
    text = text.replace("\n", "⏎")
    stripped = text.lstrip(" ")
    pad = len(text) - len(stripped)
    shown = (f"␣×{pad} " if pad > 2 else " " * pad) + stripped
    return shown if len(shown) <= n else shown[: n - 1] + "…"


def format_step_log(trace, findings=None) -> str:
    """The text log of one step: one block per phase, in the order the step ran them. `findings`: the step's
    diagnosis when the caller has it (`diagnosis.diagnose_step`, replay included), else the step checks run here."""
    out = _diagnosis(trace, findings)
    for phase in (_setup, _initial_performance, _generations, _rewards, _advantages, _loss, _update,
                  _post_update, _timing):
        out.extend(phase(trace))
    return "\n".join(out)


def _diagnosis(trace, findings=None) -> list:
    """The findings first: what is likely wrong, its evidence and the fix (diagnosis.diagnose_trace)."""
    from rookworld_debug.diagnosis import diagnose_trace
    from rookworld_debug.diagnosis.text import format_findings
    found = diagnose_trace(trace) if findings is None else findings
    return ["DIAGNOSIS (most likely first; every phase note included)",
            *("  " + line for line in format_findings(found, notes=True).splitlines())]


def _setup(trace) -> list:
    c, s = trace.config, trace.setup
    p = s.provenance
    n_params = p.get('num_parameters')
    out = ["=" * 78, "SETUP"]
    w = out.append
    w(f"  model: {p.get('model')} ({p.get('source')}, {f'{n_params:,}' if n_params else '?'} params, {p.get('dtype')})"
      + ("  [RANDOM INIT]" if p.get("is_random_init") else ""))
    if p.get("tokenizer_class"):
        w(f"  tokenizer: {p['tokenizer_class']} V={p.get('tokenizer_len')} sha256={str(p.get('tokenizer_sha256'))[:12]}"
          + (" (stock GPT-2 BPE)" if p.get("tokenizer_is_stock_gpt2") else "") + f" from {p.get('tokenizer_source')}")
    for note in p.get("notes") or ():
        w(f"  !! {note}")            # random init, stock-tokenizer fallback, hub cache: what was really loaded
    w(f"  dropout (config, zeroed): {p.get('dropout_original')}")
    if getattr(trace, "capture", None) is not None:
        cap = trace.capture
        w(f"  TRL capture: GRPOTrainer step {cap.global_step} (TRL {cap.trl_version}), weights sha256 "
          f"{str(p.get('weights_sha256'))[:12]}…, loss as TRL returned it {cap.trl_loss:.6g}")
    w(f"  batch: {s.batch.describe()}")
    w(f"  B={c.batch_size} G={c.num_generations} β={c.beta} lr={c.lr} loss_type={c.loss_type} "
      f"kl={getattr(c, _kl_knob(c))} "
      f"scale_rewards={c.scale_rewards} reward_mode={c.reward_mode}")
    inv = s.invariants
    if inv is None:
        from rookworld_debug.viz.summary import invariants_note
        w(f"  step-0 invariants: {invariants_note(trace)}")
    else:
        w(f"  step-0 invariants: {'OK' if inv.ok else 'FAILED'}  max|logπ−logπ_ref|={inv.max_abs_logp_diff:.3g} "
          f"max k3 KL={inv.max_k3_kl:.3g} max|ratio−1|={inv.max_ratio_dev:.3g} dropout_active={len(inv.dropout_active)} "
          f"({inv.n_tokens} dataset tokens)")
        for f in inv.failures:
            w(f"  !! {f}")
    return out


def _initial_performance(trace) -> list:
    out = ["INITIAL PERFORMANCE (greedy, this step's B prompts)"]
    if trace.before is None:
        out.append("  not recorded (a TRL capture has no greedy before/after evaluation)")
    else:
        out.append(f"  mean reward {_f(trace.before.mean_reward)} ± {_f(trace.before.ci95)} (95% CI, n={trace.before.n}), "
                   f"format valid {trace.before.format_valid:.0%} (greedy, this batch, before the update)")
    if trace.before_heldout:
        h = trace.before_heldout
        out.append(f"  held-out: mean reward {_f(h.mean_reward)} ± {_f(h.ci95)} (n={h.n})")
    return out


def _generations(trace) -> list:
    from rookworld_debug.viz.completions import completion_name      # one name everywhere: p0·g1
    r, g = trace.rollout, trace.config.num_generations
    out = ["GENERATIONS (sampled; Train_LP / Ref_LP = Σ_t log-prob of the sampled tokens, logits/T)"]
    w = out.append
    mask = r.completion_mask.bool()
    lp = (r.per_token_logps * mask).sum(1)
    ref = (r.ref_per_token_logps * mask).sum(1) if r.ref_per_token_logps is not None else None
    for i in range(len(r.completions)):
        if i % g == 0:
            w(f"  prompt p{i // g}: {r.prompts[i]}  (T={float(r.temperatures[i]):g}, unique={int(r.unique_per_group[i // g])}/{g})")
        w(f"    {completion_name(i, g)} Train_LP={float(lp[i]):8.2f} Ref_LP={_f(float(ref[i]) if ref is not None else None, 2):>8} "
          f"len={int(mask[i].sum()):3d}{' TRUNC' if bool(r.is_truncated[i]) else ''}  {_clip(r.completions[i])}")
    w(f"  recompute check: max|logp(sampling) − logp(forward)| = {r.max_abs_logp_diff:.2e}"
      + ("  !! FLAGGED" if r.logp_diff_flagged else ""))
    return out


def _rewards(trace) -> list:
    from rookworld_debug.viz.completions import completion_name
    r, rw, g = trace.rollout, trace.rewards, trace.config.num_generations
    out = ["REWARDS (sampled rollout; B=label:Y/n = the completion's B: best move equals the dataset label, "
           "B=SF#1:Y/n = it equals Stockfish's top move)"]
    for i in range(len(r.completions)):
        comps = " ".join(f"{k}={_f(v[i], 2)}" for k, v in rw.components.items() if not math.isnan(v[i]))
        extra = []
        if rw.matches_label[i] is not None:
            extra.append(f"B=label:{'Y' if rw.matches_label[i] else 'n'}")
        if rw.matches_sf1[i] is not None:
            extra.append(f"B=SF#1:{'Y' if rw.matches_sf1[i] else 'n'}")
        out.append(f"  {completion_name(i, g)} reward={_f(float(rw.rewards[i]), 3)} {comps} {' '.join(extra)}"
                   + (f"  flags={','.join(rw.flags[i])}" if rw.flags[i] else ""))
    out.append("  " + _engine_line(rw.engine_stats))
    return out


def _advantages(trace) -> list:
    a, g = trace.advantages, trace.config.num_generations
    out = [f"ADVANTAGES ({a.normalization})"]
    for b in range(a.group_mean.numel()):
        vals = " ".join(f"{float(x):+.3f}" for x in a.advantages[b * g:(b + 1) * g])
        out.append(f"  group p{b}: mean={float(a.group_mean[b]):.3f} std={float(a.group_std[b]):.3f}  A=[{vals}]"
                   + ("  ZERO-STD" if b in a.zero_std_groups else ""))
    out.append(f"  frac_reward_zero_std={a.frac_reward_zero_std:.2f}")
    return out


def _loss(trace) -> list:
    from rookworld_debug.metrics import term_balance
    lo = trace.loss
    clip = ("" if "clip_ratio/region_mean" not in lo.metrics else
            f"  clip_ratio/region_mean={_f(lo.metrics.get('clip_ratio/region_mean'))}")
    return [f"LOSS (sampled rollout, loss_type={lo.loss_type}; {lo.normalizer.description})",
            f"  PG: {(lo.definition or '').split('; L = ')[0]}",          # the formula of THIS loss type
            f"  loss = {_num(lo.loss)} = PG {_num(lo.pg_loss, signed=True)} + β·KL {_num(lo.kl_loss, signed=True)} "
            f"+ entropy term {_num(lo.entropy_term, signed=True)}",
            f"  raw KL (token mean, {lo.kl_estimator}) = {_num(lo.kl, 'nats/token')}{clip}",
            f"  balance: {term_balance(lo, trace.update).headline}"]


def _update(trace) -> list:
    u = trace.update
    if u is None:
        return ["UPDATE", "  REFUSED (see warnings)"]
    out = ["UPDATE",
           f"  grad norm pre-clip={u.grad_norm_pre_clip:.4g} post-clip={u.grad_norm_post_clip:.4g} "
           f"(max_grad_norm={trace.config.max_grad_norm}); per term: " +
           " ".join(f"{k}={v:.3g}" for k, v in u.per_term_global.items()),
           f"  lr={u.lr:g} micro_batches={u.micro_batches} ||Δθ||={u.param_delta_norm:.3g} "
           f"loss(grad path) − loss(record) = {u.loss_record_diff:.2e}"]
    its = getattr(trace, "iterations", ()) or ()
    if len(its) > 1 or (its and len(its[0].updates) > 1):          # inner PPO passes (μ, steps_per_generation)
        out.append(f"  {len(its)} inner passes over the rollout (old log-probs frozen at sampling); the lines above "
                   "are the LAST optimizer step")
        for it in its:
            ml = it.loss.completion_mask > 0
            r = it.loss.per_token_ratio[ml]
            out.append(f"    pass {it.index + 1}: loss={_num(it.loss.loss)} kl={_num(it.loss.kl)} ratio "
                       f"[{float(r.min()) if r.numel() else float('nan'):.4g}, {float(r.max()) if r.numel() else float('nan'):.4g}] "
                       f"clip_ratio/region_mean={_f(it.loss.metrics.get('clip_ratio/region_mean', float('nan')))} "
                       f"grad_norm={it.grad_norm_pre_clip:.4g}")
    return out


def _post_update(trace) -> list:
    e, rw = trace.evaluation, trace.rewards
    out = ["POST-UPDATE PERFORMANCE (greedy, SAME prompts as before)"]
    if e is None:
        return out
    w = out.append
    w(f"  mean reward {_f(e.batch_before.mean_reward)} → {_f(e.batch_after.mean_reward)} "
      f"(Δ={_f(e.delta_reward_batch)}, n={e.batch_after.n})")
    if e.heldout_after:
        w(f"  held-out {_f(e.heldout_before.mean_reward)} → {_f(e.heldout_after.mean_reward)} "
          f"(Δ={_f(e.delta_reward_heldout)}, n={e.heldout_after.n})")
    w("ANALYSIS")
    w(f"  corr(advantage, mean Δlogp per sequence) = {_f(e.corr_adv_delta_logp, 3)}; "
      f"rows moved with their advantage: {_f(e.frac_moved_with_advantage, 2)}")
    w(f"  same-seed resample: {sum(e.resample_changed)}/{len(e.resample_changed)} completions changed, "
      f"mean reward {_f(float(rw.rewards.nanmean()), 3)} → {_f(float(e.resample_rewards.nanmean()), 3)}")
    rp = getattr(e, "replay", None)
    if rp:
        w(f"  after-update rows decoded: {rp['decoded_sampled_rows']} sampled + {rp['decoded_greedy_rows']} greedy "
          f"of {rp['replayed_rows']}; the rest replayed token for token (the update left them unchanged)")
    return out


def _timing(trace) -> list:
    out = ["TIMING " + " ".join(f"{k}={v:.2f}s" for k, v in trace.timings.items())
           + f" total={sum(trace.timings.values()):.2f}s"]
    if trace.flags:
        out.append("WARNINGS (the phases' raw notes; DIAGNOSIS above reads them as findings)")
        out.extend(f"  !! {f}" for f in trace.flags)
    return out
