"""Property tests (hypothesis) for the edges of each input class: trace versions, integer options, `--set` values,
recorder pieces. Each property states what must hold for EVERY input of the class, not for one case."""
from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from tinymodels import saved_minimal_step
    return saved_minimal_step(tmp_path_factory.mktemp("p") / "step")


@SETTINGS
@given(st.one_of(st.integers(min_value=-10**6, max_value=10**6), st.booleans(), st.text(max_size=4), st.none(),
                 st.floats(allow_nan=True)))
def test_only_the_versions_this_package_wrote_load(recorded, tmp_path_factory, version):
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.step import TRACE_VERSION, StepTrace
    folder = tmp_path_factory.mktemp("v") / "t"
    shutil.copytree(recorded[0], folder)
    payload = json.loads((folder / "trace.json").read_text())
    payload["fields"]["version"] = version
    (folder / "trace.json").write_text(json.dumps(payload))
    ok = isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= TRACE_VERSION
    if ok:
        assert StepTrace.load(folder).version == version
    else:
        with pytest.raises(TraceError):
            StepTrace.load(folder)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_an_integer_option_takes_exactly_the_integers_in_its_range(text):
    from rookworld_debug.cliargs import MAX_THREADS, threads
    try:
        v = int(text, 10)
    except ValueError:
        v = None
    if v is not None and 1 <= v <= MAX_THREADS:
        assert threads(text) == v
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            threads(text)


@pytest.mark.parametrize("env, expected", [(None, 2), ("1", 1), ("4", 4), ("0", 2), ("-3", 2), ("two", 2),
                                           ("", 2), ("99999999", 2)])
def test_the_threads_default_follows_omp_num_threads_where_it_is_a_count(monkeypatch, env, expected):
    """--threads of whatif, measure and verify-capture: OMP_NUM_THREADS when it is a usable count, else 2."""
    from rookworld_debug.cliargs import default_threads
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert default_threads() == expected


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["lr", "beta", "epsilon_low", "max_grad_norm", "num_generations"]),
       st.one_of(st.text(max_size=8), st.floats(allow_nan=False, allow_infinity=False).map(repr)))
def test_a_set_value_is_a_number_or_named_before_anything_loads(key, text):
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.whatif.overrides import parse_sets
    if not text.strip() or "=" in text:
        return
    try:
        out = parse_sets([f"{key}={text}"])
    except ConfigError as err:
        assert key in str(err)
    else:
        v = out[key]
        assert v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


@SETTINGS
@given(st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=6))
def test_recorder_pieces_of_another_shape_are_named(recorded, n_rows, t):
    from rookworld_debug.errors import DataError
    from tinymodels import minimal_recorder
    rec = minimal_recorder(recorded[1])
    rec.logprobs(torch.zeros(n_rows, t))
    if (n_rows, t) == (2, 3):
        assert rec.build().rollout.per_token_logps.shape == (2, 3)
    else:
        with pytest.raises(DataError, match="policy_logps: shape"):
            rec.build()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({k: st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.none())
                                       for k in ("loss", "kl", "reward", "entropy", "grad_norm", "learning_rate",
                                                 "frac_reward_zero_std")}), min_size=0, max_size=40))
def test_every_run_check_reads_any_finite_log_without_failing(entries):
    """Any finite numbers in a run log, up to the float range's ends (±1.8e308): every run check runs (no
    check_failed finding, no overflow), whatever it concludes."""
    import warnings

    from rookworld_debug.diagnosis.registry import diagnose_run
    log = [{"step": i + 1, **{k: v for k, v in e.items() if v is not None}} for i, e in enumerate(entries)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)       # numpy's overflow warnings would be printed to the user
        found = diagnose_run(log)
    assert not [f for f in found if f.code == "check_failed"], [f.cause for f in found if f.code == "check_failed"]
