"""A GRPO trainer in the PPO-epochs style, written without the debugger's step code, that records one optimizer
step for rookworld-debug. The lines marked `# record` are all it takes.

    python examples/ppo_epochs_loop.py --out runs/ppo/step-4        # 2 rollouts × 2 passes; records the 4th step
    rookworld-debug diagnose runs/ppo/step-4                        # replays it phase by phase

The loop: a separate sampler copy of the policy (synced before each rollout, as a vLLM-style trainer does) samples G
completions per prompt; the RookWorld reward against the dataset label; TRL's group advantages
A = (r − mean_g) / (std_g + 1e-4); π_old = the sampler's teacher-forced log-probs, fixed for the rollout. Then
μ = 2 optimizer passes over the rollout (TRL's num_iterations), each in 2 micro-batches, with the PPO-clip objective
and the plain k3 KL (no importance-ratio correction), aggregated per token over the micro-batch (TRL's bnpo), AdamW
with a linear learning-rate decay and grad clip 1.0. The recorded step is the rollout's second pass: the policy has
moved since sampling, so its ratio to π_old is not 1 and the replay checks π_old against the sampler's weights.
"""
from __future__ import annotations

import argparse
import os
import copy
import json
import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rookworld_debug.record import BUNDLED_DATA, EMBEDDED_MODEL, StepRecorder            # record
from rookworld_debug.trl.rewards import rookworld_reward_funcs   # the RookWorld reward (scored against the label)


def load_batch(n_prompts: int, seed: int) -> list[dict]:
    rows = [json.loads(line) for line in BUNDLED_DATA.read_text().splitlines()]
    rows = [r for r in rows if r["task"] == "P" and r["split"] == "train"]
    return random.Random(seed).sample(rows, n_prompts)


def token_logps(model, prompt_ids, prompt_mask, ids, mask, temperature: float):
    full, attn = torch.cat([prompt_ids, ids], 1), torch.cat([prompt_mask, mask], 1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)                                      # left padding: count real tokens
    logits = model(input_ids=full, attention_mask=attn, position_ids=pos).logits[:, prompt_ids.shape[1] - 1:-1]
    return (logits.float() / temperature).log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1) * mask


def sample(sampler, tok, prompts, g: int, temperature: float, max_new: int, seed: int):
    enc = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = sampler.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                           max_new_tokens=max_new, num_return_sequences=g, output_scores=True,
                           return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    ids = out.sequences[:, enc.input_ids.shape[1]:]                              # (N, T)
    is_eos = ids == tok.eos_token_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.shape[1])     # (N,)
    mask = (torch.arange(ids.shape[1])[None] <= first[:, None]).long()           # through the first EOS
    scores = torch.stack(out.scores, 1).log_softmax(-1)                          # (N, T, V) tempered
    return (enc.input_ids.repeat_interleave(g, 0), enc.attention_mask.repeat_interleave(g, 0), ids, mask,
            scores.gather(-1, ids[..., None]).squeeze(-1) * mask)


def micro_batch_loss(logps, old, ref, adv, mask, beta: float, eps: float, n_micro: int):
    """PPO-clip + β·k3 KL per token, Σ over the micro-batch's tokens ÷ its token count ÷ the micro-batches."""
    ratio = torch.exp(logps - old)
    a = adv[:, None]
    pg = -torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    d = ref - logps
    per_token = pg + beta * (d.exp() - d - 1)
    m = mask.float()
    return (per_token * m).sum() / m.sum().clamp(min=1) / n_micro


def train(rollouts: int, record_step: int, out: str, b: int = 2, g: int = 4, beta: float = 0.04, eps: float = 0.2,
          mu: int = 2, n_micro: int = 2, temperature: float = 1.0, lr: float = 1e-4, max_new: int = 160,
          seed: int = 0):
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL).eval()          # eval: no dropout anywhere
    ref = copy.deepcopy(model).requires_grad_(False)
    sampler = copy.deepcopy(model).requires_grad_(False)                         # the rollout engine's copy
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / (rollouts * mu + 1))
    reward_funcs = rookworld_reward_funcs("dataset")
    step = 0
    for rollout in range(1, rollouts + 1):
        sampler.load_state_dict(model.state_dict())                              # sync before sampling
        batch = load_batch(b, seed + rollout)
        prompts, labels = [x["prompt"] for x in batch], [x["completion"] for x in batch]
        with torch.no_grad():
            prompt_ids, prompt_mask, ids, mask, sampling_logps = sample(sampler, tok, prompts, g, temperature,
                                                                        max_new, seed + 2000 + rollout)
            texts = tok.batch_decode(ids * mask + tok.eos_token_id * (1 - mask), skip_special_tokens=True)
            rows_p = [p for p in prompts for _ in range(g)]
            rows_l = [x for x in labels for _ in range(g)]
            per_func = [f(prompts=rows_p, completions=texts, label=rows_l) for f in reward_funcs]
            rewards = torch.tensor([sum(v for v in vals if v is not None) for vals in zip(*per_func)])
            grouped = rewards.view(-1, g)
            adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)
            old_logps = token_logps(sampler, prompt_ids, prompt_mask, ids, mask, temperature)   # π_old, fixed
            ref_logps = token_logps(ref, prompt_ids, prompt_mask, ids, mask, temperature)
        for k in range(mu):
            step += 1
            rec = StepRecorder(tok, trainer="PPO-epochs loop example", step=step, loss_type="bnpo",   # record
                               num_generations=g, beta=beta, epsilon=eps, temperature=temperature,    # record
                               reward_mode="dataset", max_grad_norm=1.0, use_bias_correction_kl=False,  # record
                               gradient_accumulation_steps=n_micro, num_iterations=mu,             # record
                               iteration=k) if step == record_step else None                       # record
            if rec:
                rec.batch(prompts, labels=labels)                                                    # record
                rec.sampler(sampler)                                                                 # record
                rec.model_before(model, opt, reference=ref, scheduler=sched)                         # record
                rec.rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids,      # record
                            completion_mask=mask, completions=texts, sampling_logps=sampling_logps)  # record
                rec.rewards(rewards, per_func={"rookworld": rewards})                                # record
                rec.advantages(adv)                                                                  # record
            opt.zero_grad()
            total, logps_rows = 0.0, []
            for rows in torch.arange(ids.shape[0]).chunk(n_micro):
                logps = token_logps(model, prompt_ids[rows], prompt_mask[rows], ids[rows], mask[rows], temperature)
                loss = micro_batch_loss(logps, old_logps[rows], ref_logps[rows], adv[rows], mask[rows], beta, eps,
                                        n_micro)
                loss.backward()
                total += float(loss.detach())
                logps_rows.append(logps.detach())
            if rec:
                rec.logprobs(torch.cat(logps_rows), old=old_logps, ref=ref_logps, training=model.training)  # record
                rec.loss(total)                                                                      # record
                rec.gradient(model)                                                                  # record
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if rec:
                rec.model_after(model)                                                               # record
                print(f"recorded step {step}: {rec.save(out)}")                                      # record
            print(f"step {step} (rollout {rollout}, pass {k + 1}/{mu}): loss {total:+.4f}  "
                  f"reward {float(rewards.mean()):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/ppo/step-4", help="folder of the recorded step")
    ap.add_argument("--rollouts", type=int, default=2, help="rollouts to train, 2 optimizer passes each (1 … 50)")
    ap.add_argument("--record-step", type=int, default=None, help="which optimizer step to record (default: the last)")
    a = ap.parse_args()
    if not 1 <= a.rollouts <= 50:
        ap.error("--rollouts must be between 1 and 50")
    last = a.rollouts * 2
    if a.record_step is not None and not 1 <= a.record_step <= last:
        ap.error(f"--record-step must be between 1 and {last}")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out {a.out} is a file; the recorded step is a folder")
    train(a.rollouts, last if a.record_step is None else a.record_step, a.out)
