#!/usr/bin/env bash
# Rebuild the embedded tiny RookWorld model: one script, named recipes. Resumable: run it again and it
# resumes from $WORK/<run>/checkpoint (finished stages are skipped).
#   RECIPE=shipped bash scripts/train_tiny.sh [train-tiny args...]      (the default)
#
# Recipes (the model card, rookworld_debug/models/tiny/MODEL_CARD.md, has each one's measurements):
#   shipped        the weights in the package: two stages from the `cpu-sorted` weights, batch 512, bf16
#                  autocast on CUDA. DEVICE=cuda (default when torch sees a GPU) or DEVICE=cpu (same recipe,
#                  fp32, ~30 s a step on 2 cores: days). On one H100 each stage took 360 s.
#                  data  seed 5000: 90k P + 90k A; seed 6000: 100k + 100k; seed 7000: 120k + 120k; all pure
#                        random play with game ends (WORKERS, default 2)
#                  stage s1  data 5000, LR 1.5e-3 constant after 100 warm-up steps, --a-fraction 0.5, 9,204 steps
#                  stage s2  data 5000 + 7000 + 6000 from s1, --a-fraction 0.6, 10,000 steps: constant to
#                            4,500, then linear decay to 5 % of the LR
#   whole-games    a CPU fine-tune of the shipped weights on games played to their natural end
#                  (generate-data --full-games), plus a replay of the shipped data mix (not shipped)
#   game-ends      whole-games with game-end and late illegal records up-weighted
#                  (scripts/upweight_records.py; not shipped)
#   game-ends-long continues game-ends' weights on its data with a longer, lower schedule (not shipped)
#   cpu-sorted     the CPU recipe before `shipped` (M:/E: pairs in UCI order, fused gelu, plies 2-80);
#                  DECAY_START=2100 DECAY_STEPS=800 RECIPE=cpu-sorted bash scripts/train_tiny.sh --a-fraction 0.6
#   cpu-first      the first CPU recipe (bf16, wider openings)
# Start weights: INIT (default: the shipped rookworld_debug/models/tiny).
# Measure any result: .venv/bin/rookworld-debug measure $WORK/<run> --n-positions 200 --seed 777
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${RECIPE:-shipped}
INIT=${INIT:-rookworld_debug/models/tiny}
WORKERS=${WORKERS:-2}
RW=(.venv/bin/rookworld-debug)

uniform_data() {  # uniform_data FILE SEED N_EACH: positions from pure random play, plies 2-80, with game ends
  [ -f "$1" ] || "${RW[@]}" generate-data --out "$1" --n-p "$3" --n-a "$3" --seed "$2" --p-illegal 0.12 \
    --eps-range 1 1 --random-opening-max 0 --min-plies 2 --max-plies 80 --keep 0.3 --p-game-end 0.8 --depth 4 \
    --workers "$WORKERS" --heldout-frac 0 --quiet
}
games_data() {  # games_data FILE SEED N_GAMES: games played to their natural end (engine-mixed and random)
  [ -f "$1" ] || "${RW[@]}" generate-data --out "$1" --n-games "$3" --full-games --seed "$2" --depth 4 --keep 0.3 \
    --p-illegal 0.12 --eps-range 0 1 --p-random-game 0.25 --p-share-p 0.3 --p-end-branch 1.0 --heldout-frac 0 \
    --workers "$WORKERS" --quiet
}
train() {  # train OUT INIT ARGS...: train (or resume) unless OUT holds final weights
  local out="$1" init="$2"; shift 2
  [ -f "$out/model.safetensors" ] && return 0
  local from=(--init-from "$init"); [ -f "$out/checkpoint/trainer_state.pt" ] && from=(--resume "$out/checkpoint")
  "${RW[@]}" train-tiny "${from[@]}" --out "$out" "$@"
}
FINE_TUNE=(--schedule linear --min-lr-frac 0.05 --batch-size 32 --prompt-weight 0.1 --e-weight 0.3
  --a-fraction 0.65 --threads 2 --m-order sorted --activation gelu_pytorch_tanh --log-every 25)

recipe_shipped() {
  local work=${WORK:-train_shipped}
  if [ -z "${DEVICE:-}" ]; then
    DEVICE=$(.venv/bin/python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
  fi
  local prec=(); [ "$DEVICE" != cpu ] && prec=(--bf16)   # bf16 autocast only where it is fast (CUDA)
  mkdir -p "$work"
  uniform_data "$work/data_5000.jsonl" 5000 90000
  uniform_data "$work/data_6000.jsonl" 6000 100000
  uniform_data "$work/data_7000.jsonl" 7000 120000
  local common=(--device "$DEVICE" "${prec[@]}" --schedule wsd --lr 1.5e-3 --warmup 100 --min-lr-frac 0.05
    --batch-size 512 --prompt-weight 0.1 --e-weight 0.3 --threads 2 --m-order sorted
    --activation gelu_pytorch_tanh --pad-to 16 --checkpoint-every 500 --log-every 100)
  train "$work/s1" "$INIT" "${common[@]}" --data "$work/data_5000.jsonl" --a-fraction 0.5 --seed 6321 \
    --steps 9204 "$@"
  train "$work/s2" "$work/s1" "${common[@]}" --data "$work/data_5000.jsonl" "$work/data_7000.jsonl" \
    "$work/data_6000.jsonl" --a-fraction 0.6 --seed 6421 --steps 10000 --decay-start 4500 "$@"
  echo "done: $work/s2"
}
recipe_whole_games() {
  local work=${WORK:-train_whole_games}; mkdir -p "$work"
  games_data "$work/data_9000.jsonl" 9000 2800
  uniform_data "$work/data_8000.jsonl" 8000 20000
  train "$work/r" "$INIT" "${FINE_TUNE[@]}" --data "$work/data_9000.jsonl" "$work/data_8000.jsonl" \
    --device "${DEVICE:-cpu}" --lr 4e-4 --warmup 30 --seed 9321 --steps "${STEPS:-1100}" --checkpoint-every 100 \
    --log-file "$work/r/train_log.txt" "$@"
  echo "done: $work/r"
}
game_ends_data() {  # game_ends_data WORK: the whole-games data with its rare A: records repeated
  games_data "$1/data_9100.jsonl" 9100 1600
  uniform_data "$1/data_8100.jsonl" 8100 20000
  [ -f "$1/data_up.jsonl" ] || .venv/bin/python scripts/upweight_records.py "$1/data_9100.jsonl" \
    "$1/data_8100.jsonl" --out "$1/data_up.jsonl" --end-share 0.15 --late-illegal-repeat 1
}
recipe_game_ends() {
  local work=${WORK:-train_game_ends}; mkdir -p "$work"
  game_ends_data "$work"
  RW=(nice -n 19 .venv/bin/rookworld-debug)   # keep the machine usable
  train "$work/r" "$INIT" "${FINE_TUNE[@]}" --data "$work/data_9100.jsonl" "$work/data_8100.jsonl" \
    "$work/data_up.jsonl" --device "${DEVICE:-cpu}" --lr 4e-4 --warmup 30 --seed 9421 --steps "${STEPS:-1000}" \
    --checkpoint-every 50 --log-file "$work/r/train_log.txt" "$@"
  echo "done: $work/r"
}
recipe_game_ends_long() {
  local data=${DATA:-train_game_ends} work=${WORK:-train_game_ends_long}
  [ -f "$data/r/model.safetensors" ] || WORK="$data" STEPS=1000 recipe_game_ends
  mkdir -p "$work"
  RW=(nice -n 19 .venv/bin/rookworld-debug)
  train "$work/r" "${INIT_LONG:-$data/r}" "${FINE_TUNE[@]}" --data "$data/data_9100.jsonl" \
    "$data/data_8100.jsonl" "$data/data_up.jsonl" --device "${DEVICE:-cpu}" --lr 3e-4 --warmup 20 --seed 9521 \
    --steps "${STEPS:-1500}" --checkpoint-every 50 --log-file "$work/r/train_log.txt" "$@"
  echo "done: $work/r"
}
recipe_cpu_first_or_sorted() {  # the two early CPU recipes share one shape
  local work run seed prec gen
  if [ "$RECIPE" = cpu-first ]; then
    work=${WORK:-train_cpu_first}; seed=4321; prec=(--bf16)
    gen=(--n-p 150000 --n-a 150000 --seed 3000 --p-illegal 0.1 --eps-range 0.2 1.0 --random-opening-max 20)
  else
    work=${WORK:-train_cpu_sorted}; seed=5321; prec=(--m-order sorted --activation gelu_pytorch_tanh)
    gen=(--n-p 90000 --n-a 90000 --seed 5000 --p-illegal 0.12 --eps-range 1 1 --random-opening-max 0
         --min-plies 2 --max-plies 80 --keep 0.3 --p-game-end 0.8)
  fi
  local data="$work/data.jsonl"; mkdir -p "$work/r"
  [ -f "$data" ] || "${RW[@]}" generate-data --out "$data" "${gen[@]}" --depth 4 --workers 2 --heldout-frac 0 --quiet
  local steps=(--steps 100000)
  [ -n "${DECAY_START:-}" ] && steps=(--decay-start "$DECAY_START" --steps $((DECAY_START + ${DECAY_STEPS:-300})))
  train "$work/r" "$INIT" --data "$data" --schedule wsd --lr 8e-4 --warmup 50 --min-lr-frac 0.05 --batch-size 32 \
    --prompt-weight 0.1 --e-weight 0.3 --a-fraction 0.5 --seed "$seed" --threads 2 "${prec[@]}" \
    --checkpoint-every 100 --log-every 25 --log-file "$work/r/train_log.txt" "${steps[@]}" "$@"
  echo "done: $work/r"
}

case "$RECIPE" in
  shipped) recipe_shipped "$@" ;;
  whole-games) recipe_whole_games "$@" ;;
  game-ends) recipe_game_ends "$@" ;;
  game-ends-long) recipe_game_ends_long "$@" ;;
  cpu-first|cpu-sorted) recipe_cpu_first_or_sorted "$@" ;;
  *) echo "RECIPE must be one of: shipped, whole-games, game-ends, game-ends-long, cpu-sorted, cpu-first" >&2
     exit 2 ;;
esac
echo "measure: .venv/bin/rookworld-debug measure <the folder above> --n-positions 200 --seed 777"
