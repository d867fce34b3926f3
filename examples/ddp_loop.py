"""A GRPO trainer under torch.distributed (DDP, launched by torchrun), written without the debugger's step code, that
records one step for rookworld-debug: every rank makes the same `# record` calls with its own rows, and rank 0
writes the global step.

    torchrun --nproc_per_node 2 examples/ddp_loop.py --out runs/ddp/step-2    # 2 ranks, gloo on the CPU
    rookworld-debug diagnose runs/ddp/step-2                                   # replays the global step

The loop: each step draws B prompts per rank (one shared draw, rank r takes its slice, as DistributedSampler does);
each rank samples G completions per prompt with its own seed (whole groups stay on their rank), scores them with
the RookWorld reward against the dataset label, computes TRL's group advantages A = (r − mean_g) / (std_g + 1e-4)
on its own rows, and the PPO-clip loss with the k3 KL (× the importance ratio) through the DDP-wrapped policy, whose
backward averages the gradients over the ranks; AdamW with grad clip 1.0. The loss is aggregated as TRL's
`--loss-type`: grpo (mean of sequence means), bnpo (the rank's token mean) or dapo (Σ over the rank's tokens ÷
(the global batch's token count ÷ ranks), the count summed over ranks by an all_reduce).

`--fault adv_sign --fault-rank R` breaks rank R only: its advantages are negated (and recorded as used); the
replay places it in the advantages and names rank R's rows. `--fault local_token_count` (with dapo) breaks every
rank alike: each divides by its own token count, not the global batch's (a rank-local "dapo").
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM, AutoTokenizer

from rookworld_debug.record import BUNDLED_DATA, EMBEDDED_MODEL, StepRecorder            # record
from rookworld_debug.trl.rewards import rookworld_reward_funcs   # the RookWorld reward (scored against the label)

LOSS_TYPES = ("grpo", "bnpo", "dapo")
FAULTS = ("adv_sign", "local_token_count")


def shard(step: int, rank: int, world: int, b: int, seed: int) -> list[dict]:
    """This rank's B prompts of the step's B·world (one draw, shared by the ranks)."""
    rows = [json.loads(line) for line in BUNDLED_DATA.read_text().splitlines()]
    rows = [r for r in rows if r["task"] == "P" and r["split"] == "train"]
    return random.Random(seed + step).sample(rows, b * world)[rank * b:(rank + 1) * b]


def sample(model, tok, prompts, g: int, temperature: float, max_new: int, seed: int):
    enc = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new,
                         num_return_sequences=g, output_scores=True, return_dict_in_generate=True,
                         pad_token_id=tok.pad_token_id)
    ids = out.sequences[:, enc.input_ids.shape[1]:]                              # (N_r, T_r)
    is_eos = ids == tok.eos_token_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.shape[1])     # (N_r,)
    mask = (torch.arange(ids.shape[1])[None] <= first[:, None]).long()           # through the first EOS
    scores = torch.stack(out.scores, 1).log_softmax(-1)                          # (N_r, T_r, V) tempered
    return (enc.input_ids.repeat_interleave(g, 0), enc.attention_mask.repeat_interleave(g, 0), ids, mask,
            scores.gather(-1, ids[..., None]).squeeze(-1) * mask)


def token_logps(model, prompt_ids, prompt_mask, ids, mask, temperature: float):
    full, attn = torch.cat([prompt_ids, ids], 1), torch.cat([prompt_mask, mask], 1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)                                      # left padding: count real tokens
    logits = model(input_ids=full, attention_mask=attn, position_ids=pos).logits[:, prompt_ids.shape[1] - 1:-1]
    return (logits.float() / temperature).log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1) * mask


def aggregate(per_token, mask, loss_type: str, local_count: bool):
    """TRL's aggregation of this rank's rows; DDP then averages the ranks' gradients."""
    m = mask.float()
    if loss_type == "grpo":
        return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return (per_token * m).sum() / m.sum().clamp(min=1)
    tokens = m.sum()                                                             # dapo: the global batch's count
    everyone = tokens.clone()
    dist.all_reduce(everyone)                 # every rank takes part: a collective one rank skips hangs the others
    return (per_token * m).sum() / (tokens if local_count else everyone / dist.get_world_size()).clamp(min=1)


def train(a, rank: int, world: int, g: int = 4, beta: float = 0.04, eps: float = 0.2, temperature: float = 1.0,
          lr: float = 1e-4, seed: int = 0):
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL).eval()          # eval: no dropout anywhere
    ref = copy.deepcopy(model).requires_grad_(False)
    ddp = DistributedDataParallel(model)                                         # gloo on the CPU
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr)
    p_reward, _ = rookworld_reward_funcs("dataset")
    broken = rank == a.fault_rank
    for step in range(1, a.steps + 1):
        batch = shard(step, rank, world, a.prompts_per_rank, seed)
        prompts, labels = [x["prompt"] for x in batch], [x["completion"] for x in batch]
        rec = StepRecorder(tok, trainer="DDP loop example", step=step, loss_type=a.loss_type, num_generations=g,
                           beta=beta, epsilon=eps, temperature=temperature, reward_mode="dataset",
                           max_grad_norm=1.0, seed=seed + rank) if step == a.record_step else None   # record
        if rec:
            rec.batch(prompts, labels=labels)                                                    # record
            rec.model_before(ddp, opt, reference=ref)                                            # record
        with torch.no_grad():
            prompt_ids, prompt_mask, ids, mask, sampling_logps = sample(model, tok, prompts, g, temperature, a.max_new,
                                                                        seed + 1000 * step + rank)
            texts = tok.batch_decode(ids * mask + tok.eos_token_id * (1 - mask), skip_special_tokens=True)
            rewards = torch.tensor(p_reward(prompts=[p for p in prompts for _ in range(g)], completions=texts,
                                            label=[x for x in labels for _ in range(g)]))
            grouped = rewards.view(-1, g)
            adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)
            if broken and a.fault == "adv_sign":
                adv = -adv
            ref_logps = token_logps(ref, prompt_ids, prompt_mask, ids, mask, temperature)
        logps = token_logps(ddp, prompt_ids, prompt_mask, ids, mask, temperature)  # through DDP: synced backward
        ratio = torch.exp(logps - logps.detach())                                 # one pass: π_old = π
        pg = -torch.min(ratio * adv[:, None], ratio.clamp(1 - eps, 1 + eps) * adv[:, None])
        d = ref_logps - logps
        per_token = pg + beta * (torch.exp(d) - d - 1) * ratio
        loss = aggregate(per_token, mask, a.loss_type, a.fault == "local_token_count")
        opt.zero_grad()
        loss.backward()                                                           # DDP: .grad = mean over ranks
        if rec:
            rec.rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                        completions=texts, sampling_logps=sampling_logps)                        # record
            rec.rewards(rewards, per_func={"rookworld": rewards})                                # record
            rec.advantages(adv)                                                                  # record
            rec.logprobs(logps, ref=ref_logps, training=model.training)                          # record
            rec.loss(loss, per_token_loss=per_token.detach() * mask)                             # record
            rec.gradient(ddp)                                                                    # record
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        if rec:
            rec.model_after(ddp)                                                                 # record
            saved = rec.save(a.out)                       # record: every rank calls it; rank 0 writes
            if rank == 0:
                print(f"recorded step {step}: {saved}")
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step}: loss {float(mean) / world:+.4f} (mean over {world} ranks)  "
                  f"reward {float(rewards.mean()):.3f} (rank 0)")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/ddp/step-2", help="folder of the recorded step (written by rank 0)")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps to train (1 … 100)")
    ap.add_argument("--record-step", type=int, default=None, help="which step to record (default: the last)")
    ap.add_argument("--loss-type", default="grpo", choices=LOSS_TYPES, help="the loss aggregation (TRL's)")
    ap.add_argument("--prompts-per-rank", type=int, default=2, help="B prompts per rank and step (1 … 8)")
    ap.add_argument("--max-new", type=int, default=192, help="completion tokens sampled at most (8 … 512)")
    ap.add_argument("--fault", default=None, choices=FAULTS, help="a bug written into one rank's loop")
    ap.add_argument("--fault-rank", type=int, default=1, help="the rank --fault adv_sign breaks (default 1)")
    a = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world < 1 or "RANK" not in os.environ:
        ap.error("run it under torchrun: torchrun --nproc_per_node 2 examples/ddp_loop.py ...")
    if not 1 <= a.steps <= 100:
        ap.error("--steps must be between 1 and 100")
    if a.record_step is not None and not 1 <= a.record_step <= a.steps:
        ap.error(f"--record-step must be between 1 and --steps ({a.steps})")
    if not 1 <= a.prompts_per_rank <= 8:
        ap.error("--prompts-per-rank must be between 1 and 8")
    if not 8 <= a.max_new <= 512:
        ap.error("--max-new must be between 8 and 512")
    if a.fault is not None and not 0 <= a.fault_rank < world:
        ap.error(f"--fault-rank must be a rank of this run: 0 … {world - 1}")
    if a.fault == "local_token_count" and a.loss_type != "dapo":
        ap.error("--fault local_token_count breaks dapo's global token count: use it with --loss-type dapo")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out {a.out} is a file; the recorded step is a folder")
    a.record_step = a.steps if a.record_step is None else a.record_step
    if a.fault is None:
        a.fault_rank = -1
    return a


if __name__ == "__main__":
    args = parse()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        train(args, dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()   # gloo's threads torn down at interpreter exit instead can abort a rank
