#!/usr/bin/env bash
# Issue 12 recipe for the embedded model. ROUND=4 (default) is what the shipped weights ran (on a GPU);
# ROUND=5 is the issue-24 CPU fine-tune on whole games (scripts/train_tiny_round5.sh; measured, not shipped);
# ROUND=6 the same with game ends and late illegal attempts up-weighted (scripts/train_tiny_round6.sh; not shipped);
# ROUND=7 continues round 6's weights on round 6's data for longer (scripts/train_tiny_round7.sh);
# ROUND=3 and ROUND=2 reproduce the earlier CPU rounds. Resumable: run it again and it resumes from
# $WORK/<run>/checkpoint (ROUND=4: each finished stage is skipped).
#
# ROUND=4 (shipped): two stages from the round-3 weights, batch 512, bf16 autocast on CUDA.
#   DEVICE=cuda (default when torch sees a GPU) or DEVICE=cpu; on CPU the recipe is the same but
#   slow: fp32 (bf16 autocast is ~20x slower on AVX2-only CPUs), a 512-document step is ~30 s on 2
#   cores, so the 19,204 steps are days. On one H100 each stage took 360 s (0.04 s/step).
#   data  seed 5000: round 3's 90k P + 90k A; seed 6000: 100k + 100k; seed 7000: 120k + 120k; all
#         pure random play with game ends, the round-3 generator settings (WORKERS, default 2: on the
#         GPU machine seed 7000 took 188 s with 14 workers)
#   stage 1  data 5000 only, LR 1.5e-3 constant after 100 warm-up steps, --a-fraction 0.5, 9,204 steps
#   stage 2  data 5000 + 7000 + 6000 from the stage-1 weights, --a-fraction 0.6, 10,000 steps:
#            constant to 4,500, then linear decay to 5 % of the LR
#   measure: rookworld-debug measure $WORK/s2 --n-positions 200 --seed 777
#
# Round 3 (CPU, 2 threads): constant 8e-4 to step 2100, then
#   DECAY_START=2100 DECAY_STEPS=800 ROUND=3 bash scripts/train_tiny.sh --a-fraction 0.6
# Round 3 data: 90k P: + 90k A: from PURE random play, plies 2-80 (the positions `measure` judges); P: labels =
# the reward engine's search at depth 4; A: 12 % illegal attempts, and 80 % of games played on to their end (a
# game-end A: record). P: M:/E: pairs in UCI order (--m-order sorted), fused gelu. fp32: on this AVX2-only
# CPU (AMD EPYC, no AVX512-BF16) bf16 autocast measured ~20x slower per step than fp32.
# Start weights: INIT (default: the shipped rookworld_debug/models/tiny; ROUND=4 started from round 3's,
# which are `git show 5002561:rookworld_debug/models/tiny/model.safetensors`).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUND=${ROUND:-4}
if [ "$ROUND" = 4 ]; then exec bash scripts/train_tiny_round4.sh "$@"; fi
if [ "$ROUND" = 5 ]; then exec bash scripts/train_tiny_round5.sh "$@"; fi
if [ "$ROUND" = 6 ]; then exec bash scripts/train_tiny_round6.sh "$@"; fi
if [ "$ROUND" = 7 ]; then exec bash scripts/train_tiny_round7.sh "$@"; fi
INIT=${INIT:-rookworld_debug/models/tiny}
case "$ROUND" in
  2) WORK=${WORK:-train_round2}; RUN=r3; SEED=4321; PREC=(--bf16)
     GEN=(--n-p 150000 --n-a 150000 --seed 3000 --p-illegal 0.1 --eps-range 0.2 1.0 --random-opening-max 20) ;;
  3) WORK=${WORK:-train_round3}; RUN=r4; SEED=5321; PREC=(--m-order sorted --activation gelu_pytorch_tanh)
     GEN=(--n-p 90000 --n-a 90000 --seed 5000 --p-illegal 0.12 --eps-range 1 1 --random-opening-max 0
          --min-plies 2 --max-plies 80 --keep 0.3 --p-game-end 0.8) ;;
  *) echo "ROUND must be 2, 3, 4, 5 or 6" >&2; exit 2 ;;
esac
OUT="$WORK/$RUN"
DATA="$WORK/data_r3.jsonl"   # both rounds named their data file data_r3
mkdir -p "$OUT"
if [ ! -f "$DATA" ]; then
  .venv/bin/rookworld-debug generate-data --out "$DATA" "${GEN[@]}" --depth 4 --workers 2 --heldout-frac 0 --quiet
fi
COMMON=(--out "$OUT" --data "$DATA" --schedule wsd --lr 8e-4 --warmup 50 --min-lr-frac 0.05
  --batch-size 32 --prompt-weight 0.1 --e-weight 0.3 --a-fraction 0.5 --seed "$SEED" --threads 2 "${PREC[@]}"
  --checkpoint-every 100 --log-every 25 --log-file "$OUT/train_log.txt")
STEPS=(--steps 100000)
if [ -n "${DECAY_START:-}" ]; then STEPS=(--decay-start "$DECAY_START" --steps $((DECAY_START + ${DECAY_STEPS:-300}))); fi
if [ -f "$OUT/checkpoint/trainer_state.pt" ]; then
  exec .venv/bin/rookworld-debug train-tiny --resume "$OUT/checkpoint" "${COMMON[@]}" "${STEPS[@]}" "$@"
fi
exec .venv/bin/rookworld-debug train-tiny --init-from "$INIT" "${COMMON[@]}" "${STEPS[@]}" "$@"
