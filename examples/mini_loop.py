"""A complete GRPO trainer in the style of rookworld-rlvr's pure-PyTorch "mini", written without the debugger's
step code, that records one step for rookworld-debug. The lines marked `# record` are all it takes.

    python examples/mini_loop.py --out runs/mini/step-2            # trains 2 steps, records the second
    rookworld-debug diagnose runs/mini/step-2                      # replays it phase by phase

The loop: its own sampling loop (KV cache, one token per forward, top-k 0, fixed length with EOS padding), the
RookWorld reward against the dataset label, group advantages A = (r − mean_g) / (std_g + 1e-4), the PPO-clip
token loss with a k3 KL penalty summed over tokens and divided by the batch's token count (TRL's "dapo"), one AdamW
step with grad clip 1.0.
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


@torch.no_grad()
def generate(model, prompt_ids, prompt_mask, max_new: int, temperature: float, eos: int, gen: torch.Generator):
    """Sample max_new tokens per row; rows that hit EOS keep emitting EOS. Returns ids, mask, sampler log-probs."""
    attn = prompt_mask.clone()
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True)
    cache, logits, last = out.past_key_values, out.logits[:, -1], pos[:, -1]
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool)
    ids, logps = [], []
    for _ in range(max_new):
        logp = (logits.float() / temperature).log_softmax(-1)
        tok = torch.where(done, eos, torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1))
        ids.append(tok)
        logps.append(logp.gather(1, tok[:, None]).squeeze(1))
        done |= tok == eos
        attn, last = torch.cat([attn, torch.ones_like(attn[:, :1])], 1), last + 1
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=last[:, None], past_key_values=cache,
                    use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    ids = torch.stack(ids, 1)
    ended = ids == eos
    first = torch.where(ended.any(1), ended.int().argmax(1), max_new)
    mask = (torch.arange(max_new)[None] <= first[:, None]).long()
    return ids, mask, torch.stack(logps, 1) * mask


def logprobs(model, prompt_ids, prompt_mask, ids, mask, temperature: float):
    attn = torch.cat([prompt_mask, mask], 1)
    logits = model(input_ids=torch.cat([prompt_ids, ids], 1), attention_mask=attn,
                   position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits[:, prompt_ids.shape[1] - 1:-1]
    return (logits.float() / temperature).log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1) * mask


def train(steps: int, record_step: int, out: str, b: int = 2, g: int = 4, beta: float = 0.04, eps: float = 0.2,
          temperature: float = 0.8, lr: float = 5e-5, max_new: int = 160, seed: int = 0):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL).eval()
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    p_reward, _ = rookworld_reward_funcs("dataset")
    data = [json.loads(x) for x in BUNDLED_DATA.read_text().splitlines()]
    data = [r for r in data if r["task"] == "P" and r["split"] == "train"]
    for step in range(1, steps + 1):
        batch = random.Random(seed + step).sample(data, b)
        prompts, labels = [x["prompt"] for x in batch], [x["completion"] for x in batch]
        rec = StepRecorder(tok, trainer="mini loop example", step=step, loss_type="dapo", num_generations=g,
                           beta=beta, epsilon=eps, temperature=temperature, reward_mode="dataset",
                           max_grad_norm=1.0) if step == record_step else None                   # record
        enc = tok(prompts, return_tensors="pt", padding=True)
        prompt_ids, prompt_mask = enc.input_ids.repeat_interleave(g, 0), enc.attention_mask.repeat_interleave(g, 0)
        if rec:
            rec.batch(prompts, labels=labels)                                                   # record
            rec.model_before(model, opt, reference=ref)                                         # record
        ids, mask, sampling_logps = generate(model, prompt_ids, prompt_mask, max_new, temperature, tok.eos_token_id,
                                             gen)
        texts = tok.batch_decode(ids * mask + tok.eos_token_id * (1 - mask), skip_special_tokens=True)
        rewards = torch.tensor(p_reward(prompts=[p for p in prompts for _ in range(g)], completions=texts,
                                        label=[x for x in labels for _ in range(g)]))
        grouped = rewards.view(b, g)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)
        with torch.no_grad():
            ref_logps = logprobs(ref, prompt_ids, prompt_mask, ids, mask, temperature)
        logps = logprobs(model, prompt_ids, prompt_mask, ids, mask, temperature)
        ratio = torch.exp(logps - logps.detach())                      # one pass over the rollout: π_old = π
        pg = -torch.min(ratio * adv[:, None], ratio.clamp(1 - eps, 1 + eps) * adv[:, None])
        d = ref_logps - logps
        per_token = pg + beta * (torch.exp(d) - d - 1) * ratio
        loss = (per_token * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        if rec:
            rec.rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                        completions=texts, sampling_logps=sampling_logps)                         # record
            rec.rewards(rewards, per_func={"rookworld": rewards})                                # record
            rec.advantages(adv)                                                                  # record
            rec.logprobs(logps, ref=ref_logps, training=model.training)                          # record
            rec.loss(loss, per_token_loss=per_token.detach() * mask)                             # record
            rec.gradient(model)                                                                  # record
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if rec:
            rec.model_after(model)                                                               # record
            print(f"recorded step {step}: {rec.save(out)}")                                      # record
        print(f"step {step}: loss {float(loss):+.4f}  reward {float(rewards.mean()):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/mini/step-2", help="folder of the recorded step")
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
