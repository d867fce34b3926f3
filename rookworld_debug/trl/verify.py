"""What `rookworld-debug verify-capture` computes (its arguments: `trl.verify_cli`): the captured step's update
applied again from the `--before` checkpoint and the captured batch alone, compared layer by layer with `--after`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rookworld_debug.errors import CheckpointError, TraceError

from .tolerances import ATOL, RTOL, check_tolerances


@dataclass(frozen=True)
class LayerCheck:
    layer: str
    max_abs_diff: float          # max |θ_replayed − θ_after|
    max_abs_update: float        # max |θ_after − θ_before| (the true update's size)
    rel: float                   # ‖θ_replayed − θ_after‖₂ / ‖θ_after − θ_before‖₂ (what the tolerance gates)
    ok: bool


@dataclass(frozen=True)
class VerifyResult:
    step: int
    before_step: int | None      # global_step in the --before checkpoint's trainer_state.json
    after_step: int | None
    grad_norm_replayed: float    # pre-clip, from the replayed backward
    grad_norm_captured: float    # pre-clip, as TRL's Trainer computed it
    layers: tuple                # LayerCheck per layer, worst first
    ok: bool
    notes: tuple


def _checkpoint_step(folder: Path) -> int | None:
    try:
        return int(json.loads((folder / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _load_weights(folder: Path):
    from transformers import AutoModelForCausalLM
    from rookworld_debug.models.custom_code import refuse_custom_code
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not a checkpoint folder (no config.json)")
    refuse_custom_code(folder, CheckpointError)      # its config.json and tokenizer_config.json alike
    try:
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True,
                                                    trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - any loader failure names the folder
        raise CheckpointError(f"{folder}: the weights cannot be loaded ({type(err).__name__}: {err})") from None


def _check_model_of(model, trace, folder: Path) -> None:
    """CheckpointError unless the checkpoint holds the captured model: its parameter count (provenance) and a
    vocabulary that covers every captured token id."""
    prov = trace.setup.provenance if trace.setup is not None else {}
    want = prov.get("num_parameters") if isinstance(prov, dict) else None
    have = sum(p.numel() for p in model.parameters())
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = [t for t in (trace.rollout.prompt_ids, trace.rollout.completion_ids) if t.numel()]
    top = max((int(t.max()) for t in ids), default=-1)
    if (isinstance(want, int) and want != have) or top >= vocab:
        raise CheckpointError(f"{folder} holds another model than the captured step's ({have:,} parameters, "
                              f"vocabulary {vocab}; the capture: {want if want is not None else '?'} parameters, "
                              f"token ids up to {top})")


def _optimizer(model, cfg: dict, lr: float) -> torch.optim.Optimizer:
    """AdamW with the Trainer's two groups (decay / no decay) in its parameter order."""
    from transformers import Trainer
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": float(cfg.get("weight_decay", 0.0))},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    fused = "fused" in str(cfg.get("optim", ""))
    return torch.optim.AdamW(groups, lr=lr, betas=(float(cfg.get("adam_beta1", 0.9)), float(cfg.get("adam_beta2", 0.999))),
                             eps=float(cfg.get("adam_epsilon", 1e-8)), fused=fused or None)


def trl_logps_and_entropy(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float):
    """Per-token log-probs and entropies as TRL 1.16's GRPOTrainer computes them for the loss: one forward of
    prompt + completion with the attention mask only (no position ids: left-padded rows get the model's
    default positions, unlike grpo.phases.generation, so the replay must do the same), logits / temperature in fp32."""
    ids = torch.cat([prompt_ids, completion_ids], 1)                                   # (n, P+T)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    t = completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -t - 1:-1].float() / temperature   # (n, T, V)
    logp_all = torch.log_softmax(logits, -1)
    logps = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)             # (n, T)
    entropy = -(logp_all.exp() * logp_all).sum(-1)                                     # (n, T)
    return logps, entropy


def replay(trace, model) -> float:
    """Accumulate the captured step's gradient in `model` (micro-batch by micro-batch); return its pre-clip norm."""
    from rookworld_debug.trl.build import _loss
    r, cap, cfg = trace.rollout, trace.capture, trace.config
    old, ref = cap.old_per_token_logps, r.ref_per_token_logps
    temperature = float(cap.grpo_config.get("temperature", 1.0))
    for rows in cap.micro_batch_rows:
        idx = torch.tensor(rows, dtype=torch.long)
        logps, ent = trl_logps_and_entropy(model, r.prompt_ids[idx], r.prompt_mask[idx], r.completion_ids[idx],
                                           r.completion_mask[idx], temperature)
        loss = _loss(logps, logps.detach() if old is None else old[idx], None if ref is None else ref[idx],
                     trace.advantages.advantages[idx], r.completion_mask[idx], ent, cfg, cap.num_items_in_batch,
                     ga=cap.gradient_accumulation_steps, num_generations=cfg.num_generations)
        loss.loss.backward()        # GRPOTrainer.loss_is_scaled_for_ga: the returned loss is what it backprops
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def compare(replayed, before_state: dict, after, rtol: float = RTOL, atol: float = ATOL) -> list[LayerCheck]:
    from rookworld_debug.grpo.phases.update import layer_name
    acc: dict[str, list[float]] = {}
    after_params = dict(after.named_parameters())
    for name, p in replayed.named_parameters():
        a = after_params[name].detach()
        diff, upd = p.detach() - a, a - before_state[name]
        got = acc.setdefault(layer_name(name), [0.0, 0.0, 0.0, 0.0])   # max|Δ|, max|u|, Σ Δ², Σ u²
        got[0], got[1] = max(got[0], float(diff.abs().max())), max(got[1], float(upd.abs().max()))
        got[2] += float(diff.pow(2).sum())
        got[3] += float(upd.pow(2).sum())
    out = []
    for k, (d, u, d2, u2) in acc.items():
        d2, u2 = d2 ** 0.5, u2 ** 0.5
        rel = d2 / u2 if u2 > 0 else (0.0 if d2 == 0 else math.inf)
        out.append(LayerCheck(k, d, u, rel, d2 <= atol + rtol * u2))
    return sorted(out, key=lambda c: (c.ok, -c.rel))


def verify_capture(step_dir, before, after, *, rtol: float = RTOL, atol: float = ATOL) -> VerifyResult:
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.safeio import load_state_into, load_torch
    trace = StepTrace.load(step_dir)
    cap = trace.capture
    if cap is None:
        raise TraceError(f"{step_dir} is a step of this project's own, not a TRL capture: nothing to verify")
    check_tolerances(rtol, atol)
    before, after = Path(before), Path(after)
    model = _load_weights(before)
    _check_model_of(model, trace, before)
    cfg = dict(cap.grpo_config)
    if cfg.get("disable_dropout", True):
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    model.train()
    before_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = _optimizer(model, cfg, cap.learning_rate)
    load_state_into(opt, load_torch(before / "optimizer.pt", "--before"), "--before", before / "optimizer.pt")
    for g in opt.param_groups:
        g["lr"] = cap.learning_rate             # the LR the captured update used (the scheduler steps after it)
    gnorm = replay(trace, model)
    if cfg.get("max_grad_norm"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(cfg["max_grad_norm"]))
    opt.step()
    after_model = _load_weights(after)
    from rookworld_debug.safeio import check_fits
    check_fits(model, after_model.state_dict(), "--after", after)   # another model's checkpoint: named, not a KeyError
    layers = compare(model, before_state, after_model, rtol, atol)
    bstep, astep = _checkpoint_step(before), _checkpoint_step(after)
    notes = []
    if bstep is not None and bstep != cap.global_step - 1:
        notes.append(f"--before is checkpoint step {bstep}; the capture's step {cap.global_step} starts from {cap.global_step - 1}")
    if astep is not None and astep != cap.global_step:
        notes.append(f"--after is checkpoint step {astep}, not the captured step {cap.global_step}")
    if cap.num_iterations > 1 or cap.steps_per_generation != cap.gradient_accumulation_steps:
        notes.append("num_iterations > 1 / steps_per_generation ≠ gradient_accumulation_steps: the replay uses the "
                     "captured micro-batches of this optimizer step only")
    return VerifyResult(step=cap.global_step, before_step=bstep, after_step=astep, grad_norm_replayed=gnorm,
                        grad_norm_captured=cap.grad_norm, layers=tuple(layers), ok=all(c.ok for c in layers),
                        notes=tuple(notes))


def format_result(res: VerifyResult, rtol: float = RTOL, worst: int = 5) -> str:
    bad = [c for c in res.layers if not c.ok]
    lines = [f"captured step {res.step}: replayed from checkpoint step {res.before_step}, compared with checkpoint "
             f"step {res.after_step}",
             f"  grad norm before clipping: replayed {res.grad_norm_replayed:.6g}, captured {res.grad_norm_captured:.6g}",
             f"  {len(res.layers) - len(bad)}/{len(res.layers)} layers within tolerance (‖θ_replayed − θ_after‖₂ ≤ "
             f"{ATOL:g} + {rtol:g} · ‖θ_after − θ_before‖₂ per layer)"]
    for c in res.layers[:worst]:
        lines.append(f"    {'FAIL' if not c.ok else 'ok  '} {c.layer:28s} |Δ| {c.max_abs_diff:.3g}  true update "
                     f"{c.max_abs_update:.3g}  L2 ratio {c.rel:.3g}")
    lines += [f"  note: {n}" for n in res.notes]
    lines.append("VERIFIED: the captured step reproduces the checkpoint" if res.ok else
                 f"NOT VERIFIED: {len(bad)} layer(s) differ, worst: {', '.join(c.layer for c in bad[:3])}")
    return "\n".join(lines)
