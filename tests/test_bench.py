"""Smoke test of `rookworld-debug bench`: runs every variant once on a tiny model and checks the JSON
schema (keys for every variant, ratios present, numbers finite). No timing assertions."""
import json
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from rookworld_debug.lab import bench

pytestmark = pytest.mark.skipif(shutil.which("stockfish") is None and not any(
    __import__("os").path.exists(p) for p in ("/usr/games/stockfish", "/usr/local/bin/stockfish")),
    reason="Stockfish not installed")

SMALL = ["-B", "2", "-G", "2", "--max-new-tokens", "6", "--engine-depth", "1", "--heldout-n", "1",
         "--eval-max-new-tokens", "6", "--reps", "1", "--warmup", "0", "--threads", "1",
         "--widget-n", "8", "--widget-t", "16"]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = bench.main(SMALL + ["--isolate", "none", "--out", str(out), "--json-only", "--variants", "abcdefghij"])
    assert rc == 0
    files = sorted(out.glob("bench-*.json"))
    assert len(files) == 1 and (out / "latest-tiny.json").is_file()
    return json.loads(files[0].read_text())


def test_schema_top_level(result):
    assert result["schema"] == bench.SCHEMA
    for key in ("started", "command", "machine", "model_info", "settings", "variants", "ratios", "ratios_min",
                "targets", "engine", "engine_sets", "widget", "runs", "total_seconds"):
        assert key in result, key
    assert result["settings"]["variants"] == list("abcdefghij")
    assert result["saved_step"]["seconds"] > 0                     # (b)'s step, saved once for (g), (i), (j)
    assert result["settings"]["step_config"]["num_generations"] == 2


def test_every_variant_measured(result):
    for v in "abcdef":
        s = result["variants"][v]
        assert s["runs"] == 1 and s["errors"] == [], (v, s["errors"])
        for key in ("median_seconds", "peak_rss_mb", "peak_rss_delta_mb", "maxrss_process_mb"):
            assert _finite(s[key]), (v, key, s[key])
        assert s["median_phases"] and all(_finite(x) for x in s["median_phases"].values()), v
        assert s["median_tokens_generated"] > 0, v
    assert _finite(result["variants"]["d"]["median_seconds_core"])
    assert set(result["variants"]["a"]["median_phases"]) == {"generation", "rewards", "advantages", "loss", "update"}
    assert {"baseline_eval", "evaluation", "update"} <= set(result["variants"]["b"]["median_phases"])
    assert "diagnostics" in result["variants"]["e"]["median_phases"]          # (e) = (b) + the diagnostics
    f = result["variants"]["f"]                                                # (f) = (c) + the flight recorder
    assert f["median_capture_seconds"] > 0 and f["median_held_bytes"] > 0 and f["median_write_one_step_seconds"] > 0
    assert 0 < f["median_recorder_share"] < 1


def test_tools_measured(result):
    """(g)–(j): the diagnosis and what-if tools on (b)'s saved step, with what each produced."""
    runs = {v: result["runs"][v][0] for v in "ghij"}
    for v in "ghij":
        s = result["variants"][v]
        assert s["runs"] == 1 and s["errors"] == [], (v, s["errors"])
        assert _finite(s["median_seconds"]) and _finite(s["min_seconds"]) and _finite(s["peak_rss_mb"]), v
        assert s["median_phases"] and all(_finite(x) for x in s["median_phases"].values()), v
        assert abs(sum(s["median_phases"].values()) - s["median_seconds"]) < 0.05 * s["median_seconds"] + 0.01, v
        assert v in result["descriptions"] and "rookworld-debug" in result["descriptions"][v]
    assert runs["g"]["findings"] and runs["g"]["json_chars"] > 0         # the step checks ran on the loaded trace
    assert "kl_runaway" in runs["h"]["findings"] and runs["h"]["log_steps"] == 10_000   # the built log's runaway
    assert runs["i"]["arms"] == 5 and runs["i"]["self_check"] is True and runs["i"]["branch_steps"] == 0
    assert runs["j"]["arms"] == 2 and runs["j"]["branch_steps"] == 3 and runs["j"]["seeds"] == 1
    assert runs["j"]["self_check"] is True and runs["j"]["verdicts"]
    assert 0 < runs["j"]["branch_seconds"] < result["variants"]["j"]["median_seconds"]
    r = result["ratios"]
    assert r["i/(5·b)"] == pytest.approx(r["i/c"] / r["b/c"] / 5)
    assert r["h_seconds_per_1000_steps"] == pytest.approx(r["h_seconds"] / 10)


def test_ratios_and_targets(result):
    for name in ("a/c", "b/c", "d/a", "d_full/b", "b_without_eval/c", "e/c", "b/a", "f/c", "recorder_share",
                 "g/c", "h_seconds", "h_seconds_per_1000_steps", "i/c", "i/(5·b)", "j/c", "j/(k·arms·b)",
                 "j_branch/(k·arms·b)"):
        assert _finite(result["ratios"][name]) and result["ratios"][name] > 0, name
    assert set(result["targets"]) == set(bench.TARGETS)
    for name in ("a/c", "b/c", "d/a", "widget_ms"):
        t = result["targets"][name]
        assert _finite(t["value"]) and t["met"] in (True, False), name
    assert result["targets"]["peak_rss_gb_124m"]["value"] is None      # only measured with --model gpt2-124m


def test_engine_and_widget(result):
    e = result["engine"]
    assert e["identical_rewards"] is True                       # cache/pool never changes a reward
    assert _finite(e["cached_pool_seconds"]) and _finite(e["uncached_sequential_seconds"])
    assert e["uncached_sequential"]["searches"] >= e["cached_pool"]["searches"] > 0
    assert _finite(e["speedup"])
    w = result["widget"]
    assert w["n"] == 8 and w["t"] == 16 and _finite(w["median_ms"])


def test_markdown_renders(result):
    text = bench.markdown(result)
    assert "| (a) ours, core step |" in text and "a/c" in text and "Widget" in text


def test_trl_settings_cover_equivalence():
    """The TRL config of (c) pins every setting that differs from TRL's defaults or matters for equivalence."""
    spec = bench.BenchSpec(model_dir="x", batch_size=4, num_generations=8)
    kw = bench.trl_config_kwargs(spec.step_config(), spec, "/tmp/x")
    assert kw["per_device_train_batch_size"] == 32 and kw["gradient_accumulation_steps"] == 1
    assert kw["num_generations"] == 8 and kw["num_iterations"] == 1 and kw["max_steps"] == 1
    assert kw["top_k"] == 0 and kw["bf16"] is False and kw["disable_dropout"] is True
    assert kw["gradient_checkpointing"] is False and kw["beta"] == 0.1 and kw["loss_type"] == "dapo"
    from trl import GRPOConfig
    cfg = GRPOConfig(**kw)                                      # every key is a real GRPOConfig field
    assert cfg.generation_batch_size == 32


def _cli(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "rookworld_debug.cli", "bench", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_prices_the_diagnosis_tools(tmp_path):
    """`rookworld-debug bench --variants gh` as a user runs it: both tools timed, (h) in seconds, no (c) to
    divide (g) by, so g/c is null rather than a made-up number."""
    r = _cli(*SMALL, "--variants", "gh", "--isolate", "none", "--engine-reps", "0", "--no-widget",
             "--out", str(tmp_path), "--json-only")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(Path(r.stdout.strip().splitlines()[-1]).read_text())
    assert data["settings"]["variants"] == ["g", "h"] and set(data["variants"]) == {"g", "h"}
    for v in "gh":
        assert data["variants"][v]["errors"] == [] and _finite(data["variants"][v]["median_seconds"]), v
    assert _finite(data["ratios"]["h_seconds"]) and _finite(data["ratios"]["h_seconds_per_1000_steps"])
    assert data["ratios"]["g/c"] is None and data["ratios"]["i/c"] is None


@pytest.mark.parametrize("args", [["--variants", "abz"], ["--variants", "gg"], ["--variants", ""],
                                  ["--profile", "z"]])
def test_cli_bad_variants_one_line_exit_2(tmp_path, args):
    r = _cli(*args, "--out", str(tmp_path), timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rookworld-debug bench: error: ConfigError: --"), r.stderr
    assert "abcdefghij" in lines[0] and "Traceback" not in r.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.slow
def test_process_isolation_path(tmp_path):
    """The default path: one worker process per variant, answers over the line protocol."""
    rc = bench.main(SMALL + ["--variants", "acg", "--isolate", "process", "--engine-reps", "0", "--no-widget",
                             "--out", str(tmp_path), "--json-only"])
    assert rc == 0
    data = json.loads((tmp_path / "latest-tiny.json").read_text())
    assert data["settings"]["isolate"] == "process"
    assert _finite(data["ratios"]["g/c"])          # (g)'s worker read the step the parent saved
    for v in "acg":
        s = data["variants"][v]
        assert s["errors"] == [] and _finite(s["median_seconds"]) and _finite(s["peak_rss_mb"])
    assert _finite(data["ratios"]["a/c"]) and "engine" not in data and "widget" not in data


def test_profile_mode_writes_operator_breakdown(tmp_path):
    """`bench --profile a`: one step under torch.profiler; JSON with phases and the top operators by self time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = bench.main(SMALL + ["--profile", "a", "--out", str(tmp_path), "--json-only"])
    assert rc == 0
    files = sorted(tmp_path.glob("profile-tiny-a-*.json"))
    assert len(files) == 1
    prof = json.loads(files[0].read_text())
    assert prof["variant"] == "a" and set(prof["phases"]) >= {"generation", "update"}
    assert prof["top_ops"] and all(o["self_s"] >= 0 and 0 <= o["share"] <= 1 for o in prof["top_ops"])
    assert any(o["name"].startswith("aten::") for o in prof["top_ops"])
    assert "loadavg_1m_runs" not in prof["machine"]           # the profile is one step, not the benchmark
