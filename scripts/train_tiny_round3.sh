#!/usr/bin/env bash
# Issue 12, round 3 recipe for the embedded model (CPU, 2 threads, fp32). Resumable: run it again and it
# resumes from $WORK/r4/checkpoint. Stages:
#   1. data  (~18 min on 2 cores): 90k P: + 90k A: records from PURE random play (the positions `measure`
#            judges), plies 2-80, P: labels = the reward engine's search at depth 4; A: 12 % illegal attempts
#            and, for 80 % of games, the game played on to its end (a game-end A: record)
#   2. train (wsd: warm-up 50, constant 8e-4; stops at --max-minutes or Ctrl-C, checkpoint every 100 steps)
#            P: M:/E: pairs in UCI order (--m-order sorted), fused gelu (--activation gelu_pytorch_tanh)
#   3. decay DECAY_START=S DECAY_STEPS=N bash scripts/train_tiny_round3.sh   (linear to 5% over N steps)
#   4. measure: rookworld-debug measure $WORK/r4 --n-positions 200 --seed 777   (compare with --model tiny)
# Start weights: INIT (default: the shipped rookworld_debug/models/tiny). No --bf16: on a CPU without
# AVX512-BF16 (this AMD EPYC) bf16 autocast measured ~20x slower per step than fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-train_round3}
INIT=${INIT:-rookworld_debug/models/tiny}
OUT="$WORK/r4"
mkdir -p "$OUT"
if [ ! -f "$WORK/data_r3.jsonl" ]; then
  .venv/bin/rookworld-debug generate-data --out "$WORK/data_r3.jsonl" --n-p 90000 --n-a 90000 --depth 4 \
    --seed 5000 --workers 2 --heldout-frac 0 --p-illegal 0.12 --eps-range 1 1 --random-opening-max 0 \
    --min-plies 2 --max-plies 80 --keep 0.3 --p-game-end 0.8 --quiet
fi
COMMON=(--out "$OUT" --data "$WORK/data_r3.jsonl" --schedule wsd --lr 8e-4 --warmup 50 --min-lr-frac 0.05
  --batch-size 32 --prompt-weight 0.1 --e-weight 0.3 --a-fraction 0.5 --seed 5321 --threads 2
  --m-order sorted --activation gelu_pytorch_tanh
  --checkpoint-every 100 --log-every 25 --log-file "$OUT/train_log.txt")
STEPS=(--steps 100000)
if [ -n "${DECAY_START:-}" ]; then STEPS=(--decay-start "$DECAY_START" --steps $((DECAY_START + ${DECAY_STEPS:-300}))); fi
if [ -f "$OUT/checkpoint/trainer_state.pt" ]; then
  exec .venv/bin/rookworld-debug train-tiny --resume "$OUT/checkpoint" "${COMMON[@]}" "${STEPS[@]}" "$@"
fi
exec .venv/bin/rookworld-debug train-tiny --init-from "$INIT" "${COMMON[@]}" "${STEPS[@]}" "$@"
