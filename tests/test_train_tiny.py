"""train-tiny as a user runs it: P: pairs in UCI order, the fused activation (the cpu-sorted recipe's options),
the recipes script, resuming from a checkpoint."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from rookworld_debug.chess.formats import PSample, format_p, parse_p
from rookworld_debug.lab.train_tiny import set_activation, sort_m_field

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "rookworld_debug" / "models" / "tiny"
LINE = format_p(PSample(fen="r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
                        moves=("f1b5", "d2d4", "b1c3", "f1c4", "f1e2"), evals=("0.42", "0.36", "0.28", "0.3", "0.2"),
                        best="f1b5"))


A_LINE = ("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+",
          "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")


def _record(text):
    s = parse_p(text)
    return dict(text=text, task="P", fen=s.fen, moves=list(s.moves), evals=list(s.evals), best=s.best)


def _data_lines(n_p: int, with_a: bool = True) -> list[str]:
    """JSONL lines: ``n_p`` P: records (prompt/completion are rebuilt by --m-order sorted) and one real A:."""
    lines = [json.dumps(dict(_record(LINE), prompt="", completion="", split="train"))] * n_p
    if with_a:
        lines.append(json.dumps(dict(text=A_LINE[0] + A_LINE[1], prompt=A_LINE[0], completion=A_LINE[1], task="A",
                                     split="train")))
    return lines


def _cli(args, timeout=110):
    cmd = [str(REPO / ".venv/bin/rookworld-debug"), "train-tiny", *args]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


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
    data.write_text("\n".join(_data_lines(4)))
    out = tmp_path / "tt"
    res = _cli(["--out", str(out), "--data", str(data), "--n-layer", "1", "--n-embd", "16", "--n-head", "1",
                "--n-positions", "256", "--steps", "2", "--batch-size", "2", "--threads", "1", "--m-order", "sorted",
                "--activation", "gelu_pytorch_tanh"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu_pytorch_tanh"
    log = (out / "train_log.txt").read_text()
    assert "UCI order" in log and "activation -> gelu_pytorch_tanh" in log
    assert json.loads((out / "training_args.json").read_text())["m_order"] == "sorted"


@pytest.mark.timeout(180)
def test_train_tiny_resumes_from_its_checkpoint(tmp_path):
    """--resume continues the optimizer, RNGs and data cursors of a checkpoint (loaded as tensors and plain
    values only), at the step after it."""
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(_data_lines(4)))
    small = ["--data", str(data), "--n-layer", "1", "--n-embd", "16", "--n-head", "1", "--n-positions", "256",
             "--batch-size", "2", "--threads", "1"]
    first = tmp_path / "first"
    res = _cli(["--out", str(first), *small, "--steps", "3", "--checkpoint-every", "1"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert (first / "checkpoint" / "trainer_state.pt").is_file()
    res = _cli(["--out", str(tmp_path / "second"), "--resume", str(first / "checkpoint"), "--data", str(data),
                "--batch-size", "2", "--threads", "1", "--steps", "4"])
    assert res.returncode == 0, res.stderr[-2000:]
    log = (tmp_path / "second" / "train_log.txt").read_text()
    assert "resumed from" in log and "at step 3" in log, log[-1000:]
    assert json.loads((tmp_path / "second" / "training_args.json").read_text())["final_step"] == 3


@pytest.mark.timeout(120)
def test_train_tiny_reads_xz_data_on_the_named_device(tmp_path):
    """Data carried to a GPU machine travels xz-compressed; --device names where the steps run."""
    import lzma

    data = tmp_path / "d.jsonl.xz"
    with lzma.open(data, "wt") as f:
        f.write("\n".join(_data_lines(4, with_a=False)))
    out = tmp_path / "tt"
    res = _cli(["--out", str(out), "--data", str(data), "--n-layer", "1", "--n-embd", "16", "--n-head", "1",
                "--n-positions", "256", "--steps", "2", "--batch-size", "2", "--a-fraction", "0", "--threads", "1",
                "--m-order", "sorted", "--device", "cpu"])
    assert res.returncode == 0, res.stderr[-2000:]
    meta = json.loads((out / "training_args.json").read_text())
    assert meta["device"] == "cpu" and meta["n_train_p"] == 4 and meta["final_step"] == 1
    assert "device cpu fp32" in (out / "train_log.txt").read_text()


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the error of a machine without CUDA")
def test_train_tiny_without_the_device_is_a_named_error(tmp_path):
    res = _cli(["--out", str(tmp_path / "tt"), "--device", "cuda", "--steps", "1"], timeout=50)
    assert res.returncode == 2
    assert "--device" in res.stderr and "cuda" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "tt" / "train_log.txt").exists()  # refused before any work


@pytest.mark.timeout(240)
def test_shipped_recipe_runs_both_stages_and_resumes(tmp_path):
    """scripts/train_tiny.sh (RECIPE=shipped, the default) as a user runs it, on CPU, with its data files already made and the
    step count cut to 2 (extra arguments reach both stages): stage 2 starts from stage 1's weights, and a
    second run finds both stages done instead of training again."""
    lines = _data_lines(3)
    for seed in (5000, 6000, 7000):
        (tmp_path / f"data_{seed}.jsonl").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WORK": str(tmp_path), "DEVICE": "cpu"}
    cmd = ["bash", str(REPO / "scripts" / "train_tiny.sh"), "--steps", "2", "--batch-size", "2", "--threads", "1"]
    res = subprocess.run(cmd, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=200,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    s1 = json.loads((tmp_path / "s1" / "training_args.json").read_text())
    s2 = json.loads((tmp_path / "s2" / "training_args.json").read_text())
    assert s1["init_from"].endswith("rookworld_debug/models/tiny") and s1["device"] == "cpu" and not s1["bf16"]
    assert s2["init_from"] == str(tmp_path / "s1") and s2["a_fraction"] == 0.6 and s2["decay_start"] == 4500
    assert len(s2["data"]["files"]) == 3 and s2["final_step"] == 1
    mtime = (tmp_path / "s2" / "model.safetensors").stat().st_mtime
    res = subprocess.run(cmd, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0 and "done:" in res.stdout, res.stderr[-2000:]
    assert (tmp_path / "s2" / "model.safetensors").stat().st_mtime == mtime


@pytest.mark.timeout(120)
def test_train_tiny_data_without_a_task_the_batch_needs_is_a_named_error(tmp_path):
    data = tmp_path / "p_only.jsonl"
    data.write_text("\n".join(_data_lines(3, with_a=False)))
    res = _cli(["--out", str(tmp_path / "tt"), "--data", str(data), "--n-layer", "1", "--n-embd", "16", "--n-head", "1",
                "--n-positions", "256", "--steps", "2", "--batch-size", "2", "--threads", "1", "--m-order", "sorted"])
    assert res.returncode == 2, res.stderr[-2000:]
    assert "no A: documents" in res.stderr and "--a-fraction" in res.stderr and "Traceback" not in res.stderr
