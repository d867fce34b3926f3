#!/usr/bin/env bash
# ROUND=6 of scripts/train_tiny.sh (issue 24, second CPU try): the round-5 recipe with the fix its measurement
# named — game ends were 1–4 % of the new A: records, so the candidate answered most game-ending moves as if
# the game went on. Here the game-end and illegal records of the whole-game data are up-weighted by
# repetition (scripts/upweight_records.py: game ends to ~15 % of the A: records, illegal attempts past move 40
# doubled), and the round-3/4 replay is a larger share. Resumable per step (run it again).
#   data  seed 9100: --full-games, 1,600 games (engine-mixed and pure random, every length)
#         seed 8100: 20k P + 20k A with the round-3/4 generator settings (the replay)
#         up-weighted: data_up.jsonl (repeats of the two files' game-end and late illegal records)
#   train from INIT (default: the shipped weights), batch 32, linear decay 4e-4 -> 5 %, STEPS (default 1000),
#         --a-fraction 0.65, fp32 on the CPU, nice 19 so the machine stays usable
#   measure: rookworld-debug measure $WORK/r6 --n-positions 200 --seed 777
set -euo pipefail
cd "$(dirname "$0")/.."
INIT=${INIT:-rookworld_debug/models/tiny}
WORK=${WORK:-train_round6}
WORKERS=${WORKERS:-2}
STEPS=${STEPS:-1000}
DEVICE=${DEVICE:-cpu}
mkdir -p "$WORK"
RW=(nice -n 19 .venv/bin/rookworld-debug)
[ -f "$WORK/data_9100.jsonl" ] || "${RW[@]}" generate-data --out "$WORK/data_9100.jsonl" --n-games 1600 --full-games \
  --seed 9100 --depth 4 --keep 0.3 --p-illegal 0.12 --eps-range 0 1 --p-random-game 0.25 --p-share-p 0.3 \
  --p-end-branch 1.0 --heldout-frac 0 --workers "$WORKERS" --quiet
[ -f "$WORK/data_8100.jsonl" ] || "${RW[@]}" generate-data --out "$WORK/data_8100.jsonl" --n-p 20000 --n-a 20000 \
  --seed 8100 --p-illegal 0.12 --eps-range 1 1 --random-opening-max 0 --min-plies 2 --max-plies 80 --keep 0.3 \
  --p-game-end 0.8 --depth 4 --workers "$WORKERS" --heldout-frac 0 --quiet
[ -f "$WORK/data_up.jsonl" ] || .venv/bin/python scripts/upweight_records.py "$WORK/data_9100.jsonl" \
  "$WORK/data_8100.jsonl" --out "$WORK/data_up.jsonl" --end-share 0.15 --late-illegal-repeat 1
[ "${DATA_ONLY:-0}" = 1 ] && exit 0  # round 7 reuses this data
OUT="$WORK/r6"
[ -f "$OUT/model.safetensors" ] && { echo "done: $OUT"; exit 0; }
from=(--init-from "$INIT"); [ -f "$OUT/checkpoint/trainer_state.pt" ] && from=(--resume "$OUT/checkpoint")
"${RW[@]}" train-tiny "${from[@]}" --out "$OUT" --data "$WORK/data_9100.jsonl" "$WORK/data_8100.jsonl" \
  "$WORK/data_up.jsonl" --device "$DEVICE" --schedule linear --lr 4e-4 --warmup 30 --min-lr-frac 0.05 \
  --batch-size 32 --prompt-weight 0.1 --e-weight 0.3 --a-fraction 0.65 --seed 9421 --threads 2 --m-order sorted \
  --activation gelu_pytorch_tanh --steps "$STEPS" --checkpoint-every 50 --log-every 25 \
  --log-file "$OUT/train_log.txt" "$@"
echo "done: $OUT (measure: .venv/bin/rookworld-debug measure $OUT --n-positions 200 --seed 777)"
