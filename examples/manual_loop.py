"""A complete GRPO trainer in the style of rookworld-trl's manual debug loop, written without the debugger's step
code, that records one step for rookworld-debug. The lines marked `# record` are all it takes.

    python examples/manual_loop.py --out runs/manual/step-2        # trains 2 steps, records the second
    rookworld-debug diagnose runs/manual/step-2                    # replays it phase by phase

The loop: for each prompt G sampled completions (HF generate, eval mode), the RookWorld reward against the dataset
label, advantages A = clip((r − mean_g) / max(std_g, 0.05), ±2), and the sequence-level REINFORCE loss
(1/N) Σ_i [−A_i · mean_t ℓ_it + β · mean_t KL_it], backward per completion, one AdamW step with grad clip 1.0.
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


def sample(model, tok, prompts, g: int, temperature: float, max_new: int, seed: int):
    enc = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new,
                         num_return_sequences=g, output_scores=True, return_dict_in_generate=True,
                         pad_token_id=tok.pad_token_id)
    p = enc.input_ids.shape[1]
    ids = out.sequences[:, p:]                                                   # (N, T)
    is_eos = ids == tok.eos_token_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.shape[1])     # (N,)
    mask = (torch.arange(ids.shape[1])[None] <= first[:, None]).long()           # through the first EOS
    scores = torch.stack(out.scores, 1).log_softmax(-1)                          # (N, T, V) tempered
    sampling_logps = scores.gather(-1, ids[..., None]).squeeze(-1) * mask
    return (enc.input_ids.repeat_interleave(g, 0), enc.attention_mask.repeat_interleave(g, 0), ids, mask,
            sampling_logps)


def token_logps(model, prompt_ids, prompt_mask, ids, mask, temperature: float):
    full = torch.cat([prompt_ids, ids], 1)
    attn = torch.cat([prompt_mask, mask], 1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)                                      # left padding: count real tokens
    logits = model(input_ids=full, attention_mask=attn, position_ids=pos).logits[:, prompt_ids.shape[1] - 1:-1]
    logp = (logits.float() / temperature).log_softmax(-1)
    return logp.gather(-1, ids[..., None]).squeeze(-1) * mask


def advantages_of(rewards, g: int, std_clamp=0.05, clip=2.0):
    r = rewards.view(-1, g)
    a = (r - r.mean(1, keepdim=True)) / r.std(1, keepdim=True).clamp(min=std_clamp)
    return a.clamp(-clip, clip).reshape(-1)


def train(steps: int, record_step: int, out: str, b: int = 2, g: int = 4, beta: float = 0.04,
          temperature: float = 1.0, lr: float = 1e-4, max_new: int = 160, seed: int = 0):
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL).eval()          # eval: no dropout anywhere
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    reward_funcs = rookworld_reward_funcs("dataset")
    for step in range(1, steps + 1):
        batch = load_batch(b, seed + step)
        prompts, labels = [x["prompt"] for x in batch], [x["completion"] for x in batch]
        rec = StepRecorder(tok, trainer="manual loop example", step=step, loss_type="manual", num_generations=g, beta=beta,
                           temperature=temperature, reward_mode="dataset", max_grad_norm=1.0, kl_estimator="k3",
                           manual_std_clamp=0.05, manual_adv_clip=2.0) if step == record_step else None  # record
        if rec:
            rec.batch(prompts, labels=labels)                                                            # record
            rec.model_before(model, opt, reference=ref)                                                  # record
        with torch.no_grad():
            prompt_ids, prompt_mask, ids, mask, sampling_logps = sample(model, tok, prompts, g, temperature, max_new,
                                                                        seed + 2000 + step)
            texts = tok.batch_decode(ids * mask + tok.eos_token_id * (1 - mask), skip_special_tokens=True)
            rows_p = [p for p in prompts for _ in range(g)]
            rows_l = [x for x in labels for _ in range(g)]
            per_func = [f(prompts=rows_p, completions=texts, label=rows_l) for f in reward_funcs]
            rewards = torch.tensor([sum(v for v in vals if v is not None) for vals in zip(*per_func)])
            adv = advantages_of(rewards, g)
            ref_logps = token_logps(ref, prompt_ids, prompt_mask, ids, mask, temperature)
        if rec:
            rec.rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                        completions=texts, sampling_logps=sampling_logps)                                # record
            rec.rewards(rewards, per_func={"rookworld": rewards})                                        # record
            rec.advantages(adv)                                                                          # record
        opt.zero_grad()
        n, total, logps_rows = ids.shape[0], 0.0, []
        for i in range(n):                                                        # backward per completion
            logps = token_logps(model, prompt_ids[i:i + 1], prompt_mask[i:i + 1], ids[i:i + 1], mask[i:i + 1],
                                temperature)
            m = mask[i:i + 1].float()
            d = ref_logps[i:i + 1] - logps
            kl = (d.exp() - d - 1) * m                                             # k3 estimator per token
            loss_i = (-adv[i] * (logps * m).sum() / m.sum() + beta * kl.sum() / m.sum()) / n
            loss_i.backward()
            total += float(loss_i.detach())
            logps_rows.append(logps.detach())
        if rec:
            rec.logprobs(torch.cat(logps_rows), ref=ref_logps, training=model.training)                  # record
            rec.loss(total)                                                                              # record
            rec.gradient(model)                                                                          # record
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if rec:
            rec.model_after(model)                                                                       # record
            print(f"recorded step {step}: {rec.save(out)}")                                              # record
        print(f"step {step}: loss {total:+.4f}  reward {float(rewards.mean()):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/manual/step-2", help="folder of the recorded step")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps to train (1 … 100)")
    ap.add_argument("--record-step", type=int, default=None, help="which step to record (default: the last)")
    a = ap.parse_args()
    if not 1 <= a.steps <= 100:
        ap.error("--steps must be between 1 and 100")
    if a.record_step is not None and not 1 <= a.record_step <= a.steps:
        ap.error(f"--record-step must be between 1 and --steps ({a.steps})")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out {a.out} is a file; the recorded step is a folder")
    train(a.steps, a.steps if a.record_step is None else a.record_step, a.out)
