"""`rookworld-debug diagnose` on hostile input, as a user runs it (subprocess, stdin closed, timeout): a number
too large for a float, JSON nested deeper than any parser's recursion, a table with non-UTF-8 bytes or a field past
csv's size limit, a run folder whose name is not UTF-8 (strict locale). Exit 2 with one named line for bad input,
never exit 1 (the CI gate's "an error-level finding") for a failure; the --json output is ASCII-escaped JSON.
The run-level checks are linear in the log's length (the sign test in log space, checked against exact values)."""
from __future__ import annotations

import json
import math
import os
import random

import pytest
from cli import ENV, run_cli


def _history(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [{"step": s, "loss": 0.1, "reward": 0.5 + rng.gauss(0, 0.1), "kl": 0.01, "entropy": 1.0,
             "grad_norm": 0.3, "learning_rate": 1e-5} for s in range(1, n + 1)]


def _named_bad_input(r, *words):
    err = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and len(err) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-1500:])
    assert "bad input" in err[0] and all(w in err[0] for w in words), err
    return err[0]


def test_a_401_digit_number_in_the_log_is_skipped_not_a_crash(tmp_path):
    hist = _history(30)
    hist[3]["reward"] = 10 ** 400
    hist[4]["step"] = 10 ** 400                   # a step past any run's: left out
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": hist}))
    r = run_cli("diagnose", tmp_path, "--json", timeout=120)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr[-1500:]
    d = json.loads(r.stdout)
    assert isinstance(d["findings"], list)


@pytest.mark.parametrize("where", ["trainer_state.json", "captures/captures.json"])
def test_json_nested_200k_levels_is_bad_input(tmp_path, where):
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    if where != "trainer_state.json":
        (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": _history(5)}))
    (tmp_path / where).write_text("[" * 200_000 + "]" * 200_000)
    _named_bad_input(run_cli("diagnose", tmp_path, timeout=120), "DataError", "nested too deeply")


@pytest.mark.parametrize("body, words", [
    (b"step,rollout_reward\n0,0.5\n1,\xff\xfe\n", "UnicodeDecodeError"),
    (b"step,rollout_reward\n0,0.5\n1," + b"x" * 200_000 + b"\n", "field larger than field limit"),
])
def test_a_table_that_cannot_be_read_is_bad_input(tmp_path, body, words):
    (tmp_path / "table.csv").write_bytes(body)
    _named_bad_input(run_cli("diagnose", tmp_path, timeout=120), "DataError", "table.csv", words)


@pytest.mark.parametrize("encoding", ["utf-8:strict", "utf-8:surrogateescape"])
def test_a_non_utf8_folder_name_gives_ascii_json_under_any_locale(tmp_path, encoding):
    run = os.path.join(os.fsencode(tmp_path), b"run\xff\xfe")
    os.makedirs(run)
    with open(os.path.join(run, b"trainer_state.json"), "w") as fh:
        json.dump({"log_history": _history(30)}, fh)
    import subprocess
    from cli import CLI
    for extra in ([b"--json"], []):
        r = subprocess.run([os.fsencode(CLI), b"diagnose", run, *extra], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=120, env={**ENV, "PYTHONIOENCODING": encoding})
        assert r.returncode in (0, 1) and b"Traceback" not in r.stderr, r.stderr[-1500:]
        if extra:
            r.stdout.decode("ascii")                                   # ASCII-escaped: no raw byte
            d = json.loads(r.stdout)
            assert d["path"].endswith("run\\xff\\xfe") and d["findings"]


def test_a_missing_path_is_bad_input_and_exit_1_means_an_error_finding(tmp_path):
    _named_bad_input(run_cli("diagnose", tmp_path / "nope", timeout=120), "does not exist")
    hist = [{"step": s, "loss": 0.1, "kl": 0.001 if s < 8 else 10.0, "learning_rate": 1e-5 if s < 7 else 0.1,
             "reward": 0.0} for s in range(1, 12)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": hist}))
    r = run_cli("diagnose", tmp_path, "--json", timeout=120)
    assert r.returncode == 1 and any(f["severity"] == "error" for f in json.loads(r.stdout)["findings"])


# ---------------------------------------------------------------------------------------- linear in the log
def _exact_sign_p(up: int, down: int) -> float:
    n, k = up + down, min(up, down)
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def test_the_sign_test_matches_exact_binomials_on_small_n():
    from rookworld_debug.diagnosis.checks_run import _sign_test_p
    worst = 0.0
    for n in range(0, 120):
        for up in range(n + 1):
            exact = _exact_sign_p(up, n - up)
            got = _sign_test_p(up, n - up)
            assert 0.0 <= got <= 1.0
            if exact > 1e-300:
                worst = max(worst, abs(got - exact) / exact)
    assert worst < 1e-9, worst                                         # relative tolerance 1e-9


def test_the_sign_test_on_ten_million_flips_is_immediate():
    """The exact form sums k + 1 big-integer binomials (about n^2.7: 7 s at n = 10,000, hours at 10^7); the
    log-space sum stops once a term no longer changes it. A generous bound, not a timing: 10 s."""
    import time

    from rookworld_debug.diagnosis.checks_run import _sign_test_p
    t0 = time.perf_counter()
    p = _sign_test_p(4_995_000, 5_005_000)
    assert time.perf_counter() - t0 < 10
    z = (10_000 - 1) / math.sqrt(10_000_000)                           # continuity-corrected normal approximation
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-2)


def test_a_100k_step_log_is_diagnosed(tmp_path):
    """100,000 logged steps through every run check (the exact sign test alone took minutes at 20,000)."""
    from rookworld_debug.diagnosis import diagnose_run
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": _history(100_000)}))
    found = diagnose_run(tmp_path)
    nt = [f for f in found if f.code == "no_net_trend"]
    assert nt and {e.name for e in nt[0].evidence} >= {"up_steps", "down_steps", "sign_test_p"}
