#!/usr/bin/env bash
# Issue 12, round 2 recipe for the embedded model (CPU, 2 threads). Resumable: run it again and it resumes
# from $WORK/r3/checkpoint. Stages:
#   1. data   (~12 min): 150k P: (depth 4, labels = the reward engine's search) + 150k A:, random-play-heavy
#   2. train  (wsd: warm-up 50, constant 8e-4; stops at --max-minutes or Ctrl-C, checkpoint every 100 steps)
#   3. decay  DECAY_START=S DECAY_STEPS=N bash scripts/train_tiny_round2.sh   (linear to 5% over N steps)
#   4. measure: rookworld-debug measure $WORK/r3 --n-positions 200 --seed 777   (compare with --model tiny)
# Start weights: INIT (default: the shipped rookworld_debug/models/tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-train_round2}
INIT=${INIT:-rookworld_debug/models/tiny}
OUT="$WORK/r3"
mkdir -p "$OUT"
if [ ! -f "$WORK/data_r3.jsonl" ]; then
  .venv/bin/rookworld-debug generate-data --out "$WORK/data_r3.jsonl" --n-p 150000 --n-a 150000 --depth 4 \
    --seed 3000 --workers 2 --heldout-frac 0 --p-illegal 0.1 --eps-range 0.2 1.0 --random-opening-max 20 --quiet
fi
COMMON=(--out "$OUT" --data "$WORK/data_r3.jsonl" --schedule wsd --lr 8e-4 --warmup 50 --min-lr-frac 0.05
  --batch-size 32 --prompt-weight 0.1 --e-weight 0.3 --a-fraction 0.5 --seed 4321 --threads 2 --bf16
  --checkpoint-every 100 --log-every 25 --log-file "$OUT/train_log.txt")
STEPS=(--steps 100000)
if [ -n "${DECAY_START:-}" ]; then STEPS=(--decay-start "$DECAY_START" --steps $((DECAY_START + ${DECAY_STEPS:-300}))); fi
if [ -f "$OUT/checkpoint/trainer_state.pt" ]; then
  exec .venv/bin/rookworld-debug train-tiny --resume "$OUT/checkpoint" "${COMMON[@]}" "${STEPS[@]}" "$@"
fi
exec .venv/bin/rookworld-debug train-tiny --init-from "$INIT" "${COMMON[@]}" "${STEPS[@]}" "$@"
