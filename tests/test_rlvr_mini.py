"""Every golden case of the rookworld-rlvr "mini" math (tests/fixtures/rookworld/rlvr_mini_golden.json): KL forms,
grpo_loss (value, metrics, gradient), prompt mask, advantages (all baselines, EMA sequences, GAE) in float64
and float32, the adaptive KL controller, the value head and compute_log_probs (table model, pipeline, the
mini's own GPT-2). Tolerances: float64 ≤ 1e-9 relative, float32 ≤ 1e-5. The module-level COUNTS/MAX_ERR are
filled as the cases run and checked by the last test."""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.families.rlvr_mini import baselines as B
from rookworld_debug.grpo.families.rlvr_mini import objective as M
from rookworld_debug.grpo.families.rlvr_mini.model import mini_forward
from tests.rlvr_golden import golden, number, tensor, tol_ok

COUNTS: dict = defaultdict(int)
MAX_ERR: dict = defaultdict(float)


def check(family: str, got, exp, dtype, what: str) -> None:
    ok, err = tol_ok(got, exp, dtype)
    key = f"{family}/{str(dtype).replace('torch.', '')}"
    MAX_ERR[key] = max(MAX_ERR[key], err)
    assert ok, f"{family} {what}: error {err:.3g}"


def _opt(spec):
    return None if spec is None else tensor(spec) if isinstance(spec, dict) else torch.tensor(spec, dtype=torch.float64)


def test_kl_divergence_cases():
    cases = {c["id"]: c for c in golden()["compute_kl_divergence"]}
    for c in cases.values():
        i = c["inputs"]
        if "raises" in c["outputs"]:
            src = cases[i["same_tensors_as"]]["inputs"]
            with pytest.raises(ValueError):
                M.kl_divergence(tensor(src["policy_log_probs"]), tensor(src["ref_log_probs"]),
                                tensor(src["completion_mask"]), i["kl_type"])
            COUNTS["compute_kl_divergence"] += 1
            continue
        p, q, m = (tensor(i[k]) for k in ("policy_log_probs", "ref_log_probs", "completion_mask"))
        for kl_type, exp in c["outputs"].items():
            got = M.kl_divergence(p, q, m, kl_type)
            assert got.dtype == p.dtype
            check("compute_kl_divergence", got, tensor(exp), p.dtype, f"{c['id']} {kl_type}")
        COUNTS["compute_kl_divergence"] += 1
    assert COUNTS["compute_kl_divergence"] == 6


def _grpo_call(i, p):
    kw = dict(kl_coef=i["kl_coef"], clip_range=i["clip_range"], kl_type=i["kl_type"],
              values=_opt(i["values"]), value_targets=_opt(i["value_targets"]),
              value_loss_coef=i["value_loss_coef"], entropy_coef=i["entropy_coef"])
    if kw["values"] is not None:
        kw["values"] = kw["values"].to(p.dtype).requires_grad_(True)
    return M.grpo_loss(p, tensor(i["ref_log_probs"]), tensor(i["advantages"]), tensor(i["prompt_mask"]), **kw), kw


def test_grpo_loss_cases():
    for c in golden()["grpo_loss"]:
        i, o = c["inputs"], c["outputs"]
        p = tensor(i["policy_log_probs"]).requires_grad_(True)
        if "raises" in o:
            with pytest.raises(ValueError):
                _grpo_call(i, p)
            COUNTS["grpo_loss"] += 1
            continue
        (total, metrics), kw = _grpo_call(i, p)
        check("grpo_loss", total.detach(), tensor(o["total_loss"]), p.dtype, f"{c['id']} total")
        assert set(metrics) == set(o["metrics"]), c["id"]
        for k, v in o["metrics"].items():
            check("grpo_loss", [metrics[k]], [number(v)], torch.float64 if k in ("clipped_frac", "ratio_outliers")
                  else p.dtype, f"{c['id']} {k}")
        wrt = [p] + ([kw["values"]] if "grad_values" in o else [])
        grads = torch.autograd.grad(total, wrt)
        check("grpo_loss", grads[0], tensor(o["grad_policy_log_probs"]), p.dtype, f"{c['id']} grad")
        if "grad_values" in o:
            check("grpo_loss", grads[1], tensor(o["grad_values"]), p.dtype, f"{c['id']} grad values")
        COUNTS["grpo_loss"] += 1
    assert COUNTS["grpo_loss"] == 17


def test_create_prompt_mask_cases():
    for c in golden()["create_prompt_mask"]:
        got = M.create_prompt_mask(c["inputs"]["input_ids_shape"], c["inputs"]["prompt_lengths"])
        exp = tensor(c["outputs"]["prompt_mask"])
        assert got.dtype == exp.dtype and torch.equal(got, exp), c["id"]
        COUNTS["create_prompt_mask"] += 1
    assert COUNTS["create_prompt_mask"] == 3


def _adv_inputs(i, dtype):
    vals = i.get("values")
    return dict(group_size=i["group_size"], baseline_type=i["baseline_type"],
                values=None if vals is None else torch.tensor(vals, dtype=torch.float64).to(dtype),
                use_gae=i.get("use_gae", False), gae_lambda=i.get("gae_lambda", 0.95))


def test_compute_advantages_cases():
    for c in golden()["compute_advantages"]:
        i, o = c["inputs"], c["outputs"]
        for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
            kw = _adv_inputs(i, dtype)
            if "batches" in i:                       # EMA sequences: one tracker across calls
                tracker = None if i["baseline_tracker_initial"] is None else dict(i["baseline_tracker_initial"])
                for call, exp in zip(i["batches"], o[name]):
                    got = B.compute_advantages(torch.tensor(call, dtype=torch.float64).to(dtype),
                                               baseline_tracker=tracker, **kw)
                    check("compute_advantages", got, tensor(exp["advantages"]), dtype, f"{c['id']} {name}")
                    if tracker is not None:
                        assert tracker["count"] == exp["tracker_after"]["count"]
                        check("compute_advantages", [tracker["ema_baseline"]],
                              [exp["tracker_after"]["ema_baseline"]], torch.float64, f"{c['id']} tracker")
            else:
                got = B.compute_advantages(torch.tensor(i["rewards"], dtype=torch.float64).to(dtype), **kw)
                assert got.dtype == dtype
                check("compute_advantages", got, tensor(o[name]), dtype, f"{c['id']} {name}")
        COUNTS["compute_advantages"] += 1
    assert COUNTS["compute_advantages"] == 21


def test_adaptive_kl_controller_cases():
    n_updates = 0
    for c in golden()["adaptive_kl_controller"]:
        i = c["inputs"]
        ctl = B.AdaptiveKLController(i["init_kl_coef"], i["target_kl"], i["horizon"])
        for x, step in zip(i["observed_kl_sequence"], c["outputs"]["steps"]):
            coef = ctl.update(x)
            check("adaptive_kl_controller", [coef], [step["kl_coef_after"]], torch.float64, c["id"])
            assert len(ctl.history) == step["history_len"], c["id"]
            n_updates += 1
        COUNTS["adaptive_kl_controller"] += 1
    assert COUNTS["adaptive_kl_controller"] == 7 and n_updates == 189


def test_value_function_case():
    c = golden()["value_function"][0]
    w = c["inputs"]["weights"]
    vf = B.ValueFunction(4).double()
    vf.load_state_dict({k: tensor(v) for k, v in w.items()})
    got = vf(tensor(c["inputs"]["hidden_states"])).detach()
    check("value_function", got, tensor(c["outputs"]["values"]), torch.float64, c["id"])
    COUNTS["value_function"] += 1


def _table_logits(table, ids):
    return table[ids]


def test_compute_log_probs_cases():
    lp = golden()["compute_log_probs"]
    tables = {"policy_table": torch.tensor(lp["table_model"]["policy_table"], dtype=torch.float64),
              "reference_table": torch.tensor(lp["table_model"]["reference_table"], dtype=torch.float64)}
    g = lp["gpt2_tiny_model"]
    gw = {k: tensor(v) for k, v in g["weights"].items()}
    for c in lp["cases"]:
        i, o = c["inputs"], c["outputs"]
        ids = torch.tensor(i["input_ids"])
        am = torch.tensor(i["attention_mask"])
        if c["id"].startswith("lp_table"):
            logits = _table_logits(tables[i["model"]], ids)
            for key in ("with_mask", "with_mask_chunk_size_2", "with_mask_detach"):
                check("compute_log_probs", M.compute_log_probs(logits, ids, am), tensor(o[key]), torch.float64, key)
            check("compute_log_probs", M.compute_log_probs(logits, ids), tensor(o["without_mask"]), torch.float64,
                  "without_mask")
        elif c["id"].startswith("lp_pipeline"):
            _pipeline_case(tables, ids, am, i, o)
        else:
            n_layer, n_head = g["config"]["n_layer"], g["config"]["n_head"]
            logits = mini_forward(gw, ids, n_layer=n_layer, n_head=n_head, attention_mask=am)
            check("compute_log_probs", logits, tensor(o["logits_with_mask"]), torch.float64, f"{c['id']} logits")
            check("compute_log_probs", M.compute_log_probs(logits, ids, am), tensor(o["with_mask"]), torch.float64,
                  f"{c['id']} with_mask")
            nomask = mini_forward(gw, ids, n_layer=n_layer, n_head=n_head)
            check("compute_log_probs", M.compute_log_probs(nomask, ids), tensor(o["without_mask"]), torch.float64,
                  f"{c['id']} without_mask")
        COUNTS["compute_log_probs"] += 1
    assert COUNTS["compute_log_probs"] == 6


def _pipeline_case(tables, ids, am, i, o):
    pol = tables["policy_table"].clone().requires_grad_(True)
    p = M.compute_log_probs(_table_logits(pol, ids), ids, am)
    q = M.compute_log_probs(_table_logits(tables["reference_table"], ids), ids, am)
    pm = M.create_prompt_mask(ids.shape, i["prompt_lengths"]).to(torch.float64)
    check("compute_log_probs", p.detach(), tensor(o["policy_log_probs"]), torch.float64, "pipeline policy")
    check("compute_log_probs", q, tensor(o["ref_log_probs"]), torch.float64, "pipeline ref")
    assert torch.equal(pm.float(), tensor(o["prompt_mask"]).float())
    total, metrics = M.grpo_loss(p, q, torch.tensor(i["advantages"], dtype=torch.float64), pm)
    check("compute_log_probs", total.detach(), tensor(o["total_loss"]), torch.float64, "pipeline total")
    for k, v in o["metrics"].items():
        check("compute_log_probs", [metrics[k]], [number(v)], torch.float64, f"pipeline {k}")
    grad, = torch.autograd.grad(total, pol)
    check("compute_log_probs", grad, tensor(o["grad_policy_table"]), torch.float64, "pipeline grad table")


def test_zz_counts_and_max_errors(capsys):
    """Runs last in this file (alphabetical order within the module is definition order): every family ran."""
    expected = {"compute_kl_divergence": 6, "grpo_loss": 17, "create_prompt_mask": 3, "compute_advantages": 21,
                "adaptive_kl_controller": 7, "value_function": 1, "compute_log_probs": 6}
    if dict(COUNTS) != expected:
        pytest.skip("run with the whole module to get the counts")
    with capsys.disabled():
        print("\nrlvr mini golden cases:", dict(COUNTS))
        print("max error (relative; float32 rel-or-abs):", {k: f"{v:.2e}" for k, v in sorted(MAX_ERR.items())})


def test_invalid_kl_type_is_a_named_error():
    with pytest.raises(ConfigError, match="rlvr_kl_type"):
        M.per_token_kl_terms(torch.zeros(1, 2), torch.zeros(1, 2), "k3")
