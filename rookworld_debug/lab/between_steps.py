"""Faults that live BETWEEN steps, written into the hand-written GRPO loop (`lab.handloop`): each step is right on
its own, and what the run carries from one step to the next is lost or changed. The loop records two consecutive
optimizer steps (k, k+1) through StepRecorder; the consecutive-step replay (`diagnosis.replay.consecutive`) is to
name the cause.

The loop is handloop's (its sampling loop, reward, advantages, loss, micro-batches, AdamW with clipping, its
recorder) with one change of batch: half of its prompts are P prompts, new each rollout (the policy term's signal),
half A prompts, the same each rollout (the embedded model's arbiter answers repeat, so the same (prompt, completion,
label) is scored in both steps and a reward with memory shows).

    python -m rookworld_debug.lab.between_steps --out reports/between_steps   # the six faults and healthy pairs
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from rookworld_debug.lab import faults_eighth as E8
from rookworld_debug.lab import faults_fresh as F
from rookworld_debug.lab import faults_novel as N
from rookworld_debug.lab import faults_seventh as S7
from rookworld_debug.lab import faults_sixth as S
from rookworld_debug.lab.handloop import LoopConfig, _data, _Loop, _optimizer_step, _recorder, _setup, advantages, \
    sample, schedule, token_logps

# fault → (the carried quantity it breaks, the finding code that names it)
BETWEEN_FAULTS = {
    "sampler_stale": ("sampler", "sampler_weights_stale"),          # the sampler copy synced at the first rollout only
    "grads_carried": ("gradient", "gradient_not_zeroed"),           # no zero_grad between optimizer steps
    "optimizer_recreated": ("optimizer", "optimizer_state_reset"),  # a new AdamW before every optimizer step
    "policy_reset": ("weights", "policy_reset"),                    # the policy reloaded from its start each rollout
    "reference_moves": ("reference", "reference_tracks_policy"),    # ref ← ½·ref + ½·θ before each rollout
    "reward_memory": ("rewards", "reward_has_memory"),              # a bonus of 0.1 per earlier call
    "scheduler_extra_step": ("scheduler", "scheduler_stepped_extra"),   # scheduler.step() once more between steps
}
# written and frozen before the fits they need: bug classes reported against public trainers, recorded by run_pair
# (each acts from the first step on)
SEALED_BETWEEN_FAULTS = {
    "scheduler_per_micro_batch": ("scheduler", "scheduler_stepped_extra"),   # scheduler.step() in the micro-batch loop
    "scheduler_recreated": ("scheduler", "scheduler_reset"),           # a new LambdaLR each rollout: warm-up restarts
    "sampler_synced_from_ref": ("sampler", "sampler_weights_stale"),   # the sampler copy loaded from the reference
    "optimizer_step_count_reset": ("optimizer", "optimizer_state_reset"),   # Adam's step counts zeroed, moments kept
    "weights_bf16_roundtrip": ("weights", "weights_rounded"),          # the policy saved and reloaded in bf16
    "reward_running_mean": ("rewards", "reward_has_memory"),           # rewards minus the running mean of earlier calls
}
# the consecutive-step part of the fourth held-out set (`--only fresh`, with handloop.FRESH_FAULTS), written and
# frozen the same way; each acts between the two recorded steps
FRESH_BETWEEN_FAULTS = {
    "adam_betas_changed_at_resume": ("optimizer", "optimizer_settings_changed"),   # betas (0.9, 0.95) over the state
    "optimizer_state_blocks_reversed": ("optimizer", "optimizer_state_permuted"),  # block i gets block n−1−i's moments
    "scheduler_skipped_on_saved_step": ("scheduler", "scheduler_not_stepped"),    # the save path skips sched.step()
    "sampler_sync_skips_embeddings": ("sampler", "sampler_weights_partly_synced"),   # wte, wpe and the tied head stale
    "optimizer_stepped_again_after_step": ("weights", "update_applied_twice"),   # a second opt.step() on the same grads
}
# the consecutive-step part of the fifth held-out set (`--only novel`, with handloop.NOVEL_FAULTS), written and
# frozen the same way; the source of each is named beside it
NOVEL_BETWEEN_FAULTS = {
    # OpenRLHF pull request: the weights synced into a sampler engine that holds bfloat16 weights are cast to bf16
    "sampler_synced_in_bf16": ("sampler", "sampler_precision"),
    # NVIDIA-NeMo/Megatron-Bridge pull request: a resume from a checkpoint without optimizer state materialises a fresh
    # state with one dummy step (moments zero, step count 1)
    "optimizer_state_from_empty_checkpoint": ("optimizer", "optimizer_state_reset"),
    # vLLM issue (the engine's fixed default seed, which a trainer that re-creates or re-seeds its sampler
    # each rollout inherits): the sampler's generator seeded again with the same seed before every rollout
    "sampler_seed_repeated": ("sampler", "sampling_seed_repeated"),
}
# the consecutive-step part of the sixth held-out set (`--only sixth`, with handloop.SIXTH_FAULTS), written and
# frozen the same way; the source of each is named beside it
SIXTH_BETWEEN_FAULTS = {
    # vLLM feature request and NVIDIA-NeMo/RL and prime-rl pull requests: a prefix cache not reset by the weight
    # sync, so a prompt an earlier rollout sent is served the KV the previous weights computed
    "sampler_prefix_cache_stale": ("sampler", "sampler_prefix_cache_stale"),
    # ColossalAI issue (and torch-points3d pull request): a resume restores the scheduler but leaves the optimizer's
    # rate at the config's initial value, so the first step after it runs at that rate
    "lr_from_config_at_resume": ("optimizer", "lr_not_from_scheduler"),
    # OpenTau issue and torchtitan pull request: Adam's moments saved in bfloat16 and loaded back, rounded
    "adam_moments_bf16_at_resume": ("optimizer", "optimizer_state_rounded"),
    # TRL's create_reference_model (a pull request there points the reference's shared layers at the policy's
    # storage, meant frozen in both): the policy's optimizer still trains those layers, so the reference's blocks move
    # with every update
    "reference_shares_policy_blocks": ("reference", "reference_tracks_policy"),
}
# the consecutive-step part of the seventh held-out set (`--only seventh`, with handloop.SEVENTH_FAULTS), written and
# frozen the same way; the source of each is named beside it
SEVENTH_BETWEEN_FAULTS = {
    # huggingface/peft pull request (merging adapter weights was not idempotent: the delta added again at each
    # merge) and a radixark/miles pull request (base weights synced with the adapter merged while the adapter is
    # synced too, so the engine applies it twice): the sampler gets θ + (θ − θ_start)
    "sampler_adapter_merged_twice": ("sampler", "sampler_weights_extrapolated"),
    # NVIDIA-NeMo/RL pull request (a fused QKV written in one layout, read in another) and vLLM / SGLang fused-qkv
    # loader fixes: the sync converts each fused attention projection to the per-head interleaved layout while the
    # sampler reads [Q | K | V]
    "sampler_qkv_layout_scrambled": ("sampler", "sampler_weights_permuted"),
    # huggingface/accelerate issue (the dataloader yields another sequence after a resume) and an allenai/open-instruct
    # pull request (the skip-batches logic on resume): the rollout after a resume draws the batch of the step before
    "batch_repeated_at_resume": ("batch", "batch_repeated"),
    # huggingface/trl issue (the adaptive KL flag was not used: the controller always adapted), CarperAI/trlx pull
    # request and verl issue (the controller's update): β moved by an adaptive controller after each step while a
    # fixed β is configured and declared
    "kl_coef_adapted_while_fixed": ("loss", "kl_coefficient_changed"),
}
# the consecutive-step part of the eighth held-out set (`--only eighth`, with handloop.EIGHTH_FAULTS), written and
# frozen the same way; the source of each is named beside it
EIGHTH_BETWEEN_FAULTS = {
    # NVIDIA-NeMo/RL pull requests (async GRPO's resume re-trains prompts already trained; buffered rollouts restored
    # with the replay buffer) and a huggingface/trl pull request (the buffered generation batch when resuming the GRPO
    # trainer): after the resume the buffered rollout of the step before (its completions, rewards, advantages and
    # log-probs, sampled by the earlier weights) is trained again in place of a new one
    "rollout_replayed_at_resume": ("batch", "rollout_reused"),
    # vllm-project/vllm issue (LoRA adapter responses not matching PEFT's: rsLoRA not supported) and pull request,
    # sgl-project/sglang issue (use_rslora ignored: the update √r times too weak) and NVIDIA/TensorRT-LLM pull request
    # (rsLoRA scaling): the sampler serves θ_start + (θ − θ_start)/√r, r = 16
    "sampler_rslora_scale_ignored": ("sampler", "sampler_update_scaled"),
    # deepinsight/insightface pull request (the scheduler's max steps not updated on resume), a PrimeIntellect-ai/
    # prime-rl pull request review (the rebuilt schedule sized from another step count: warm-up or decay on the wrong
    # horizon) and a vllm-project/speculators pull request (the schedule's total steps): at the resume the linear decay
    # is rebuilt over twice the horizon and fast-forwarded to the restored step
    "scheduler_horizon_changed_at_resume": ("scheduler", "scheduler_horizon_changed"),
    # vllm-project/vllm issues (sleep level 2 discards the weights: gibberish after wake_up without a reload), a
    # huggingface/trl pull request (reload the weights in the wake-up) and a verl pull request (with LoRA only the
    # adapter was loaded after a level-2 sleep): the sampler's parameters discarded and re-allocated as zeros, only the
    # update since the start (the adapter) synced into them
    "sampler_base_weights_discarded": ("sampler", "sampler_base_weights_discarded"),
}
ALL_BETWEEN_FAULTS = {**BETWEEN_FAULTS, **SEALED_BETWEEN_FAULTS, **FRESH_BETWEEN_FAULTS, **NOVEL_BETWEEN_FAULTS,
                      **SIXTH_BETWEEN_FAULTS, **SEVENTH_BETWEEN_FAULTS, **EIGHTH_BETWEEN_FAULTS}
# the loop the faults are written into (a sampler copy, so that a stale one can show); and healthy loops of other
# shapes: dapo with two optimizer passes per rollout and a schedule (the pair spans a rollout's last pass and the
# next rollout's first), bnpo over one micro-batch
BASE = LoopConfig(num_prompts=2, num_generations=4, max_new_tokens=64, steps=2, separate_sampler=True, scheduler=True)
HEALTHY_SHAPES = {
    "grpo, sampler copy": BASE,
    "dapo, μ = 2, schedule, no sampler copy": replace(BASE, loss_type="dapo", num_iterations=2, scheduler=True,
                                                      separate_sampler=False),
    "bnpo, 1 micro-batch, β = 0": replace(BASE, loss_type="bnpo", micro_batches=1, beta=0.0, separate_sampler=False),
}
MEMORY_BONUS = 0.1


class _Reward:
    """The RookWorld reward against the label; with `memory`, plus MEMORY_BONUS per earlier call (the fault)."""

    def __init__(self, memory: bool = False, running: bool = False):
        from rookworld_debug.trl.rewards import rookworld_reward_funcs
        self.funcs, self.memory, self.calls = rookworld_reward_funcs("dataset"), memory, 0
        self.running, self.seen = running, []           # `running`: minus the mean of the earlier calls' rewards

    def __call__(self, prompts, texts, labels) -> torch.Tensor:
        cols = [f(prompts=prompts, completions=texts, label=labels) for f in self.funcs]
        r = torch.tensor([sum(v for v in vals if v is not None) for vals in zip(*cols)], dtype=torch.float32)
        bonus = MEMORY_BONUS * self.calls if self.memory else 0.0
        self.calls += 1
        shift = torch.cat(self.seen).mean() if self.running and self.seen else 0.0
        self.seen.append(r)
        return r + bonus - shift


def _batch(c: LoopConfig, step: int) -> list[dict]:
    """P prompts new each rollout, then A prompts the same each rollout."""
    n_a = c.num_prompts // 2
    return _data("P", c.num_prompts - n_a, c.seed + step) + (_data("A", n_a, c.seed) if n_a else [])


def _rollout(L: _Loop, c: LoopConfig, step: int, fault: str, reward: _Reward, start: Optional[dict] = None) -> dict:
    """G completions per prompt from the sampler (the policy, or its copy: synced first unless the fault), scored;
    the rows as handloop's rollout gives them to its recorder and optimizer step (`start`: the policy's weights at
    the run's start)."""
    g = c.num_generations
    stale = copy.deepcopy(L.sampler) if fault == "sampler_prefix_cache_stale" and step > 1 else None
    if L.sampler is not None and not (fault == "sampler_stale" and step > 1):
        src = L.ref if fault == "sampler_synced_from_ref" and step > 1 else L.model
        partial = fault == "sampler_sync_skips_embeddings" and step > 1
        state = F.state_without_embeddings(src.state_dict()) if partial else src.state_dict()
        state = N.rounded_to_bf16(state) if fault == "sampler_synced_in_bf16" else state
        state = S7.delta_applied_twice(state, start) if fault == "sampler_adapter_merged_twice" else state
        state = S7.qkv_interleaved(state, L.model.config.n_head) if fault == "sampler_qkv_layout_scrambled" else state
        state = E8.delta_scaled(state, start) if fault == "sampler_rslora_scale_ignored" and step > 1 else state
        if fault == "sampler_base_weights_discarded" and step > 1:
            state = E8.base_discarded(state, start, {n for n, _ in L.model.named_parameters(remove_duplicate=False)})
        L.sampler.load_state_dict(state, strict=not partial)
    sampler = L.sampler if L.sampler is not None else L.model
    batch = _batch(c, step - 1 if fault == "batch_repeated_at_resume" and step > 1 else step)
    prompts, labels = [x["prompt"] for x in batch], [x["completion"] for x in batch]
    enc = L.tok(prompts, return_tensors="pt", padding=True)
    p_ids, p_mask = enc.input_ids.repeat_interleave(g, 0), enc.attention_mask.repeat_interleave(g, 0)
    rows_p, rows_l = [p for p in prompts for _ in range(g)], [x for x in labels for _ in range(g)]
    eos = L.tok.eos_token_id
    prefix = None if stale is None else (stale, S.rows_seen(rows_p, [x["prompt"] for x in _batch(c, step - 1)]))
    with torch.no_grad():
        ids, mask, s_logps = sample(sampler, p_ids, p_mask, c.max_new_tokens, c.temperature, eos, L.gen,
                                    prefix=prefix)
        texts = L.tok.batch_decode(ids * mask + eos * (1 - mask), skip_special_tokens=True)
        r = reward(rows_p, texts, rows_l)
        ref_logps = token_logps(L.ref, p_ids, p_mask, ids, mask, c.temperature)
        old = token_logps(sampler, p_ids, p_mask, ids, mask, c.temperature) if c.num_iterations > 1 else None
    snapshot = copy.deepcopy(sampler) if c.num_iterations > 1 or L.sampler is not None else None
    return dict(p_ids=p_ids, p_mask=p_mask, rows_p=rows_p, rows_l=rows_l, ids=ids, mask=mask, s_logps=s_logps,
                texts=texts, r=r, adv=advantages(r, g), ref_logps=ref_logps, old=old, sampled_by=snapshot)


def _before_rollout(L: _Loop, c: LoopConfig, step: int, fault: str, start: dict) -> None:
    """What the faults change before a rollout after the first: the policy reloaded, the reference moved (one
    fault acts before the first: a reference built sharing the policy's first blocks)."""
    if step == 1 and fault == "reference_shares_policy_blocks":
        S.share_first_blocks(L.ref, L.model)
    if step == 1:
        return
    if fault == "policy_reset":
        L.model.load_state_dict(start)
    if fault == "scheduler_extra_step":
        L.sched.step()
    if fault == "scheduler_recreated":
        L.sched = schedule(L.opt, c)
    if fault == "weights_bf16_roundtrip":
        with torch.no_grad():
            for p in L.model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    if fault == "reference_moves":
        with torch.no_grad():
            for r, p in zip(L.ref.parameters(), L.model.parameters()):
                r.mul_(0.5).add_(p.detach(), alpha=0.5)
    if fault == "adam_betas_changed_at_resume":
        F.betas_reset(L.opt)
    if fault == "optimizer_state_blocks_reversed":
        F.block_states_reversed(L.model, L.opt)
    if fault == "optimizer_state_from_empty_checkpoint":
        N.optimizer_state_scaffold(L.opt)
    if fault == "sampler_seed_repeated":
        N.reseed(L.gen, c.seed)
    if fault == "lr_from_config_at_resume":
        S.lr_from_config(L.opt)
    if fault == "adam_moments_bf16_at_resume":
        S.moments_rounded_to_bf16(L.opt)
    if fault == "scheduler_horizon_changed_at_resume" and L.sched is not None:
        L.sched = E8.schedule_with_horizon(L.opt, E8.HORIZON_FACTOR * (c.steps * c.num_iterations + 1),
                                           L.sched.last_epoch)


def _rollout_and_passes(L: _Loop, c: LoopConfig, step: int, fault: str, reward: _Reward, start: dict,
                        record: tuple, out: Path) -> list:
    """Rollout `step` and its μ optimizer passes; the passes whose optimizer step number is in `record` are saved
    to out/step-<n>. Returns the saved folders."""
    _before_rollout(L, c, step, fault, start)
    replayed = fault == "rollout_replayed_at_resume" and step > 1
    ro = L.buffered if replayed else _rollout(L, c, step, fault, reward, start)   # the restored buffer's rollout
    if fault == "rollout_replayed_at_resume":
        L.buffered = ro
    saved = []
    run_c = c                                   # the loop's settings; the fault moves β, the declared one stays
    if fault == "kl_coef_adapted_while_fixed":
        run_c = replace(c, beta=getattr(L, "adapted_beta", c.beta))
    for k in range(c.num_iterations):
        n = (step - 1) * c.num_iterations + k + 1
        if n > 1 and fault == "optimizer_recreated":
            L.opt = torch.optim.AdamW(L.model.parameters(), lr=L.opt.param_groups[0]["lr"])
            L.sched = None                      # the schedule belonged to the optimizer it replaced
        if n > 1 and fault == "optimizer_step_count_reset":
            for st in L.opt.state.values():
                st["step"].zero_()
        rec = _recorder(L, c, n, k, ro) if n in record else None
        sched = L.sched                          # a step the loop saves returns before scheduler.step() (the fault)
        L.sched = None if fault == "scheduler_skipped_on_saved_step" and rec is not None else sched
        _optimizer_step(L, run_c, ro, "no_zero_grad" if fault == "grads_carried" and n > 1 else "", rec, last=True)
        L.sched = sched
        if fault == "optimizer_stepped_again_after_step":    # a callback steps the optimizer once more
            L.opt.step()
        if fault == "scheduler_per_micro_batch" and L.sched is not None:
            for _ in range(c.micro_batches - 1):     # the loop's one step, plus one per further micro-batch
                L.sched.step()
        if rec is not None:
            saved.append(rec.save(out / f"step-{n}"))
    if fault == "kl_coef_adapted_while_fixed":      # the controller's update after the rollout's steps
        L.adapted_beta = S7.adapted_beta(run_c.beta, S7.rollout_kl(ro["ref_logps"], ro["s_logps"], ro["mask"]),
                                         ro["ids"].shape[0])
    return saved


def _pair_steps(c: LoopConfig) -> tuple:
    """The optimizer steps recorded: the last pass of the second-to-last rollout and the first of the last one."""
    k = (c.steps - 1) * c.num_iterations
    return k, k + 1


def _start(c: LoopConfig):
    L = _setup(c)
    return L, {k: v.detach().clone() for k, v in L.model.state_dict().items()}


def run_pair(c: LoopConfig, out, fault: str = "") -> tuple:
    """Train `c.steps` rollouts (≥ 2) with `fault` written into the loop; record two consecutive optimizer steps
    (`_pair_steps`) into out/step-<k> and out/step-<k+1>. Returns the two folders."""
    if fault and fault not in ALL_BETWEEN_FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {sorted(ALL_BETWEEN_FAULTS)}")
    if c.steps < 2:
        raise ValueError("two consecutive steps need steps ≥ 2")
    L, start = _start(c)
    reward, saved = _Reward(memory=fault == "reward_memory", running=fault == "reward_running_mean"), []
    for step in range(1, c.steps + 1):
        saved += _rollout_and_passes(L, c, step, fault, reward, start, _pair_steps(c), Path(out))
    return tuple(saved)


def _fork(L: _Loop) -> _Loop:
    """A copy of the loop's live objects (one memo: the optimizer's parameters stay the copied model's), with the
    gradients the model still holds."""
    memo: dict = {}
    new = _Loop(L.tok, *(copy.deepcopy(x, memo) for x in (L.model, L.ref, L.sampler, L.opt, L.sched, L.gen)))
    for p, q in zip(L.model.parameters(), new.model.parameters()):
        q.grad = None if p.grad is None else p.grad.detach().clone()
    return new


def sweep(out, faults=("",) + tuple(BETWEEN_FAULTS), c: LoopConfig = BASE) -> dict:
    """{fault: (folder of step 1, folder of step 2)} for each fault ("" = healthy), each in out/<fault or healthy>.
    Every fault here acts between steps, so step 1 is the same in each run: it runs once and the loop is forked
    after it (its folder hard-linked into each run's)."""
    if c.num_iterations != 1 or c.steps != 2:
        raise ValueError("sweep forks after the first optimizer step: num_iterations = 1 and steps = 2")
    out = Path(out)
    L, start = _start(c)
    reward = _Reward()
    first = _rollout_and_passes(L, c, 1, "", reward, start, (1,), out / "_first")[0]
    runs = {}
    for fault in faults:
        here = out / (fault or "healthy")
        shutil.rmtree(here, ignore_errors=True)
        link_tree(first, here / first.name)
        fork, r = _fork(L), copy.deepcopy(reward)
        r.memory = fault == "reward_memory"
        second = _rollout_and_passes(fork, c, 2, fault, r, start, (2,), here)[0]
        runs[fault] = (here / first.name, second)
    return runs


def link_tree(src: Path, dst: Path) -> None:
    """A copy of a recorded step's folder, hard-linked where the file system allows (a step is ~100 MB)."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link)


def _pair_result(name: str, folders: tuple, fault: str = "") -> dict:
    from rookworld_debug.diagnosis.replay.consecutive import replay_consecutive
    from rookworld_debug.diagnosis.replay.consecutive_findings import consecutive_findings
    cpu = time.process_time()
    pair = replay_consecutive(*folders)
    cpu = time.process_time() - cpu               # beside the wall time: this machine's cores are shared
    errors = [f.code for f in consecutive_findings(pair) if f.severity == "error"]
    want = ALL_BETWEEN_FAULTS[fault][1] if fault else ""
    return {"case": name, "fault": fault, "steps": list(pair.steps), "errors": errors,
            "found": bool(fault) and errors[:1] == [want], "seconds": round(pair.seconds, 3),
            "cpu_seconds": round(cpu, 3), "checks": _by_phase(pair.checks)}


def _by_phase(checks) -> dict:
    """{phase: status}, a phase's disagreement kept over a later check of the same phase that agrees."""
    out: dict = {}
    for c in checks:
        if out.get(c.phase) != "disagree":
            out[c.phase] = c.status
    return out


def measure(out) -> list[dict]:
    """The six faults and the healthy shapes, each pair replayed: one row per case."""
    torch.set_num_threads(1)                     # CPU seconds that count work, not threads waiting on each other
    out = Path(out)
    rows = [_pair_result(f or "healthy: " + next(iter(HEALTHY_SHAPES)), folders, f)
            for f, folders in sweep(out / "faults").items()]
    for name, c in list(HEALTHY_SHAPES.items())[1:]:
        rows.append(_pair_result("healthy: " + name, run_pair(c, out / f"healthy-{len(rows)}")))
    return rows


def table(rows: list[dict]) -> str:
    faults = [r for r in rows if r["fault"]]
    healthy = [r for r in rows if not r["fault"]]
    secs, cpu = sorted(r["seconds"] for r in rows), sorted(r["cpu_seconds"] for r in rows)
    lines = [f"faults found with their cause first: {sum(r['found'] for r in faults)}/{len(faults)}; healthy pairs "
             f"with an error: {sum(bool(r['errors']) for r in healthy)}/{len(healthy)}; per pair: wall median "
             f"{secs[len(secs) // 2]:.2f} s (max {secs[-1]:.2f}), CPU median {cpu[len(cpu) // 2]:.2f} s (max "
             f"{cpu[-1]:.2f})", "",
             "| case | steps | errors (first = the cause named) | found | wall s | CPU s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['steps']} | {', '.join(r['errors']) or '—'} | "
              f"{'✓' if r['found'] else '✗' if r['fault'] else '—'} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rookworld_debug.lab.between_steps", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the recorded steps, results.jsonl and table.md")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = measure(a.out)
    Path(a.out, "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = table(rows) + f"\n\nwall time {time.perf_counter() - t0:.0f} s\n"
    Path(a.out, "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
