"""`StepConfig`: every knob and convention of ONE GRPO step, in one frozen, documented dataclass.

Each field carries its documentation in `metadata["help"]` so the glossary is renderable at run time
(`StepConfig.glossary()`, `StepConfig.glossary_markdown()`); papermill parameters map 1:1 onto
`to_dict()` / `from_dict()`.

Defaults follow rookworld-trl's manual debug run (B=4 prompts, G=4 generations, β=0.1, lr 1e-6, AdamW 0.9/0.999/1e-8,
wd 0, grad-clip 1.0, task-conditional sampling); every *convention* (loss_type, KL estimator, advantage
scaling, ε, δ, importance-sampling level, entropy normalisation) defaults to what TRL's `GRPOConfig` does,
so a fresh config reproduces TRL's math on our rollout. `loss_type="manual"` selects that run's
sequence-level REINFORCE variant instead (see `grpo/objective/loss.py`).

Impossible values are rejected at construction with `ConfigError(field, message)`.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Union

from rookworld_debug.errors import ConfigError

__all__ = ["StepConfig", "LOSS_TYPES", "KL_ESTIMATORS", "SCALE_REWARDS", "TASKS", "REWARD_MODES"]

LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo", "manual", "rlvr_mini")
KL_ESTIMATORS = ("k3", "k1", "k2", "full")
SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
TASKS = ("P", "A", "mixed")
REWARD_MODES = ("engine", "dataset", "rlvr", "rlvr_gt")
RLVR_KL_TYPES = ("forward", "reverse", "symmetric")
RLVR_BASELINES = ("group_mean", "ema", "learned", "adaptive")
RLVR_PITFALLS = ("prompt_mask_left_pad", "pad_first_token", "kv_cache_positions", "train_past_eos")
DTYPES = ("float32", "float64", "bfloat16", "float16")


def _f(default: Any, help: str, *, choices: tuple | None = None, group: str = "", factory=None):
    md = {"help": help, "group": group}
    if choices is not None:
        md["choices"] = choices
    if factory is not None:
        return field(default_factory=factory, metadata=md)
    return field(default=default, metadata=md)


@dataclass(frozen=True)
class StepConfig:
    """All knobs of one GRPO step. Frozen: derive variants with `replace(**changes)`."""

    # ---------------------------------------------------------------- run / data
    model: str = _f("tiny", "Policy to load: 'tiny' (the embedded small GPT-2, trained on RookWorld P:/A: text; see models/tiny/MODEL_CARD.md), a local "
                    "directory, or an HF id (e.g. 'jrahn/RookWorld-LM-124M'). The reference is a second, frozen "
                    "copy loaded the same way (eval mode, no grad).", group="run")
    dataset: str = _f("bundled", "Prompt source: 'bundled' (sample shipped with the package, generated with "
                      "python-chess + Stockfish) or a path to a RookWorld text/JSONL file.", group="run")
    on_bad_sample: str = _f("error", "A malformed dataset record: 'error' raises DataError naming the file, the "
                            "1-based line and why; 'skip' drops it and the step's flags list every skip.",
                            choices=("error", "skip"), group="run")
    task: str = _f("P", "Which prompts form the batch: 'P' (ROOK policy with chain-of-thought), 'A' (ArbiterSim "
                   "environment) or 'mixed' (both tasks, alternating P, A, P, A, ...: ⌈B/2⌉ P and ⌊B/2⌋ A prompts, so B ≥ 2).",
                   choices=TASKS, group="run")
    batch_size: int = _f(4, "B: number of distinct prompts in the step (rookworld-trl's manual debug run used 4).", group="run")
    num_generations: int = _f(4, "G: completions sampled per prompt; one group = the G completions of a prompt. "
                              "N = B·G rows. TRL requires G ≥ 2 (a group std needs two samples).", group="run")
    prompt_indices: Optional[tuple] = _f(None, "Explicit dataset indices of the B prompts: distinct, length = "
                                         "batch_size, positions in the train split of `dataset`. None = a seeded "
                                         "draw: random.Random(seed).sample over the prompts of the selected task "
                                         "(see task for 'mixed').", group="run")
    seed: int = _f(0, "Seed of the torch.Generator used for sampling (and of every other random choice); the "
                   "same config + seed gives a bit-identical StepTrace on CPU.", group="run")

    # ---------------------------------------------------------------- sampling
    max_new_tokens: int = _f(160, "Max completion tokens per sample (TRL: max_completion_length; also L_max of "
                             "dr_grpo's normalizer). 160 covers a full padded P: completion (the model first emits "
                             "~34 pad spaces, then M:/E: fields padded to 30/40 chars and B:, ≈120–140 GPT-2 tokens "
                             "+ EOS) and any A: completion (≈40–60 tokens). Completions hitting the limit without "
                             "EOS are flagged 'truncated'.", group="sampling")
    p_temperature: float = _f(0.5, "Sampling temperature for P: prompts. Logits are divided by it before softmax "
                              "for sampling AND for every log-prob/KL/entropy (as TRL does).", group="sampling")
    p_top_p: float = _f(0.9, "Nucleus (top-p) for P: prompts, in (0, 1]; 1.0 disables. Sampling only: training "
                        "log-probs use the full tempered vocabulary (as TRL).", group="sampling")
    a_temperature: float = _f(0.95, "Sampling temperature for A: prompts (see p_temperature).", group="sampling")
    a_top_p: float = _f(0.95, "Nucleus (top-p) for A: prompts (see p_top_p).", group="sampling")
    top_k: int = _f(0, "Top-k filter for sampling, both tasks; 0 disables (TRL default since v0.27). Sampling "
                    "only, like top_p.", group="sampling")

    # ---------------------------------------------------------------- objective
    loss_type: str = _f("dapo", "Aggregation of the per-token loss L_it (mask m): 'dapo' (TRL default) "
                        "Σ m·L / num_items_in_batch (token mean over the whole batch); 'grpo' mean_i(Σ_t m·L / |o_i|); "
                        "'bnpo' Σ m·L / Σ m (micro-batch token mean); 'dr_grpo' Σ m·L / (N·max_new_tokens); "
                        "'manual' = rookworld-trl's manual sequence-level REINFORCE mean_i(−A_i·mean_t logπ + β·mean_t KL "
                        "− c_H·mean_t H), no ratio, no clip. TRL 1.16's other types: 'cispo' (IS weight clipped at "
                        "epsilon_high, dapo normaliser), 'sapo' (soft sigmoid gate, grpo normaliser), 'luspo' "
                        "(per-sequence token sums, meant for importance_sampling_level='sequence'), 'vespo' (gamma "
                        "weight of the sequence ratio, dapo normaliser). 'rlvr_mini' = rookworld-rlvr's pure-PyTorch "
                        "GRPO: r_i = exp(clamp(Σ_t (logp − ref), ±20)) against the REFERENCE, −mean_i min(r_i·A_i, "
                        "clip(r_i)·A_i) + β·mean_i KL_i − c_H·mean_i H_i, sums not means (knobs rlvr_*; β is its "
                        "kl_coef, epsilon_low/high its clip_range). Formulas: grpo/objective/loss.py, grpo/families/rlvr_mini/objective.py.",
                        choices=LOSS_TYPES, group="objective")
    beta: float = _f(0.1, "β: KL coefficient; loss adds β·KL(π‖π_ref) per token. TRL's default is 0.0 (no "
                     "reference loaded); 0.1 is rookworld-trl's manual debug run's value.", group="objective")
    kl_estimator: str = _f("k3", "Per-token KL(π‖π_ref) estimator on the sampled token, with d = ref − logp: "
                           "'k3' (TRL) exp(d) − d − 1 ≥ 0; 'k1' logp − ref (= −d, can be negative); 'k2' ½·d²; "
                           "'full' exact Σ_v π(v)(log π(v) − log π_ref(v)) over the tempered vocabulary.",
                           choices=KL_ESTIMATORS, group="objective")
    use_bias_correction_kl: bool = _f(True, "Multiply the sampled-token KL estimate by the importance ratio r "
                                      "(not detached), as TRL does by default (GRPOConfig.use_bias_correction_kl=True "
                                      "in the installed TRL 1.16; False in 1.10): DeepSeek-V3.2 unbiased "
                                      "reverse-KL gradient. Value unchanged on-policy (r = 1) but the KL gradient "
                                      "gains a k·∇logπ term. Not applied to 'full'.", group="objective")
    epsilon_low: float = _f(0.2, "ε_low: PPO clip lower bound, ratio clipped to ≥ 1 − ε_low (TRL 'epsilon').",
                            group="objective")
    epsilon_high: float = _f(0.2, "ε_high: PPO clip upper bound, ratio clipped to ≤ 1 + ε_high (TRL "
                             "'epsilon_high', defaults to epsilon; DAPO suggests 0.28).", group="objective")
    delta: Optional[float] = _f(None, "δ: two-sided clipping (INTELLECT-2): the unclipped ratio is capped at δ "
                                "before min(r·A, clip(r)·A). None disables; should exceed 1 + ε_high.",
                                group="objective")
    importance_sampling_level: str = _f("token", "'token': ratio r_it = exp(logp_it − old_it); 'sequence' (GSPO): "
                                        "one ratio per completion exp(mean_t(logp − old)) broadcast over tokens.",
                                        choices=IMPORTANCE_SAMPLING_LEVELS, group="objective")
    scale_rewards: str = _f("group", "Advantage scaling (TRL): 'group' A = (r − mean_g)/(std_g + adv_eps); "
                            "'batch' divides by the std of the whole batch (mean stays per group); 'none' A = r − "
                            "mean_g.", choices=SCALE_REWARDS, group="objective")
    adv_eps: float = _f(1e-4, "ε added to the std (not the variance) in the advantage denominator (TRL: 1e-4).",
                        group="objective")
    std_ddof: int = _f(1, "Delta degrees of freedom of the reward std: 1 = Bessel-corrected n−1 (TRL and the "
                       "seeds), 0 = population std.", group="objective")
    adv_clip: Optional[float] = _f(None, "Clip TRL-style advantages to ±adv_clip after normalisation. None = no "
                                   "clip (TRL).", group="objective")
    entropy_coef: float = _f(0.0, "c_H: entropy bonus; loss −= c_H·H̄ with H̄ the masked token-mean entropy of "
                             "the tempered policy (installed TRL 1.16 normalisation, independent of loss_type). 0 disables "
                             "(TRL default); rookworld-trl's manual debug run used 0.005.", group="objective")
    mask_truncated_completions: bool = _f(False, "Zero the loss mask of completions that hit max_new_tokens "
                                          "without EOS (TRL option, default False). They still enter the "
                                          "group mean/std of the advantages.", group="objective")
    sapo_temperature_pos: float = _f(1.0, "sapo: gate temperature τ for A > 0 (TRL default 1.0).", group="objective")
    sapo_temperature_neg: float = _f(1.05, "sapo: gate temperature τ for A ≤ 0 (TRL default 1.05).", group="objective")
    vespo_k_pos: float = _f(2.0, "vespo: power k of φ(w) = e^(λ + k·log w − λw) for A ≥ 0 (TRL 2.0).", group="objective")
    vespo_lambda_pos: float = _f(3.0, "vespo: decay λ for A ≥ 0 (TRL 3.0).", group="objective")
    vespo_k_neg: float = _f(3.0, "vespo: power k for A < 0 (TRL 3.0).", group="objective")
    vespo_lambda_neg: float = _f(2.0, "vespo: decay λ for A < 0 (TRL 2.0).", group="objective")
    off_policy_mask_threshold: Optional[float] = _f(None, "OPSM (DeepSeek-V3.2, TRL): drop the PG term of a "
                                                    "completion with A < 0 whose mean log(π_old/π) over its tokens "
                                                    "exceeds this. None disables (TRL default); e.g. 0.5.",
                                                    group="objective")
    top_entropy_quantile: float = _f(1.0, "ρ (Beyond the 80/20 rule, TRL): keep the PG term (and the entropy "
                                     "bonus) only on the top-ρ fraction of tokens by entropy; 1.0 keeps all (TRL "
                                     "default), 0.2 is the paper's value.", group="objective")
    vllm_importance_sampling_correction: bool = _f(False, "TRL's sampler–trainer importance-sampling correction "
                                                   "(vllm_importance_sampling_correction, on with vLLM in TRL): "
                                                   "weight the PG term by ρ = exp(old − sampling log-prob), the "
                                                   "sampling log-probs being those recorded at generation time. "
                                                   "False (default) = no correction.", group="objective")
    vllm_importance_sampling_mode: str = _f("sequence_mask", "How ρ is formed and bounded (TRL's default "
                                            "'sequence_mask'): 'token_*' one ρ per token, 'sequence_*' one per "
                                            "completion (exp of the summed token differences); '*_truncate' "
                                            "clamps ρ to [clip_min, clip_max], '*_mask' sets ρ = 0 outside it. "
                                            "vespo needs a token_* mode.", choices=VLLM_IS_MODES,
                                            group="objective")
    vllm_importance_sampling_clip_min: Optional[float] = _f(None, "C_min of the correction: lower bound of ρ "
                                                            "(None = none, TRL default).", group="objective")
    vllm_importance_sampling_clip_max: Optional[float] = _f(3.0, "C_max of the correction: upper bound of ρ "
                                                            "(TRL default 3.0; None = none).", group="objective")
    use_adaptive_entropy: bool = _f(False, "Skywork-OR1 adaptive entropy coefficient (TRL): the bonus c_H is applied "
                                    "only while the last optimizer step's entropy ≤ entropy_target (never at the "
                                    "first, as TRL starts from +inf); after each optimizer step c_H moves by "
                                    "±entropy_coef_delta within [entropy_coef_min, entropy_coef_max].",
                                    group="objective")
    entropy_target: float = _f(0.2, "Adaptive entropy: target mean token entropy (nats), TRL default 0.2.",
                               group="objective")
    entropy_coef_delta: float = _f(0.005, "Adaptive entropy: step of c_H per optimizer step (TRL 0.005).",
                                   group="objective")
    entropy_coef_min: float = _f(0.0, "Adaptive entropy: lower bound of c_H (TRL 0.0).", group="objective")
    entropy_coef_max: float = _f(1.0, "Adaptive entropy: upper bound of c_H (TRL 1.0).", group="objective")
    tiny_std_fraction: float = _f(0.5, "Flag a group whose reward std σ_g is > 0 but below this fraction of the "
                                  "batch reward std: dividing by a tiny σ_g turns a small reward gap into "
                                  "advantages of ±1 or more (0.5 = the group's gaps are amplified more than 2× "
                                  "compared with batch scaling). 0 = never flag. Display only (no effect on the "
                                  "math).", group="objective")

    # the objective families' own knobs (read only under their loss types)
    manual_std_clamp: float = _f(0.05, "loss_type='manual' only: advantage denominator is max(std_g, this) "
                                 "(rookworld-trl's manual debug run used 0.05 at step 1, 1e-6 later).", group="manual")
    manual_adv_clip: Optional[float] = _f(2.0, "loss_type='manual' only: advantages clipped to ±this (rookworld-trl's manual debug run: "
                                          "2.0). None = no clip.", group="manual")
    rlvr_kl_type: str = _f("forward", "rlvr_mini: KL surrogate per row on the sampled tokens: 'forward' Σ e^p(p−q), "
                           "'reverse' Σ e^q(q−p), 'symmetric' their mean (can be < 0).", choices=RLVR_KL_TYPES,
                           group="rlvr_mini")
    rlvr_adaptive_kl: bool = _f(True, "rlvr_mini: a fresh adaptive KL controller sets the step's kl_coef from β: "
                                "k1 = mean_i Σ_t (p − q), ×1.5 if > 2·target, ×0.8 if < 0.5·target, clamp [0.001, 1].",
                                group="rlvr_mini")
    rlvr_kl_target: float = _f(0.01, "rlvr_mini: the KL controller's target.", group="rlvr_mini")
    rlvr_kl_horizon: int = _f(10000, "rlvr_mini: its history (mean of ≤ 100).", group="rlvr_mini")
    rlvr_baseline: str = _f("group_mean", "rlvr_mini: advantage baseline per group of G, then ONE global "
                            "normalisation (A − mean)/(std + 1e-8) over the batch: 'group_mean'; 'ema' (α 0.1, fresh "
                            "each step); 'learned' (mean of the values); 'adaptive' (lower median if std_g > 0.1).",
                            choices=RLVR_BASELINES, group="rlvr_mini")
    rlvr_values: str = _f("none", "rlvr_mini: values for its baselines/value loss; 'rewards' = its training "
                          "script's values = targets = rewards.", choices=("none", "rewards"), group="rlvr_mini")
    rlvr_use_gae: bool = _f(False, "rlvr_mini: raw advantages → reverse λ-sum per group (with values).", group="rlvr_mini")
    rlvr_gae_lambda: float = _f(0.95, "rlvr_mini: λ of that sum.", group="rlvr_mini")
    rlvr_value_loss_coef: float = _f(0.1, "rlvr_mini: coefficient of mean (v − v̂)².", group="rlvr_mini")
    rlvr_length_normalize: bool = _f(False, "rlvr_mini: average log-ratio, KL and entropy over a row's tokens "
                                     "(the mini sums: long rows dominate).", group="rlvr_mini")
    rlvr_pitfalls: tuple = _f((), "rlvr data-pipeline faults to reproduce: 'prompt_mask_left_pad' (a right-padding "
                              "prompt mask on left-padded rows trains their last min(pads, L) prompt tokens), "
                              "'pad_first_token' (also the first prompt token predicted from a pad), "
                              "'kv_cache_positions' (cached sampling steps at position P_max + j), 'train_past_eos' "
                              "(tokens sampled after EOS trained).", group="rlvr_mini")

    # ---------------------------------------------------------------- start policy and inner iterations
    init_policy: Optional[str] = _f(None, "Start the step from these policy weights instead of `model`: a "
                                    "`run_steps` checkpoint folder (policy.pt) or an HF model folder. The reference "
                                    "stays `model` (the base), so KL > 0 and ratios drift. None = π = π_ref.",
                                    group="drift")
    init_optimizer: Optional[str] = _f(None, "AdamW state to start from: a path to an optimizer.pt (e.g. the "
                                       "checkpoint's) or 'checkpoint' = init_policy's own optimizer.pt. None = "
                                       "fresh AdamW moments.", group="drift")
    warmup_steps: int = _f(0, "k short GRPO warm-up steps on this same batch (same config, seeds derived from "
                           "`seed`) run BEFORE the debugged step, from `init_policy` or the base; the debugged step "
                           "then starts from the drifted policy and its AdamW state. Cached on disk by config "
                           "(rookworld_debug.grpo.multistep.drift). 0 = none.", group="drift")
    warmup_lr: Optional[float] = _f(None, "Learning rate of the warm-up steps (None = lr). A larger value drifts "
                                    "the policy in few steps while the debugged step keeps its own lr.",
                                    group="drift")
    num_iterations: int = _f(1, "μ (TRL num_iterations): passes of the optimizer over the same rollout. Old "
                             "log-probs are frozen at sampling; from the 2nd optimizer step on the ratio r ≠ 1 and "
                             "clipping acts. Each pass is recorded in trace.iterations.", group="drift")
    steps_per_generation: Optional[int] = _f(None, "Optimizer steps per pass over the rollout: its N rows are split "
                                             "into this many equal parts, one optimizer step each (micro-batched by "
                                             "micro_batch_size). None = 1. TRL's steps_per_generation = this × "
                                             "gradient_accumulation_steps (identical with TRL's default "
                                             "gradient_accumulation_steps = 1).", group="drift")

    # ---------------------------------------------------------------- optimizer
    lr: float = _f(1e-6, "AdamW learning rate for the single step (TRL default 1e-6).", group="optimizer")
    adam_betas: tuple = _f((0.9, 0.999), "AdamW (β1, β2): decay rates of the first and second moment "
                           "estimates.", group="optimizer")
    adam_eps: float = _f(1e-8, "AdamW ε added to the denominator sqrt(v̂) + ε.", group="optimizer")
    weight_decay: float = _f(0.0, "AdamW decoupled weight decay.", group="optimizer")
    max_grad_norm: Optional[float] = _f(1.0, "Global L2 grad-norm clip (torch clip_grad_norm_). None = no clip.",
                                        group="optimizer")
    micro_batch_size: Optional[int] = _f(None, "Rows per backward for true gradient accumulation (bounded "
                                         "memory, same gradient); must divide N = B·G. None = automatic: all rows at once "
                                         "unless the estimated memory of that forward exceeds 1 GiB, then the largest "
                                         "divisor that fits (GPT-2 124M, 128 new tokens: 4).",
                                         group="optimizer")

    # ---------------------------------------------------------------- rewards
    reward_mode: str = _f("engine", "'engine': P: rewards scored with Stockfish (best move / candidates / eval "
                          "MAE = 0.5/0.3/0.2); 'dataset': use the dataset's own labels, no engine needed. A: "
                          "rewards always come from the python-chess arbiter. 'rlvr': rookworld-rlvr's scorer as its "
                          "training ran it (no ground truth, no engine: P: ≤ 0.2124); 'rlvr_gt': the same scorer "
                          "with the dataset completion as ground truth (chess/rlvr_rewards.py).", choices=REWARD_MODES,
                          group="rewards")
    engine_depth: int = _f(10, "Stockfish fixed search depth (Threads=1, deterministic).", group="rewards")
    engine_multipv: int = _f(5, "Stockfish MultiPV: number of candidate lines (P: has 5 M:/E: slots).",
                             group="rewards")
    engine_workers: int = _f(2, "Number of Stockfish processes in the pool.", group="rewards")
    engine_timeout: float = _f(30.0, "Deadline of ONE Stockfish search, seconds (depth 10 takes well under 1 s). "
                               "A search that misses it, or an unparsable/illegal engine answer, restarts the "
                               "process and retries; after 2 restarts the step raises EngineError naming the "
                               "position and what the engine said (see engine_on_failure).", group="rewards")
    engine_on_failure: str = _f("raise", "When an engine search still fails after its restarts: 'raise' stops the "
                                "step with EngineError; 'flag' marks the completions that needed it unscorable "
                                "(reward NaN, advantage 0, flag 'engine_failed' with what the engine said) and "
                                "the step goes on.", choices=("raise", "flag"), group="rewards")

    # ---------------------------------------------------------------- evaluation
    heldout_n: int = _f(8, "Number of held-out prompts for greedy before/after evaluation (0 disables). Its 95% CI "
                           "is shown with every held-out number: 8 prompts detect only large changes.",
                        group="eval")
    eval_max_new_tokens: int = _f(196, "Max new tokens for greedy evaluation (rookworld-trl's manual debug run's held-out eval used 196).",
                                  group="eval")
    top_k_alternatives: int = _f(5, "Top-k alternative tokens (with probabilities) recorded per completion "
                                 "position for views; 0 disables.", group="eval")
    diagnostics: bool = _f(False, "Signal or noise: per-group gradients, SNR, Δreward intervals, the G′ sweep, the "
                           "entropy mechanism and the sampler–trainer gap (one grad forward, B + |G′|·3 backwards).",
                           group="eval")
    sampling_autocast: Optional[str] = _f(None, "Precision of the SAMPLER only: 'bf16' runs the generation phase "
                                          "(sampling loop, greedy rows, its scoring forwards) under torch.autocast "
                                          "bf16 while the update trains as `autocast` says (fp32 on the CPU): a real "
                                          "sampler–trainer gap, as a bf16 vLLM sampler makes. None = off.",
                                          choices=(None, "bf16"), group="eval")

    # ---------------------------------------------------------------- hardware
    device: str = _f("auto", "torch device: 'auto' (cuda if available, else mps, else cpu), 'cpu', 'cuda', 'cuda:N' "
                     "or 'mps'.", group="hardware")
    reference_device: str = _f("same", "Device of the frozen reference model: 'same' (the policy's), 'cpu', 'cuda', "
                               "'cuda:N' or 'mps'. Elsewhere it frees the policy's card (a second GPU, or the CPU on "
                               "a small card); its log-probs cross to the policy's device in one place.",
                               group="hardware")
    dtype: str = _f("float32", "Model dtype. Log-softmax, KL and entropy are always computed in float32 (or "
                    "float64) on the sampled ids.", choices=DTYPES, group="hardware")
    autocast: str = _f("auto", "Mixed precision of the forwards: 'auto' = bf16 autocast on CUDA with float32 master "
                       "weights (TRL's bf16=True), none on CPU; 'bf16' = also on CPU; 'off' = plain dtype (use it "
                       "on a GPU for the exact fp32 recompute check).", choices=("auto", "bf16", "off"),
                       group="hardware")

    # ================================================================= validation
    def __post_init__(self):
        """Normalise papermill/JSON shapes and types, then apply `_RULES` in order: the first rule a value
        breaks raises ConfigError(field, message)."""
        _normalise(self)
        for rule in _RULES:
            if not rule.ok(self):
                msg = rule.message(self) if callable(rule.message) else rule.message
                raise ConfigError(rule.field, f"{msg} (got {getattr(self, rule.field)!r})" if rule.show_value
                                  else msg)

    # ================================================================= helpers
    @property
    def num_completions(self) -> int:
        """N = B·G."""
        return self.batch_size * self.num_generations

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (1 when micro_batch_size is None)."""
        return 1 if self.micro_batch_size is None else self.rows_per_optimizer_step // self.micro_batch_size

    @property
    def rows_per_optimizer_step(self) -> int:
        """N / steps_per_generation."""
        return self.num_completions // (self.steps_per_generation or 1)

    @property
    def trl_steps_per_generation(self) -> int:
        """TRL's steps_per_generation (micro-batches per generation batch) = steps_per_generation × g."""
        return (self.steps_per_generation or 1) * self.gradient_accumulation_steps

    @property
    def freezes_old_logps(self) -> bool:
        """True when some optimizer step runs after the policy moved (μ > 1 or several steps per generation):
        TRL then keeps the sampling-time log-probs as old_per_token_logps."""
        return self.num_iterations > 1 or (self.steps_per_generation or 1) > 1

    def sampling_for(self, task: str) -> tuple:
        """(temperature, top_p, top_k) used to sample completions of a `task` ('P' or 'A') prompt."""
        if task == "P":
            return (self.p_temperature, self.p_top_p, self.top_k)
        if task == "A":
            return (self.a_temperature, self.a_top_p, self.top_k)
        raise ConfigError("task", f"sampling_for() needs 'P' or 'A' (one prompt's task), got {task!r}")

    def to_dict(self) -> dict:
        """Plain JSON-able dict, one key per field (tuples become lists): the papermill parameters."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "StepConfig":
        """Inverse of `to_dict`; missing keys take defaults, unknown keys raise ConfigError naming them."""
        if not isinstance(d, dict):
            raise ConfigError("<config>", f"expected a dict, got {type(d).__name__}")
        unknown = sorted(set(d) - set(cls.field_names()))
        if unknown:
            raise ConfigError(", ".join(unknown), f"unknown config key(s) {unknown}; known keys: "
                              f"{list(cls.field_names())}")
        return cls(**d)

    def replace(self, **changes) -> "StepConfig":
        """A copy with `changes` applied (validated); unknown names raise ConfigError naming them."""
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise ConfigError(", ".join(unknown), f"unknown config key(s) {unknown}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def glossary(cls) -> dict:
        """{field: {"default", "group", "help", "choices"?}} for every field, in declaration order."""
        out = {}
        for f in dataclasses.fields(cls):
            entry = {"default": f.default, "group": f.metadata.get("group", ""), "help": f.metadata["help"]}
            if "choices" in f.metadata:
                entry["choices"] = f.metadata["choices"]
            out[f.name] = entry
        return out

    @classmethod
    def glossary_markdown(cls) -> str:
        """The glossary as a Markdown table (field | default | meaning)."""
        rows = ["| field | default | meaning |", "| --- | --- | --- |"]
        for name, e in cls.glossary().items():
            choices = f" Choices: {', '.join(map(repr, e['choices']))}." if "choices" in e else ""
            rows.append(f"| `{name}` | `{e['default']!r}` | {e['help'].replace('|', '/')}{choices} |")
        return "\n".join(rows)


def _field_kinds() -> dict:
    """Each kind of field by its annotation (the one definition of a field's type): float, int, bool, the
    non-optional free strings, and the optional ones (None allowed)."""
    hints = typing.get_type_hints(StepConfig)
    kinds: dict = {"float": [], "int": [], "bool": [], "str": [], "optional": set()}
    for f in dataclasses.fields(StepConfig):
        args = typing.get_args(hints[f.name])
        optional = type(None) in args
        t = next((a for a in args if a is not type(None)), hints[f.name]) if optional else hints[f.name]
        if optional:
            kinds["optional"].add(f.name)
        if t in (float, int, bool):
            kinds[t.__name__].append(f.name)
        elif t is str and not optional and "choices" not in f.metadata:
            kinds["str"].append(f.name)
    return kinds


_KINDS = _field_kinds()
_OPTIONAL = _KINDS["optional"]
_FLOAT_FIELDS, _INT_FIELDS, _BOOL_FIELDS, _STR_FIELDS = (tuple(_KINDS[k]) for k in ("float", "int", "bool", "str"))
# the built-in loss types and those of objective families registered at run time (grpo.families.register)
_LOSS_TYPE_CHOICES = list(LOSS_TYPES)


def allow_loss_type(name: str) -> None:
    """Accept `name` as a loss_type: an objective family registered by grpo.families.register answers it."""
    if name not in _LOSS_TYPE_CHOICES:
        _LOSS_TYPE_CHOICES.append(name)


# every field's choices from its metadata; loss_type's grow as objective families register
_CHOICES = {**{f.name: f.metadata["choices"] for f in dataclasses.fields(StepConfig) if "choices" in f.metadata},
            "loss_type": _LOSS_TYPE_CHOICES}


def _device_name(name: str, default: str) -> bool:
    return name in (default, "cpu", "cuda", "mps") or (name.startswith("cuda:") and name[5:].isdigit())


def _normalise(c: StepConfig) -> None:
    """Papermill/JSON shapes (lists → tuples, ints → floats, TRL's bool scale_rewards), then the type of
    every number, bool, string and choice field."""
    s = object.__setattr__
    if isinstance(c.adam_betas, list):
        s(c, "adam_betas", tuple(c.adam_betas))
    if isinstance(c.prompt_indices, list):
        s(c, "prompt_indices", tuple(c.prompt_indices))
    if isinstance(c.rlvr_pitfalls, (list, str)) or c.rlvr_pitfalls is None:   # JSON list, CLI "a,b", none
        v = c.rlvr_pitfalls or ()
        s(c, "rlvr_pitfalls", tuple(x for x in v.split(",") if x) if isinstance(v, str) else tuple(v))
    if c.scale_rewards is True:
        s(c, "scale_rewards", "group")
    elif c.scale_rewards is False:
        s(c, "scale_rewards", "none")
    if _is_number_pair(c.adam_betas):                  # else the adam_betas rule names it, in its turn
        s(c, "adam_betas", (float(c.adam_betas[0]), float(c.adam_betas[1])))
    for name in _FLOAT_FIELDS:
        v = getattr(c, name)
        if v is None and name in _OPTIONAL:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(name, f"must be a number, got {v!r}")
        if isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63:
            raise ConfigError(name, f"must be finite, got an integer of {v.bit_length()} bits")
        if not math.isfinite(v):
            raise ConfigError(name, f"must be finite, got {v!r}")
        s(c, name, float(v))
    for name in _INT_FIELDS:
        v = getattr(c, name)
        if v is None and name in _OPTIONAL:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
            s(c, name, v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(name, f"must be an integer, got {v!r}")
        if not -2 ** 63 <= v < 2 ** 63:
            raise ConfigError(name, f"must be a 64-bit integer, got one of {v.bit_length()} bits")
    for name in _BOOL_FIELDS:
        if not isinstance(getattr(c, name), bool):
            raise ConfigError(name, f"must be True or False, got {getattr(c, name)!r}")
    for name in _STR_FIELDS:
        v = getattr(c, name)
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(name, f"must be a non-empty string, got {v!r}")
    for name, choices in _CHOICES.items():
        if getattr(c, name) not in choices:
            raise ConfigError(name, f"unknown value {getattr(c, name)!r}; expected one of {list(choices)}")


class _Rule(NamedTuple):
    """One validation rule: `ok(config)` must hold, else ConfigError(field, message + " (got value)")
    (`show_value=False`: the message alone); `message` may be a function of the config."""
    field: str
    ok: Callable[[StepConfig], bool]
    message: Union[str, Callable[[StepConfig], str]]
    show_value: bool = True


def _optional(name: str, pred: Callable[[Any], bool]) -> Callable[[StepConfig], bool]:
    """A rule on an Optional field: None passes."""
    return lambda c: getattr(c, name) is None or pred(getattr(c, name))


def _path_or_none(name: str) -> _Rule:
    return _Rule(name, _optional(name, lambda v: isinstance(v, str) and bool(v.strip())),
                 lambda c: f"must be a non-empty path string or None, got {getattr(c, name)!r}", False)


def _is_number_pair(b) -> bool:
    return isinstance(b, tuple) and len(b) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in b)


def _is_truncate(c: StepConfig) -> bool:
    return c.vllm_importance_sampling_mode.endswith("truncate")


# Value rules, in the order they are checked (after the type checks of _normalise); cross-field rules sit
# with the field they name.
_RULES: tuple[_Rule, ...] = (
    # ---- run / data
    _Rule("batch_size", lambda c: c.batch_size >= 1, "must be ≥ 1"),
    _Rule("num_generations", lambda c: c.num_generations >= 1, "must be ≥ 1"),
    _Rule("num_generations", lambda c: not (c.num_generations < 2 and c.scale_rewards != "none"),
          lambda c: f"G={c.num_generations} < 2: a group std needs at least two samples (scale_rewards="
                    f"{c.scale_rewards!r}); use G ≥ 2 or scale_rewards='none'", False),
    _Rule("prompt_indices", _optional("prompt_indices", lambda pi: isinstance(pi, tuple) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in pi)),
          lambda c: f"must be a list of integers, got {c.prompt_indices!r}", False),
    _Rule("prompt_indices", lambda c: c.prompt_indices is None or len(c.prompt_indices) == c.batch_size,
          lambda c: f"length must equal batch_size={c.batch_size}"),
    _Rule("prompt_indices", _optional("prompt_indices", lambda pi: all(i >= 0 for i in pi)), "indices must be ≥ 0"),
    _Rule("prompt_indices", _optional("prompt_indices", lambda pi: len(set(pi)) == len(pi)),
          "indices must be distinct (G already repeats each prompt num_generations times)"),
    _Rule("batch_size", lambda c: not (c.task == "mixed" and c.prompt_indices is None) or c.batch_size >= 2,
          "task='mixed' needs batch_size ≥ 2 to hold both tasks"),
    _Rule("seed", lambda c: c.seed >= 0, "must be ≥ 0"),
    # ---- sampling
    _Rule("max_new_tokens", lambda c: c.max_new_tokens > 0, "must be > 0"),
    _Rule("p_temperature", lambda c: c.p_temperature > 0, "must be > 0"),
    _Rule("a_temperature", lambda c: c.a_temperature > 0, "must be > 0"),
    _Rule("p_top_p", lambda c: 0 < c.p_top_p <= 1, "must be in (0, 1]"),
    _Rule("a_top_p", lambda c: 0 < c.a_top_p <= 1, "must be in (0, 1]"),
    _Rule("top_k", lambda c: c.top_k >= 0, "must be ≥ 0 (0 disables)"),
    # ---- objective
    _Rule("beta", lambda c: c.beta >= 0, "must be ≥ 0"),
    _Rule("epsilon_low", lambda c: c.epsilon_low >= 0, "must be ≥ 0"),
    _Rule("epsilon_high", lambda c: c.epsilon_high >= 0, "must be ≥ 0"),
    _Rule("delta", _optional("delta", lambda v: v > 0), "must be > 0 or None (recommended > 1 + epsilon_high)"),
    _Rule("adv_eps", lambda c: c.adv_eps >= 0, "must be ≥ 0"),
    _Rule("std_ddof", lambda c: c.std_ddof in (0, 1), "must be 0 or 1"),
    _Rule("adv_clip", _optional("adv_clip", lambda v: v > 0), "must be > 0 or None"),
    _Rule("manual_std_clamp", lambda c: c.manual_std_clamp >= 0, "must be ≥ 0"),
    _Rule("manual_adv_clip", _optional("manual_adv_clip", lambda v: v > 0), "must be > 0 or None"),
    _Rule("sapo_temperature_pos", lambda c: c.sapo_temperature_pos > 0, "must be > 0"),
    _Rule("sapo_temperature_neg", lambda c: c.sapo_temperature_neg > 0, "must be > 0"),
    # the VESPO gate's λ ≤ 0 has no meaning (TRL's loss would clamp it to 1e-4 while the config said −1)
    _Rule("vespo_lambda_pos", lambda c: c.vespo_lambda_pos > 0, "must be > 0"),
    _Rule("vespo_lambda_neg", lambda c: c.vespo_lambda_neg > 0, "must be > 0"),
    _Rule("off_policy_mask_threshold", _optional("off_policy_mask_threshold", lambda v: v >= 0),
          "must be ≥ 0 or None"),
    _Rule("top_entropy_quantile", lambda c: 0 <= c.top_entropy_quantile <= 1, "must be in [0, 1]"),
    _Rule("vllm_importance_sampling_clip_min", _optional("vllm_importance_sampling_clip_min", lambda v: v >= 0),
          "must be ≥ 0 or None"),
    _Rule("vllm_importance_sampling_clip_max", lambda c: c.vllm_importance_sampling_clip_max is None or (
        c.vllm_importance_sampling_clip_max > 0 and (c.vllm_importance_sampling_clip_min is None or
                                                     c.vllm_importance_sampling_clip_max
                                                     >= c.vllm_importance_sampling_clip_min)),
          "must be > 0 and ≥ vllm_importance_sampling_clip_min, or None"),
    _Rule("vllm_importance_sampling_mode", lambda c: not (c.vllm_importance_sampling_correction and _is_truncate(c))
          or c.vllm_importance_sampling_clip_min is not None or c.vllm_importance_sampling_clip_max is not None,
          "a *_truncate mode needs clip_min or clip_max"),
    _Rule("rlvr_pitfalls", lambda c: isinstance(c.rlvr_pitfalls, tuple) and all(isinstance(x, str) for x in c.rlvr_pitfalls)
          and set(c.rlvr_pitfalls) <= set(RLVR_PITFALLS),
          lambda c: f"must be names from {list(RLVR_PITFALLS)}, got {c.rlvr_pitfalls!r}", False),
    _Rule("rlvr_pitfalls", lambda c: "pad_first_token" not in c.rlvr_pitfalls or "prompt_mask_left_pad" in c.rlvr_pitfalls,
          "'pad_first_token' reaches the loss only through 'prompt_mask_left_pad' (add both)", False),
    _Rule("rlvr_kl_target", lambda c: c.rlvr_kl_target > 0, "must be > 0"),
    _Rule("rlvr_kl_horizon", lambda c: c.rlvr_kl_horizon >= 1, "must be ≥ 1"),
    _Rule("rlvr_gae_lambda", lambda c: 0 <= c.rlvr_gae_lambda <= 1, "must be in [0, 1]"),
    _Rule("rlvr_value_loss_coef", lambda c: c.rlvr_value_loss_coef >= 0, "must be ≥ 0"),
    _Rule("entropy_coef_min", lambda c: 0 <= c.entropy_coef_min <= c.entropy_coef_max,
          "must be in [0, entropy_coef_max]"),
    _Rule("entropy_coef_delta", lambda c: c.entropy_coef_delta >= 0, "must be ≥ 0"),
    # ---- start policy and inner iterations
    _Rule("num_iterations", lambda c: c.num_iterations >= 1, "must be ≥ 1"),
    _Rule("warmup_steps", lambda c: c.warmup_steps >= 0, "must be ≥ 0"),
    _Rule("warmup_lr", _optional("warmup_lr", lambda v: v >= 0), "must be ≥ 0 or None"),
    _path_or_none("init_policy"),
    _path_or_none("init_optimizer"),
    _Rule("init_optimizer", lambda c: not (c.init_optimizer == "checkpoint" and c.init_policy is None),
          "'checkpoint' needs init_policy (a run_steps checkpoint folder)", False),
    _Rule("tiny_std_fraction", lambda c: 0 <= c.tiny_std_fraction < 1, "must be in [0, 1)"),
    # ---- optimizer
    _Rule("lr", lambda c: c.lr >= 0, "must be ≥ 0"),
    _Rule("adam_betas", lambda c: _is_number_pair(c.adam_betas),
          lambda c: f"must be a pair of numbers, got {c.adam_betas!r}", False),
    _Rule("adam_betas", lambda c: all(0 <= x < 1 for x in c.adam_betas), "each β must be in [0, 1)"),
    _Rule("adam_eps", lambda c: c.adam_eps > 0, "must be > 0"),
    _Rule("weight_decay", lambda c: c.weight_decay >= 0, "must be ≥ 0"),
    _Rule("max_grad_norm", _optional("max_grad_norm", lambda v: v > 0), "must be > 0 or None"),
    _Rule("steps_per_generation", lambda c: c.steps_per_generation is None or (
        1 <= c.steps_per_generation <= c.num_completions and c.num_completions % c.steps_per_generation == 0),
          lambda c: f"must divide N = B·G = {c.num_completions}"),
    _Rule("micro_batch_size", lambda c: c.micro_batch_size is None
          or 1 <= c.micro_batch_size <= c.rows_per_optimizer_step,
          lambda c: f"must be in [1, {c.rows_per_optimizer_step}] (rows per optimizer step) or None"),
    _Rule("micro_batch_size", lambda c: c.micro_batch_size is None
          or c.rows_per_optimizer_step % c.micro_batch_size == 0,
          lambda c: f"must divide the {c.rows_per_optimizer_step} rows of an optimizer step"),
    # ---- rewards
    _Rule("engine_depth", lambda c: c.engine_depth >= 1, "must be ≥ 1"),
    _Rule("engine_multipv", lambda c: c.engine_multipv >= 1, "must be ≥ 1"),
    _Rule("engine_workers", lambda c: c.engine_workers >= 1, "must be ≥ 1"),
    _Rule("engine_timeout", lambda c: c.engine_timeout > 0, "must be > 0 seconds"),
    # ---- evaluation
    _Rule("heldout_n", lambda c: c.heldout_n >= 0, "must be ≥ 0"),
    _Rule("eval_max_new_tokens", lambda c: c.eval_max_new_tokens > 0, "must be > 0"),
    _Rule("top_k_alternatives", lambda c: c.top_k_alternatives >= 0, "must be ≥ 0"),
    # ---- hardware
    _Rule("device", lambda c: _device_name(c.device, "auto"), "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    _Rule("reference_device", lambda c: _device_name(c.reference_device, "same"),
          "must be 'same', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
)
