"""grpo.multistep.loop: β/LR schedules at the step they name, adaptive β on RAW KL, cursor wrap, bit-identical
resume, and an overfit run that learns a deliberately rewarded behaviour. Tiny byte-level GPT-2 built here."""
import json
import math
import re

import pytest
import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.data.loaders import Sample
from rookworld_debug.errors import ConfigError, DataError
from rookworld_debug.grpo.multistep.loop import (BatchCursor, BetaController, BetaSchedule, LRSchedule, run_steps,
                                            step_seed, summary_stats, t975)
from rookworld_debug.models import load_policy_and_reference

EOS = "<|endoftext|>"
FENS = ["rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "8/8/8/8/8/8/8/K6k w - - 0 1",
        "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3", "8/3R4/p6k/b2N4/8/7P/6K1/3q4 b - - 1 55",
        "5rkb/4np1p/1Nr1b1p1/2P1p3/Q3P3/3qB1P1/5PBP/1R3RK1 w - - 2 30"]
LABEL = "M: e2e4 d2d4 g1f3 c2c4 b1c3 E: 0.3 0.35 0.28 0.32 0.29 B: e2e4"


from tinymodels import save_tiny_gpt2  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny byte-level GPT-2 as drawn (tied embeddings, no EOS bias: completions run to max_new_tokens)."""
    return str(save_tiny_gpt2(tmp_path_factory.mktemp("tiny_multistep"), n_positions=192, eos_logit=None,
                              tie_word_embeddings=True))


def _samples(n):
    train = [Sample(text=f"P: {FENS[i % 5]} " + LABEL, task="P", prompt=f"P: {FENS[i % 5]}" + " " * (i // 5),
                    completion=LABEL, index=i) for i in range(n)]
    return train, []


def _config(model_dir, **kw):
    base = dict(model=model_dir, batch_size=2, num_generations=2, max_new_tokens=12, eval_max_new_tokens=12,
                reward_mode="dataset", heldout_n=0, top_k_alternatives=0, lr=1e-3, beta=0.05, seed=3)
    return StepConfig(**{**base, **kw})


def lowercase(prompts, completions, **kw):
    """The deliberately rewarded behaviour: fraction of completion characters in a-z (≈10 % of the byte
    vocabulary, so a random policy already samples some and the groups have reward variance)."""
    return [sum("a" <= ch <= "z" for ch in c) / max(len(c), 1) for c in completions]


ONLY_E = dict(reward_funcs={"az": lowercase}, reward_weights={"rookworld": 0.0, "az": 1.0})


# ---------------------------------------------------------------------------- pure schedules
def test_warmup_beta_is_effective_at_the_step_it_names():
    c = BetaController(BetaSchedule("warmup", target=0.2, warmup_steps=3))
    assert [c.beta_for(k) for k in range(6)] == [0.0, 0.0, 0.0, 0.2, 0.2, 0.2]
    c = BetaController(BetaSchedule("constant", target=0.1))
    assert {c.beta_for(k) for k in range(5)} == {0.1}


def test_adaptive_controller_tracks_raw_kl_ppo_formula():
    c = BetaController(BetaSchedule("adaptive", target=0.1, target_kl=0.05, horizon=10, warmup_steps=1))
    assert c.beta_for(0) == 0.0 and c.beta_for(1) == 0.1
    c.observe(0, 99.0)                                  # warmup: controller idle
    assert c.beta_for(1) == 0.1
    c.observe(1, 0.06)                                  # KL > target: error 0.2 → ×(1 + 0.2/10)
    assert c.beta_for(2) == pytest.approx(0.1 * (1 + 0.2 / 10))
    c.observe(2, 0.0625)                                # error 0.25 clipped to 0.2
    assert c.beta_for(3) == pytest.approx(0.1 * 1.02 * 1.02)
    b = c.beta_for(3)
    c.observe(3, 0.045)                                 # below target: error −0.1 → falls
    assert c.beta_for(4) == pytest.approx(b * (1 - 0.1 / 10)) and c.beta_for(4) < b
    c.observe(4, float("nan"))                          # no KL → unchanged
    assert c.beta_for(5) == c.beta_for(4)
    # β·KL would be 0.1·0.06 = 0.006 < target → β would FALL; the controller must rise on raw KL
    c2 = BetaController(BetaSchedule("adaptive", target=0.1, target_kl=0.05))
    c2.observe(0, 0.06)
    assert c2.beta_for(1) > 0.1


def test_lr_schedules_documented_values():
    cfg = StepConfig(lr=1e-3)
    const = LRSchedule("constant").resolved(cfg, 10)
    assert [const.lr_at(k) for k in range(10)] == [1e-3] * 10
    lin = LRSchedule("linear").resolved(cfg, 10)
    assert [lin.lr_at(k) for k in range(10)] == pytest.approx([1e-3 * (1 - k / 10) for k in range(10)])
    cos = LRSchedule("cosine", min_lr=1e-4).resolved(cfg, 8)
    assert [cos.lr_at(k) for k in range(8)] == pytest.approx(
        [1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)])
    assert cos.lr_at(0) == pytest.approx(1e-3)         # step 0 uses lr_at(0) = base (no off-by-one)
    wc = LRSchedule("warmup_cosine", warmup_steps=2).resolved(cfg, 6)
    assert [wc.lr_at(k) for k in range(6)] == pytest.approx(
        [5e-4, 1e-3] + [1e-3 * 0.5 * (1 + math.cos(math.pi * (k - 2) / 4)) for k in range(2, 6)])
    assert LRSchedule("warmup_cosine").resolved(cfg, 30).warmup_steps == 3
    with pytest.raises(ConfigError):
        LRSchedule("bogus")
    with pytest.raises(ConfigError):
        BetaSchedule("adaptive", target=0.0).resolved(cfg)


def test_cursor_wraps_over_small_dataset():
    train, _ = _samples(5)
    cur = BatchCursor.fresh(train, "P", 2, seed=1)
    order = cur.order
    assert sorted(order) == list(range(5))
    seen = []
    for k in range(7):                                  # 14 prompts > 5 samples
        idx, epoch, c = cur.at(k)
        assert len(idx) == 2 and c == (2 * k) % 5 and epoch == (2 * k) // 5
        seen.extend(idx)
    assert seen == [order[i % 5] for i in range(14)]    # the order follows the cursor, wrapping mid-batch
    with pytest.raises(DataError):
        BatchCursor.fresh(train, "P", 6, seed=1)


def test_summary_stats_definitions():
    import pandas as pd
    ra = [0.1, 0.3, 0.2, 0.5]
    rb = [0.0, 0.1, 0.3, 0.2]
    t = pd.DataFrame({"step": range(4), "reward_before": rb, "reward_after": ra,
                      "delta_reward": [a - b for a, b in zip(ra, rb)], "reward_before_ci95": [0.01] * 4,
                      "reward_after_ci95": [0.02] * 4, "kl": [0.0] * 4, "kl_share": [0.0] * 4,
                      "grad_norm_pre_clip": [1.0] * 4, "beta": [0.1] * 4, "lr": [1e-3] * 4})
    s = summary_stats(t)
    assert (s["pos_steps"], s["neg_steps"], s["zero_steps"]) == (3, 1, 0)
    assert s["start_reward"] == 0.0 and s["end_reward"] == 0.5 and s["best_step"] == 3 and s["worst_step"] == 0
    d = [0.1, 0.2, -0.1, 0.3]
    sd = (sum((x - 0.125) ** 2 for x in d) / 3) ** 0.5
    assert s["mean_delta"] == pytest.approx(0.125) and s["mean_delta_ci95"] == pytest.approx(t975(3) * sd / 2)
    assert s["slope"] == pytest.approx(0.11) and math.isnan(s["ma10_slope"])


def test_summary_table_precision_and_short_runs():
    """Counts print as integers (no '1.000000 steps'), numbers at 4 significant digits, and a moving average
    over more steps than the run has says n/a and why instead of NaN."""
    import pandas as pd
    from rookworld_debug.viz import steps as vsteps
    ra, rb = [0.1, 0.3, 0.2, 0.5, 0.4], [0.0, 0.1, 0.3, 0.2, 0.45]
    t = pd.DataFrame({"step": range(5), "reward_before": rb, "reward_after": ra,
                      "delta_reward": [a - b for a, b in zip(ra, rb)], "reward_before_ci95": [0.01] * 5,
                      "reward_after_ci95": [0.02] * 5, "kl": [0.0, 1e-4, 2e-4, 3e-4, 1e-4], "kl_share": [math.nan] * 5,
                      "kl_grad_share": [0.0, 0.1, 0.2, 0.1, 0.3], "grad_norm_pre_clip": [1.0] * 5,
                      "beta": [0.1] * 5, "lr": [1e-5] * 5})
    tab = vsteps.summary_table(summary_stats(t))
    v = tab["value"]
    assert v["PosSteps (#Δ > 0)"] == "3" and v["NegSteps (#Δ < 0)"] == "2" and v["best step (max reward after)"] == "3"
    assert v["MA10 slope (last − first)/(n − 10)"] == "n/a: needs more than 10 steps (this run has 5)"
    assert "fewer than 20" in v["MA20 first window"] and v["final lr"] == "1e-05"
    assert v["mean KL share of gradient"] == "14%" and v["mean KL loss-value share (off-policy steps only)"] == "n/a"
    text = " ".join(tab.astype(str).values.ravel())
    assert "nan" not in text.lower().replace("n/a", "") and not re.search(r"\d\.\d{6}", text)


# ---------------------------------------------------------------------------- integration (tiny model)
def _fresh_loaded(model_dir):
    """A fresh policy/reference pair per run: runs update the policy in place."""
    return load_policy_and_reference(model_dir)


def test_fresh_run_cursor_beta_lr_recorded(model_dir):
    cfg = _config(model_dir)
    seen = []
    res = run_steps(cfg, 4, mode="fresh", samples=_samples(3), loaded=_fresh_loaded(model_dir), **ONLY_E,
                    beta_schedule=BetaSchedule("warmup", target=0.05, warmup_steps=2),
                    lr_schedule=LRSchedule("linear"), on_step=lambda row, tr: seen.append(row["step"]))
    t = res.table
    assert seen == [0, 1, 2, 3] and len(t) == 4 and len(res.traces) == 4
    assert list(t["beta"]) == [0.0, 0.0, 0.05, 0.05]
    assert list(t["lr"]) == pytest.approx([1e-3 * (1 - k / 4) for k in range(4)])
    assert [tr.config.beta for tr in res.traces] == [0.0, 0.0, 0.05, 0.05]
    assert [tr.update.lr for tr in res.traces] == pytest.approx(list(t["lr"]))
    order = BatchCursor.fresh(_samples(3)[0], "P", 2, cfg.seed).order
    assert [json.loads(x) for x in t["batch_indices"]] == [[order[(2 * k + j) % 3] for j in range(2)]
                                                          for k in range(4)]
    assert list(t["epoch"]) == [0, 0, 1, 2] and list(t["cursor"]) == [0, 2, 1, 0] and set(t["n_prompts"]) == {2}
    assert [tr.setup.batch.indices for tr in res.traces] == [tuple(json.loads(x)) for x in t["batch_indices"]]
    assert list(t["seed"]) == [step_seed(cfg.seed, k) for k in range(4)]
    assert t["kl"].iloc[0] == pytest.approx(0.0, abs=1e-6)          # step 0: policy = reference
    assert t["kl"].iloc[1] > 0 and t["kl_grad_share"].iloc[1] == 0.0  # β = 0 during warmup: no KL gradient
    assert t["kl_grad_share"].iloc[2] > 0 and t["kl_share"].isna().all()   # on-policy: no loss-VALUE share
    assert len(res.per_prompt) == 8
    s = res.summary()
    assert s["n_steps"] == 4 and s["pos_steps"] + s["neg_steps"] + s["zero_steps"] == 4
    # views render the records (no GRPO math): every figure carries the table's numbers
    from rookworld_debug.viz import steps as vsteps
    fig = vsteps.reward_curves_figure(t)
    assert list(fig.data[1].y) == pytest.approx(list(t["reward_after"])) and "same" in fig.layout.title.text.lower()
    assert list(vsteps.kl_share_figure(t).data[0].y) == pytest.approx([100 * x for x in t["kl_grad_share"]])
    sched = vsteps.schedule_figure(t)
    assert list(sched.data[0].y) == [0.0, 0.0, 0.05, 0.05] and sched.data[0].yaxis != sched.data[1].yaxis
    hm = vsteps.per_prompt_heatmap(res.per_prompt)
    assert len(hm.data[0].y) == 3 and len(hm.data[0].x) == 4          # 3 dataset prompts × 4 steps, gaps blank
    assert sum(v is None for row in hm.data[0].z for v in row) == 3 * 4 - 8
    assert "PosSteps (#Δ > 0)" in vsteps.summary_table(s).index


def test_adaptive_beta_rises_when_raw_kl_exceeds_target(model_dir):
    cfg = _config(model_dir, lr=1e-2)
    res = run_steps(cfg, 3, samples=_samples(4), loaded=_fresh_loaded(model_dir), **ONLY_E,
                    beta_schedule=BetaSchedule("adaptive", target=0.05, target_kl=1e-6, horizon=5))
    t = res.table
    b, kl = list(t["beta"]), list(t["kl"])
    assert b[0] == 0.05
    assert kl[0] < 1e-6 and b[1] == pytest.approx(0.05 * (1 - 0.2 / 5))   # step 0 KL = 0 < target → falls
    assert kl[1] > 1e-6 and b[2] == pytest.approx(b[1] * (1 + 0.2 / 5))   # raw KL above target → rises
    assert b[2] > b[1]


def test_resume_is_bit_identical(model_dir, tmp_path):
    cfg = _config(model_dir, lr=3e-3)
    kw = dict(mode="fresh", samples=_samples(5), beta_schedule=BetaSchedule("adaptive", target=0.05, target_kl=0.01),
              lr_schedule=LRSchedule("cosine"), **ONLY_E)
    full = run_steps(cfg, 4, loaded=_fresh_loaded(model_dir), checkpoint_every=2, checkpoint_dir=tmp_path / "ck",
                     **kw)
    assert [p.name for p in full.checkpoints] == ["step_00002", "step_00004"]
    resumed = run_steps(cfg, 4, loaded=_fresh_loaded(model_dir), resume_from=tmp_path / "ck" / "step_00002", **kw)
    assert len(resumed.traces) == 2 and resumed.resumed_from.endswith("step_00002")
    cols = [c for c in full.table.columns if not c.startswith("sec/")]
    a, b = full.table[cols], resumed.table[cols]
    assert a.equals(b), a.compare(b)
    assert full.per_prompt.equals(resumed.per_prompt)
    sa, sb = full.session.policy.state_dict(), resumed.session.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # another config cannot silently resume this checkpoint
    with pytest.raises(ConfigError):
        run_steps(cfg.replace(lr=1e-4), 4, loaded=_fresh_loaded(model_dir),
                  resume_from=tmp_path / "ck" / "step_00002", **kw)


def test_overfit_run_raises_rewarded_behaviour(model_dir):
    cfg = _config(model_dir, lr=3e-2, beta=0.0, num_generations=4)
    res = run_steps(cfg, 10, samples=_samples(4), loaded=_fresh_loaded(model_dir), **ONLY_E)
    t = res.table
    assert t["batch_hash"].nunique() == 1                               # the same prompts every step
    assert (t["reward_before"].iloc[1:].values == t["reward_after"].iloc[:-1].values).all()  # greedy, same weights
    roll = list(t["rollout_reward"])
    assert sum(roll[-3:]) / 3 > sum(roll[:3]) / 3 + 0.3, roll                # sampled reward climbs
    ma = [sum(roll[i:i + 3]) / 3 for i in range(len(roll) - 2)]
    assert ma[-1] == max(ma) and ma[-1] > ma[0] and ma[len(ma) // 2] > ma[0], ma    # rolling mean trend
    assert t["reward_after"].iloc[-1] > t["reward_before"].iloc[0] + 0.2, list(t["reward_after"])
    s = res.summary()
    assert s["slope"] > 0 and s["end_minus_start"] > 0.2


def test_cli_run_and_resume(model_dir, tmp_path, capsys):
    from rookworld_debug.cli_run import main
    args = ["--steps", "2", "--no-progress", "--mode", "fresh", "--lr-schedule", "linear",
            "--set", f"model={model_dir}", "--set", "reward_mode=dataset", "--set", "batch_size=2",
            "--set", "num_generations=2", "--set", "max_new_tokens=6", "--set", "eval_max_new_tokens=6",
            "--set", "heldout_n=0", "--set", "top_k_alternatives=0", "--set", "lr=1e-3"]
    assert main(args + ["--checkpoint-every", "1", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "step 1/2 batch " in out and "step 2/2 batch " in out and "PosSteps=" in out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["metrics"]["n_steps"] == 2 and summary["lr_schedule"]["kind"] == "linear"
    assert main(["--steps", "2", "--no-progress", "--out", str(tmp_path / "b"),
                 "--resume", str(tmp_path / "a" / "checkpoints" / "step_00001")]) == 0
    import pandas as pd
    a, b = (pd.read_csv(tmp_path / x / "table.csv") for x in "ab")
    cols = [c for c in a.columns if not c.startswith("sec/")]
    assert a[cols].equals(b[cols])
    assert main(["--steps", "2", "--set", "bogus=1"]) == 2


@pytest.mark.slow                       # notebook 03 under papermill
def test_notebook_runs_under_papermill_and_writes_summary(model_dir, tmp_path):
    """notebooks/03_multi_step.ipynb: parameters cell first, committed without outputs, papermill-runnable,
    writes summary.json with headline metrics for `rookworld-debug report`."""
    from pathlib import Path

    import nbformat
    import papermill as pm
    nb_path = Path(__file__).parents[1] / "notebooks" / "03_multi_step.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []) and "run_dir = None" in code[0].source
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    pm.execute_notebook(str(nb_path), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False,
                        parameters=dict(model=model_dir, steps=2, max_new_tokens=6, eval_max_new_tokens=6,
                                        heldout_n=0, beta_schedule="warmup", beta_warmup_steps=1,
                                        run_dir=str(tmp_path)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"start_reward", "end_reward", "pos_steps", "neg_steps", "mean_kl_share"} <= set(summary["metrics"])
    assert (tmp_path / "table.csv").exists()
    # what a reader sees: every column (no "…"), full definitions, completions per step, sane precision
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    html = "\n".join(o["data"]["text/html"] for c in out.cells for o in c.get("outputs", [])
                      if "text/html" in o.get("data", {}))
    for col in ("kl_grad_share", "grad_norm_post_clip", "sec/total", "heldout_reward_after"):
        assert f">{col}</th>" in html, col
    assert "…</th>" not in html and "...</th>" not in html
    assert html.count('class="rw-completions"') == 2                    # steps 0 and 1 (first and last)
    assert "1.000000" not in html and ">nan<" not in html.lower()
    assert "n/a: needs more than 10 steps (this run has 2)" in html
    from rookworld_debug.grpo.multistep.loop import TABLE_COLUMNS
    assert TABLE_COLUMNS["kl_share"].replace("&", "&amp;")[:60].replace("<", "&lt;").replace(">", "&gt;") in html
