"""A step of a loop under torch.distributed, recorded through `StepRecorder` on every rank: the ranks' rows gathered
to rank 0 as the global step. The merge in one process (padding, rank order, the mean loss, the micro-batches,
rows_by_rank through trace.json); the collectives in 2 processes under torchrun with gloo (a rank's rows not whole
groups refused on every rank, rank 0's failure said on the others, a missing rank ended by the deadline); and
examples/ddp_loop.py under torchrun as a user runs it: its healthy step replays clean, a fault on one rank is placed
in its phase with that rank's rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli import ENV, REPO, run_cli

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
PORT = 27500 + os.getpid() % 1000
G = 2


def _torchrun(args, cwd, port: int, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([TORCHRUN, "--nproc_per_node", "2", "--master_port", str(port), *map(str, args)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                       env={**ENV, "TOKENIZERS_PARALLELISM": "false"}, cwd=cwd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


# ------------------------------------------------------------------------------- the merge, in one process
@pytest.fixture(scope="module")
def tok():
    from tinymodels import embedded_tokenizer
    return embedded_tokenizer()


def _rank_recorder(tok, rank: int, rows: int = 2, **kw):
    """What rank `rank` records: `rows` rows of its own prompt; rank 1's prompt and completions are wider."""
    from rookworld_debug.record import StepRecorder
    rec = StepRecorder(tok, num_generations=G, seed=rank, **kw)
    prompt = "A: 8/8/8/8/8/8/8/K6 w - - 0 1+a1a2++" + (" and more" if rank else "")
    enc = tok([prompt] * rows, return_tensors="pt", padding=True)
    ids = torch.tensor([[65] * (1 + 2 * rank) + [tok.eos_token_id]] * rows)
    rec.batch([prompt] * (rows // G))                         # B prompts on one rank, expanded to its rows
    rec.rollout(prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask, completion_ids=ids,
                completion_mask=torch.ones_like(ids), sampling_logps=torch.full(ids.shape, -1.0 - rank))
    rec.rewards(torch.tensor([1.0, 0.0] * (rows // G) + [0.0] * (rows % G)))
    rec.advantages(torch.tensor([0.7, -0.7] * (rows // G) + [0.0] * (rows % G)))
    rec.loss(0.25 + rank)
    return rec


def _merged(tok, **kw):
    from rookworld_debug.record import distributed as D
    recs = [_rank_recorder(tok, r, **kw) for r in range(2)]
    parts = [D.local_part(r.pieces, r.prints, r.declared, r.gradient_accumulation_steps) for r in recs]
    return recs[0]._global(parts, D.check_parts(parts, G), 2)


def test_the_ranks_rows_merge_into_the_global_step_in_rank_order(tok, tmp_path):
    from rookworld_debug.grpo.step import StepTrace
    rec = _merged(tok, gradient_accumulation_steps=2)
    tr = StepTrace.load(rec._save_here(tmp_path / "step"))
    r = tr.rollout
    assert tr.recorded.rows_by_rank == ((0, 2), (2, 4))                   # through trace.json
    assert tr.recorded.loss == pytest.approx(0.75)                        # the mean of the ranks' losses
    assert tr.recorded.gradient_accumulation_steps == 4                   # 2 per rank × 2 ranks
    assert r.completion_mask.tolist() == [[1, 1, 0, 0]] * 2 + [[1, 1, 1, 1]] * 2   # right-padded, mask 0
    assert r.prompt_mask[:2, 0].tolist() == [0, 0] and r.prompt_mask[2:, 0].tolist() == [1, 1]   # left-padded
    assert r.sampling_per_token_logps[:2, 2:].abs().sum() == 0 and r.sampling_per_token_logps[2, 0] == -2.0
    assert [p.endswith("more") for p in r.prompts] == [False, False, True, True]
    assert any(f.startswith("distributed: 2 ranks") for f in tr.flags)


def test_a_rank_whose_rows_are_not_whole_groups_is_refused_by_name(tok):
    from rookworld_debug.errors import DataError
    from rookworld_debug.record import distributed as D
    recs = [_rank_recorder(tok, 0), _rank_recorder(tok, 1, rows=3)]
    parts = [D.local_part(r.pieces, r.prints, r.declared, 1) for r in recs]
    with pytest.raises(DataError, match="rank 1 holds 3 rows: not a whole number of groups"):
        D.check_parts(parts, G)
    parts[1]["rows"].pop("advantages")
    with pytest.raises(DataError, match="rank 1's recorded pieces differ"):
        D.check_parts(parts, G)


def test_a_gradient_not_averaged_over_the_ranks_is_said_in_the_flags(tok):
    """Rank 1's .grad differs from rank 0's (a backward outside DDP, or under no_sync): the trace keeps rank 0's and
    says so; equal gradients (DDP's all-reduce) say nothing."""
    from rookworld_debug.record import distributed as D
    recs = [_rank_recorder(tok, r) for r in range(2)]
    parts = [D.local_part(rec.pieces, {"gradient": 4.0 + rank}, rec.declared, 1) for rank, rec in enumerate(recs)]
    assert any("rank(s) [1] hold another gradient" in f and "not averaged" in f for f in D.rank_flags(parts))
    parts[1]["prints"]["gradient"] = 4.0
    assert D.rank_flags(parts) == ()


def test_a_tampered_rows_by_rank_is_refused_at_load(tok, tmp_path):
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.step import StepTrace
    path = _merged(tok)._save_here(tmp_path / "step")
    doc = json.loads((path / "trace.json").read_text())
    text = json.dumps(doc).replace('[0, 2]', '[0, 3]', 1)
    assert text != json.dumps(doc)
    (path / "trace.json").write_text(text)
    with pytest.raises(TraceError, match="rows_by_rank"):
        StepTrace.load(path)


def test_a_single_process_recorder_is_unchanged(tok, tmp_path):
    """No process group: save writes as before, one rank's worth of rows, no rows_by_rank, no distributed flag."""
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.record import distributed as D
    assert D.world() is None
    rec = _rank_recorder(tok, 0, gradient_accumulation_steps=2)
    tr = StepTrace.load(rec.save(tmp_path / "step"))
    assert tr.recorded.rows_by_rank == () and tr.recorded.gradient_accumulation_steps == 2
    assert tr.recorded.loss == 0.25 and tr.rollout.completion_ids.shape == (2, 2)
    assert not any(f.startswith("distributed") for f in tr.flags)


def test_the_disagreeing_rows_are_mapped_to_their_rank():
    from rookworld_debug.diagnosis.findings import Finding, Fix
    from rookworld_debug.diagnosis.replay.ranks import with_ranks
    from rookworld_debug.diagnosis.replay.records import PhaseCheck
    f = Finding(code="x", severity="error", cause="c.", evidence=(), fix=Fix("f"))
    rows = PhaseCheck("advantages", "q", "disagree", 1.0, 0.1, where="3 of 8 rows, e.g. rows [6, 4, 5]")
    out = with_ranks(f, rows, ((0, 4), (4, 8)))
    assert "The disagreeing rows are rank 1's: rows 4–6 (rank 1)." in out.cause
    assert out.evidence[-1].name == "replay/advantages/ranks" and out.evidence[-1].value == 1.0
    tokens = PhaseCheck("scoring", "q", "disagree", 1.0, 0.1, where="9 of 80 tokens, e.g. (row, t) [(1, 2), (7, 0)]")
    assert "rows 1 (rank 0); rows 7 (rank 1)" in with_ranks(f, tokens, ((0, 4), (4, 8))).cause
    assert with_ranks(f, rows, ()) is f                                   # one process: unchanged


# ------------------------------------------------------------------------------- the collectives, 2 processes
def test_the_collectives_refuse_together_and_end_by_their_deadline(tmp_path):
    """tests/ddp_record_worker.py: every rank raises the same named error, rank 0's failure reaches rank 1, a
    missing rank ends rank 0's wait at its deadline (3 s) in RankTimeoutError, and nothing hangs."""
    from rookworld_debug.grpo.step import StepTrace
    _torchrun([REPO / "tests" / "ddp_record_worker.py", tmp_path], tmp_path, PORT, timeout=180)
    said = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for s in said:
        assert s["groups"][0] == "DataError" and "rank 1 holds 3 rows" in s["groups"][1]
        assert s["widths"] == str(tmp_path / "step")
        assert s["check"] == said[0]["check"] and "the declaration holds" in s["check"]
    assert said[0]["rank0"][0] == "DataError" and "is a file" in said[0]["rank0"][1]
    assert said[1]["rank0"][0] == "DataError" and "rank 0 writing the global step failed there" in said[1]["rank0"][1]
    name, message, seconds = said[0]["deadline"]
    assert name == "RankTimeoutError" and "waited 3 s" in message and 2.5 < seconds < 30
    assert not (tmp_path / "never").exists() and not (tmp_path / "late").exists()
    tr = StepTrace.load(tmp_path / "step")
    assert tr.recorded.rows_by_rank == ((0, 2), (2, 4)) and tr.rollout.completion_ids.shape == (4, 4)


# ------------------------------------------------------------------------------- the example, as a user runs it
def test_a_fault_on_one_rank_is_placed_in_its_phase_and_rank(tmp_path):
    """adv_sign on rank 1 of a bnpo loop (token-normalised: each rank's token mean, averaged by DDP): the advantages
    disagree at rank 1's rows only, and every other phase — the loss and the DDP-averaged gradient included, replayed
    from the recorded advantages — agrees."""
    from rookworld_debug.diagnosis.replay import replay_findings, replay_path
    out = tmp_path / "step-1"
    _torchrun([REPO / "examples" / "ddp_loop.py", "--out", out, "--steps", "1", "--loss-type", "bnpo",
               "--max-new", "96", "--fault", "adv_sign", "--fault-rank", "1"], REPO, PORT + 2)
    rep = replay_path(out)
    assert rep.first_disagreement.phase == "advantages" and not rep.declarations
    assert {p["phase"]: p["status"] for p in rep.phases()} == {
        "generation": "agree", "rewards": "agree", "advantages": "disagree", "scoring": "agree", "loss": "agree",
        "gradient": "agree", "update": "agree"}
    top = next(f for f in replay_findings(rep) if f.severity == "error")
    ranks = next(e for e in top.evidence if e.name == "replay/advantages/ranks")
    assert ranks.value == 1.0 and "(rank 1)" in ranks.where and "(rank 0)" not in ranks.where
    assert "rank 1's" in top.cause and rep.trace.recorded.rows_by_rank == ((0, 8), (8, 16))


@pytest.mark.slow              # ~1 min: a torchrun and the command's replay with the weights
def test_the_example_step_replays_clean_through_the_cli(tmp_path):
    """grpo, as the example's docstring runs it (one prompt per rank here): every phase agrees, no error, exit 0."""
    from rookworld_debug.grpo.step import StepTrace
    out = tmp_path / "step-2"
    r = _torchrun([REPO / "examples" / "ddp_loop.py", "--out", out, "--prompts-per-rank", "1"], REPO, PORT + 1)
    assert f"recorded step 2: {out}" in r.stdout
    r = run_cli("diagnose", out, "--json", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    found = json.loads(r.stdout)
    assert not [f["code"] for f in found["findings"] if f["severity"] == "error"]
    assert [p["status"] for p in found["phases"]] == ["agree"] * 7
    tr = StepTrace.load(out)
    assert tr.recorded.rows_by_rank == ((0, 4), (4, 8)) and tr.recorded.gradient_accumulation_steps == 2
    assert tr.config.loss_type == "grpo"


@pytest.mark.slow              # ~1–2 min: a torchrun and replays with the weights (one per declaration fit)
def test_a_rank_local_dapo_is_judged_as_the_bnpo_it_computes(tmp_path):
    """dapo divided by each rank's own token count (not the global batch's): DDP's mean of per-rank token means is
    bnpo over the ranks; the replay says so as a declaration, and agrees under it."""
    from rookworld_debug.diagnosis.replay import replay_path
    out = tmp_path / "step-1"
    _torchrun([REPO / "examples" / "ddp_loop.py", "--out", out, "--steps", "1", "--loss-type", "dapo",
               "--fault", "local_token_count"], REPO, PORT + 3)
    rep = replay_path(out)
    assert [(d.keyword, d.fitted) for d in rep.declarations] == [("loss_type", "bnpo")]
    assert rep.first_disagreement is None and not rep.skipped
