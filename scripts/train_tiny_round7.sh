#!/usr/bin/env bash
# ROUND=7 of scripts/train_tiny.sh (issue 24, third CPU try). Round 6 moved game-end answers from 16 % to 69 %
# in 400 steps while its loss was still falling, and lost 7 points of legal-move answers: both errors are the
# terminal-vs-not decision, which needs more training on the same mix rather than a different mix. So round 7
# continues round 6's weights on round 6's data (regenerated with the same seeds when absent) with a longer,
# lower schedule and a new data-order seed. Resumable per step (run it again).
#   init  $DATA/r6 (round 6's weights; ROUND=6 is run first when they are absent)
#   train batch 32, linear decay 3e-4 -> 5 % over STEPS (default 1500), --a-fraction 0.65, fp32 CPU, nice 19
#   measure: rookworld-debug measure $WORK/r7 --n-positions 200 --seed 777
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-train_round6}
WORK=${WORK:-train_round7}
STEPS=${STEPS:-1500}
DEVICE=${DEVICE:-cpu}
[ -f "$DATA/r6/model.safetensors" ] || WORK="$DATA" bash scripts/train_tiny_round6.sh
INIT=${INIT:-$DATA/r6}
OUT="$WORK/r7"
mkdir -p "$WORK"
[ -f "$OUT/model.safetensors" ] && { echo "done: $OUT"; exit 0; }
from=(--init-from "$INIT"); [ -f "$OUT/checkpoint/trainer_state.pt" ] && from=(--resume "$OUT/checkpoint")
nice -n 19 .venv/bin/rookworld-debug train-tiny "${from[@]}" --out "$OUT" --data "$DATA/data_9100.jsonl" \
  "$DATA/data_8100.jsonl" "$DATA/data_up.jsonl" --device "$DEVICE" --schedule linear --lr 3e-4 --warmup 20 \
  --min-lr-frac 0.05 --batch-size 32 --prompt-weight 0.1 --e-weight 0.3 --a-fraction 0.65 --seed 9521 --threads 2 \
  --m-order sorted --activation gelu_pytorch_tanh --steps "$STEPS" --checkpoint-every 50 --log-every 25 \
  --log-file "$OUT/train_log.txt" "$@"
echo "done: $OUT (measure: .venv/bin/rookworld-debug measure $OUT --n-positions 200 --seed 777)"
