#!/usr/bin/env bash
# ROUND=4 of scripts/train_tiny.sh (read its header): three data files, then two stages. Resumable per step.
set -euo pipefail
cd "$(dirname "$0")/.."
INIT=${INIT:-rookworld_debug/models/tiny}
WORK=${WORK:-train_round4}
WORKERS=${WORKERS:-2}
if [ -z "${DEVICE:-}" ]; then
  DEVICE=$(.venv/bin/python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
fi
PREC=(); [ "$DEVICE" != cpu ] && PREC=(--bf16)   # bf16 autocast only where it is fast (CUDA)
mkdir -p "$WORK"
gen() {  # gen SEED N_EACH: the round-3 generator settings with another seed and size
  local f="$WORK/data_$1.jsonl"
  [ -f "$f" ] || .venv/bin/rookworld-debug generate-data --out "$f" --n-p "$2" --n-a "$2" --seed "$1" \
    --p-illegal 0.12 --eps-range 1 1 --random-opening-max 0 --min-plies 2 --max-plies 80 --keep 0.3 \
    --p-game-end 0.8 --depth 4 --workers "$WORKERS" --heldout-frac 0 --quiet
}
gen 5000 90000; gen 6000 100000; gen 7000 120000
COMMON=(--device "$DEVICE" "${PREC[@]}" --schedule wsd --lr 1.5e-3 --warmup 100 --min-lr-frac 0.05
  --batch-size 512 --prompt-weight 0.1 --e-weight 0.3 --threads 2 --m-order sorted --activation gelu_pytorch_tanh
  --pad-to 16 --checkpoint-every 500 --log-every 100)
stage() {  # stage NAME INIT ARGS...: train (or resume) unless its final folder is there
  local out="$WORK/$1" init="$2"; shift 2
  [ -f "$out/model.safetensors" ] && return 0
  local from=(--init-from "$init"); [ -f "$out/checkpoint/trainer_state.pt" ] && from=(--resume "$out/checkpoint")
  .venv/bin/rookworld-debug train-tiny "${from[@]}" --out "$out" "${COMMON[@]}" "$@"
}
stage s1 "$INIT" --data "$WORK/data_5000.jsonl" --a-fraction 0.5 --seed 6321 --steps 9204 "$@"
stage s2 "$WORK/s1" --data "$WORK/data_5000.jsonl" "$WORK/data_7000.jsonl" "$WORK/data_6000.jsonl" \
  --a-fraction 0.6 --seed 6421 --steps 10000 --decay-start 4500 "$@"
echo "done: $WORK/s2 (measure: .venv/bin/rookworld-debug measure $WORK/s2 --n-positions 200 --seed 777)"
