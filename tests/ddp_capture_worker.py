"""Launched by tests/test_capture_ddp.py as a user launches a run: `torchrun --nproc_per_node 2 this.py OUT MODE`.
MODE "capture": the flight recorder (keep 1, triggers) plus steps 2 and 3; "plain": no capture; "spg": steps 1
and 2 of a run with steps_per_generation 4 > gradient_accumulation_steps 2 (one generation batch, two steps). Rank 0 writes
OUT/<mode>.json: TRL's logged losses per step and the final weights (for the bit-identity check)."""
import json
import os
import sys

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
out, mode = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
from rookworld_debug.trl.capture import capture_steps  # noqa: E402
from rookworld_debug.trl.example import make_trainer, tiny_dataset  # noqa: E402

if mode == "spg":
    trainer = make_trainer(os.path.join(out, f"run-{mode}"), max_steps=2, prompts_per_step=1, num_generations=4,
                           dataset=tiny_dataset(8), gradient_accumulation_steps=2, steps_per_generation=4,
                           loss_type="dapo", max_completion_length=48)
    cap = capture_steps(trainer, steps=[1, 2], out_dir=os.path.join(out, "captures-spg"))
else:
    trainer = make_trainer(os.path.join(out, f"run-{mode}"), max_steps=3, prompts_per_step=2, num_generations=4,
                           dataset=tiny_dataset(8), max_completion_length=48)
    cap = capture_steps(trainer, steps=[2, 3], out_dir=os.path.join(out, "captures"), keep_last=1,
                        triggers="default") if mode == "capture" else None
trainer.train()
if trainer.accelerator.is_main_process:
    w = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    torch.save(w, os.path.join(out, f"{mode}-weights.pt"))
    json.dump({"world": trainer.accelerator.num_processes,
               "logged": {d["step"]: d["loss"] for d in trainer.state.log_history if "loss" in d},
               "errors": cap.errors if cap else {}, "paths": {k: str(v) for k, v in (cap.paths if cap else {}).items()}},
              open(os.path.join(out, f"{mode}.json"), "w"))
# every rank leaves the process group before exiting: gloo's threads torn down by the interpreter's exit instead can
# end a rank in std::terminate (SIGABRT, "terminate called without an active exception") after its work is done
trainer.accelerator.wait_for_everyone()
if torch.distributed.is_available() and torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
