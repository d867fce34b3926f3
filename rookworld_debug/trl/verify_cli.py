"""`rookworld-debug verify-capture`: a capture against the run's checkpoints — is the step you opened the step that
happened?

    rookworld-debug verify-capture captures/step-000212 --before out/checkpoint-211 --after out/checkpoint-212

From the `--before` checkpoint (weights + AdamW state, as TRL's Trainer saved them) the captured step's
update is applied again from the captured batch alone, with no generation: every micro-batch's loss is
recomputed with gradients (grpo.objective.loss on the captured ids, old/ref log-probs and advantages, TRL's
per-micro-batch normalization), the gradient is clipped at `max_grad_norm`, and one AdamW step is taken
at the captured learning rate. The result is compared, layer by layer, with the `--after` checkpoint:
max |θ_replayed − θ_after| absolute, and relative to the layer's true update max |θ_after − θ_before|.
Exit 0 when every layer is within tolerance, 1 otherwise (naming the worst layers), 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rookworld_debug import cliargs

from .tolerances import ATOL, RTOL, check_tolerances


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld-debug verify-capture", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step_dir", help="a captured step folder (step-NNNNNN)")
    ap.add_argument("--before", required=True, help="the checkpoint-N folder saved before the step (N = step − 1)")
    ap.add_argument("--after", required=True, help="the checkpoint-N folder saved after the step (N = step)")
    ap.add_argument("--rtol", type=float, default=RTOL,
                    help=f"per-layer tolerance relative to the true update ({RTOL})")
    cliargs.add_threads(ap)
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.safeio import check_input_file
    check_tolerances(a.rtol, ATOL)
    if not 1 <= a.threads <= 1024:
        raise ConfigError("--threads", f"a number of CPU threads ≥ 1, got {a.threads}")
    for flag, folder in (("--before", a.before), ("--after", a.after)):
        check_input_file(Path(folder) / "config.json", flag)
    check_input_file(Path(a.before) / "optimizer.pt", "--before")
    import torch                        # after the arguments: --help and bad input answer without it (seconds)

    from .verify import format_result, verify_capture
    torch.set_num_threads(a.threads)
    res = verify_capture(a.step_dir, a.before, a.after, rtol=a.rtol)
    print(format_result(res, a.rtol))
    return 0 if res.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
