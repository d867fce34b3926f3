"""Launched by tests/test_record_ddp.py as a user launches a loop: `torchrun --nproc_per_node 2 this.py OUT`. No
model: StepRecorders of a few hand-made rows (the embedded tokenizer's ids), one collective each, in this order:

  groups    rank 1 records 3 rows with G = 2: save raises the DataError naming rank 1 on EVERY rank (nothing hangs)
  widths    whole groups, rank 1's prompts and completions wider than rank 0's: rank 0 writes OUT/step
  check     check() saves again and replays on rank 0: every rank gets its result
  rank0     rank 0's path is a file: rank 0 raises its DataError, rank 1 one that names it
  deadline  rank 1 never calls save: rank 0's save ends in RankTimeoutError after its 3 s deadline

Each rank writes OUT/rank<r>.json: {part: [error class, message, seconds] or the part's result}."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)
from tinymodels import embedded_tokenizer  # noqa: E402

from rookworld_debug.record import StepRecorder  # noqa: E402

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
tok = embedded_tokenizer()
EOS = tok.eos_token_id
said: dict = {}


def recorder(rows: int, prompt: str, completion: list, deadline_s: float = 60.0) -> StepRecorder:
    """`rows` rows of one prompt (G = 2), each completion `completion` + EOS, rewards 1, 0, 1, 0, …"""
    rec = StepRecorder(tok, num_generations=2, deadline_s=deadline_s, seed=rank)
    enc = tok([prompt] * rows, return_tensors="pt", padding=True)
    ids = torch.tensor([completion + [EOS]] * rows)
    rec.batch([prompt] * rows)
    rec.rollout(prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask, completion_ids=ids,
                completion_mask=torch.ones_like(ids))
    rec.rewards(torch.tensor([float((i + 1) % 2) for i in range(rows)]))
    return rec


def attempt(part: str, fn) -> None:
    t0 = time.monotonic()
    try:
        said[part] = fn()
    except Exception as err:  # noqa: BLE001 - what each rank raised is the test's subject
        said[part] = [type(err).__name__, str(err), time.monotonic() - t0]


attempt("groups", lambda: str(recorder(2 if rank == 0 else 3, "A: 8/8/8/8/8/8/8/K6 w - - 0 1+a1a2++", [65])
                              .save(os.path.join(out, "never"))))
wide = recorder(2, "A: 8/8/8/8/8/8/8/K6 w - - 0 1+a1a2++" if rank == 0 else
                "A: 8/8/8/8/8/8/8/K6 w - - 0 1+a1a2++ with a longer prompt", [65] if rank == 0 else [65, 66, 67])
attempt("widths", lambda: str(wide.save(os.path.join(out, "step"))))
attempt("check", lambda: str(wide.check()))
if rank == 0:
    open(os.path.join(out, "a-file"), "w").write("not a folder")
attempt("rank0", lambda: str(wide.save(os.path.join(out, "a-file"))))
done = os.path.join(out, "deadline-done")
if rank == 0:
    attempt("deadline", lambda: str(recorder(2, "A: 8/8/8/8/8/8/8/K6 w - - 0 1+a1a2++", [65], deadline_s=3.0)
                                    .save(os.path.join(out, "late"))))
    open(done, "w").close()
else:                               # alive, but never at the collective: rank 0's wait ends at its deadline
    t_end = time.monotonic() + 60
    while not os.path.exists(done) and time.monotonic() < t_end:
        time.sleep(0.2)
json.dump(said, open(os.path.join(out, f"rank{rank}.json"), "w"))
dist.destroy_process_group()
