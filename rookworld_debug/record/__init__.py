"""Record one step of your own GRPO training loop, so every view, `diagnose`, `triage`, `whatif` and the replay
open it.

    from rookworld_debug.record import StepRecorder, EMBEDDED_MODEL
    rec = StepRecorder(tokenizer, loss_type="grpo", num_generations=8, beta=0.04, temperature=1.0)
    ... rec.batch(...), rec.model_before(...), rec.rollout(...), rec.rewards(...), rec.advantages(...),
        rec.logprobs(...), rec.loss(...), rec.gradient(...), rec.model_after(...)
    rec.save("runs/mine/step-3")

See `recorder.py` for each call; examples/ holds complete trainers that record a step (`ddp_loop.py`: every rank of
a DDP loop under torchrun records its rows and calls save; rank 0 writes the global step, `distributed.py`).
"""
from pathlib import Path

from rookworld_debug.record.distributed import RankTimeoutError
from rookworld_debug.record.recorder import StepRecorder

EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny"   # a transformers model folder
BUNDLED_DATA = Path(__file__).resolve().parent.parent / "data" / "bundled" / "rookworld_sample.jsonl"

__all__ = ["StepRecorder", "RankTimeoutError", "EMBEDDED_MODEL", "BUNDLED_DATA"]
