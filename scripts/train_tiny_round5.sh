#!/usr/bin/env bash
# ROUND=5 of scripts/train_tiny.sh (issue 24): a targeted CPU fine-tune of the round-4 weights on games
# played to their natural end (generate-data --full-games: terminal vs non-terminal cannot be read off the
# move number), with a replay of the round-3/4 data mix so that nothing regresses. Resumable per step.
#   data  seed 9000: --full-games, 2,800 games (engine-mixed and pure random, every length, game-end and
#         illegal records in every band; about 15 % of kept positions also give a P: record)
#         seed 8000: 20k P + 20k A with the round-3/4 generator settings (the replay)
#   train from INIT (default: the shipped weights), batch 32, linear decay 4e-4 -> 5 %, STEPS (default
#         1100), --a-fraction 0.65, fp32 on the CPU (2 threads: ~2 s/step)
#   measure: rookworld-debug measure $WORK/r5 --n-positions 200 --seed 777
set -euo pipefail
cd "$(dirname "$0")/.."
INIT=${INIT:-rookworld_debug/models/tiny}
WORK=${WORK:-train_round5}
WORKERS=${WORKERS:-2}
STEPS=${STEPS:-1100}
DEVICE=${DEVICE:-cpu}
mkdir -p "$WORK"
RW=(.venv/bin/rookworld-debug)
[ -f "$WORK/data_9000.jsonl" ] || "${RW[@]}" generate-data --out "$WORK/data_9000.jsonl" --n-games 2800 --full-games \
  --seed 9000 --depth 4 --keep 0.3 --p-illegal 0.12 --eps-range 0 1 --p-random-game 0.25 --p-share-p 0.3 \
  --p-end-branch 1.0 --heldout-frac 0 --workers "$WORKERS" --quiet
[ -f "$WORK/data_8000.jsonl" ] || "${RW[@]}" generate-data --out "$WORK/data_8000.jsonl" --n-p 20000 --n-a 20000 \
  --seed 8000 --p-illegal 0.12 --eps-range 1 1 --random-opening-max 0 --min-plies 2 --max-plies 80 --keep 0.3 \
  --p-game-end 0.8 --depth 4 --workers "$WORKERS" --heldout-frac 0 --quiet
OUT="$WORK/r5"
[ -f "$OUT/model.safetensors" ] && { echo "done: $OUT"; exit 0; }
from=(--init-from "$INIT"); [ -f "$OUT/checkpoint/trainer_state.pt" ] && from=(--resume "$OUT/checkpoint")
"${RW[@]}" train-tiny "${from[@]}" --out "$OUT" --data "$WORK/data_9000.jsonl" "$WORK/data_8000.jsonl" \
  --device "$DEVICE" --schedule linear --lr 4e-4 --warmup 30 --min-lr-frac 0.05 --batch-size 32 \
  --prompt-weight 0.1 --e-weight 0.3 --a-fraction 0.65 --seed 9321 --threads 2 --m-order sorted \
  --activation gelu_pytorch_tanh --steps "$STEPS" --checkpoint-every 100 --log-every 25 \
  --log-file "$OUT/train_log.txt" "$@"
echo "done: $OUT (measure: .venv/bin/rookworld-debug measure $OUT --n-positions 200 --seed 777)"
