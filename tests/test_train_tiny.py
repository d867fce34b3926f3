"""train-tiny's round-3 options: P: pairs in UCI order, the fused activation, run as a user runs them."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from rookworld_debug.chess.formats import PSample, format_p, parse_p
from rookworld_debug.models.train_tiny import set_activation, sort_m_field

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "rookworld_debug" / "models" / "tiny"
LINE = format_p(PSample(fen="r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
                        moves=("f1b5", "d2d4", "b1c3", "f1c4", "f1e2"), evals=("0.42", "0.36", "0.28", "0.3", "0.2"),
                        best="f1b5"))


def _record(text):
    s = parse_p(text)
    return dict(text=text, task="P", fen=s.fen, moves=list(s.moves), evals=list(s.evals), best=s.best)


def test_sort_m_field_orders_pairs_and_keeps_the_rest():
    rec = _record(LINE)
    out = sort_m_field(rec)
    s = parse_p(out["text"])
    assert list(s.moves) == sorted(rec["moves"]) == out["moves"]
    assert set(zip(s.moves, s.evals)) == set(zip(rec["moves"], rec["evals"]))  # pairs stay aligned
    assert s.best == rec["best"] and s.fen == rec["fen"]
    assert out["prompt"] + out["completion"] == out["text"] and out["prompt"] == f"P: {rec['fen']}"
    assert len(out["text"]) == len(LINE)  # same fixed-width layout
    assert sort_m_field(out) == out


def test_fused_activation_is_the_same_function():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY).eval()
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        other = "gelu_new" if model.config.activation_function != "gelu_new" else "gelu_pytorch_tanh"
        set_activation(model, other)
        after = model(input_ids=ids).logits
    assert model.config.activation_function == other
    assert (before - after).abs().max().item() < 1e-4


@pytest.mark.timeout(120)
def test_train_tiny_cli_sorted_and_fused(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(dict(_record(LINE), prompt="", completion="", split="train")) for _ in range(4)))
    # prompt/completion are rebuilt by --m-order sorted; give the A: half one real record
    a = ("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+",
         "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")
    with data.open("a") as f:
        f.write("\n" + json.dumps(dict(text=a[0] + a[1], prompt=a[0], completion=a[1], task="A", split="train")))
    out = tmp_path / "tt"
    cmd = [str(REPO / ".venv/bin/rookworld-debug"), "train-tiny", "--out", str(out), "--data", str(data),
           "--n-layer", "1", "--n-embd", "16", "--n-head", "1", "--n-positions", "256", "--steps", "2",
           "--batch-size", "2", "--threads", "1", "--m-order", "sorted", "--activation", "gelu_pytorch_tanh"]
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu_pytorch_tanh"
    log = (out / "train_log.txt").read_text()
    assert "UCI order" in log and "activation -> gelu_pytorch_tanh" in log
    assert json.loads((out / "training_args.json").read_text())["m_order"] == "sorted"
