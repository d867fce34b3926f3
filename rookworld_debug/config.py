"""`StepConfig`: every knob and convention of ONE GRPO step, in one frozen, documented dataclass.

Each field carries its documentation in `metadata["help"]` so the glossary is renderable at run time
(`StepConfig.glossary()`, `StepConfig.glossary_markdown()`); papermill parameters map 1:1 onto
`to_dict()` / `from_dict()`.

Defaults follow rookworld-trl's manual debug run (B=4 prompts, G=4 generations, β=0.1, lr 1e-6, AdamW 0.9/0.999/1e-8,
wd 0, grad-clip 1.0, task-conditional sampling); every *convention* (loss_type, KL estimator, advantage
scaling, ε, δ, importance-sampling level, entropy normalisation) defaults to what TRL's `GRPOConfig` does,
so a fresh config reproduces TRL's math on our rollout.

An objective family's own knobs are declared by the family, in its settings section (`rookworld_debug.settings`),
and read and written flat like the core's: `StepConfig(**{knob: value})`, `config.<knob>`, `to_dict()`. The loss
types are those the registered families answer (`grpo.families`).

Impossible values are rejected at construction with `ConfigError(field, message)` (the rules:
`config_rules.py`; a family's: its section's).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from rookworld_debug import settings
from rookworld_debug.config_rules import RULES
from rookworld_debug.errors import ConfigError

__all__ = ["StepConfig", "LOSS_TYPES", "KL_ESTIMATORS", "SCALE_REWARDS", "TASKS", "REWARD_MODES"]

KL_ESTIMATORS = ("k3", "k1", "k2", "full")
SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
TASKS = ("P", "A", "mixed")
REWARD_MODES = ("engine", "dataset", "rlvr", "rlvr_gt")
DTYPES = ("float32", "float64", "bfloat16", "float16")
_f = settings.setting


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
    loss_type: str = _f("dapo", "Which objective the step trains: a loss type of a registered objective family "
                        "(grpo.families; TRL's GRPOTrainer's 'dapo' by default). Each loss type's definition follows; "
                        "its formulas: grpo/objective/loss.py and the family's module.", group="objective")
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
    keep_weights: str = _f("auto", "Keep the replay's weights, gradient, optimizer state and reference in state/: "
                           "'auto' up to 20 M parameters (the embedded model, ~120 MB a step), 'always', 'never'.",
                           choices=("auto", "always", "never"), group="eval")
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

    # the objective families' own knobs: one section per family (rookworld_debug.settings), read and set flat
    family_settings: tuple = field(default=(), metadata={})

    # ================================================================= validation
    def __post_init__(self):
        """Normalise papermill/JSON shapes and types, then apply the rules in order (config_rules.RULES): the first
        rule a value breaks raises ConfigError(field, message)."""
        s = object.__setattr__
        if self.scale_rewards is True:                 # TRL's bool spelling
            s(self, "scale_rewards", "group")
        elif self.scale_rewards is False:
            s(self, "scale_rewards", "none")
        settings.check(self, RULES, {"loss_type": settings.loss_types()})     # a list becomes a tuple there
        s(self, "adam_betas", (float(self.adam_betas[0]), float(self.adam_betas[1])))   # a checked number pair

    def __getattr__(self, name: str):
        """A family's knob, read flat (`config.<knob>`) from its section."""
        if name.startswith("__") or name == "family_settings":
            raise AttributeError(name)
        owner = settings.owner(name)
        if owner is not None:
            return getattr(self.section(owner), name)
        raise AttributeError(f"'StepConfig' object has no attribute {name!r}")

    def section(self, name: str):
        """The settings section `name` of an objective family (its defaults if the config predates its family)."""
        for sec in self.family_settings:
            if sec.SECTION == name:
                return sec
        cls = {c.SECTION: c for c in settings.sections()}.get(name)
        if cls is None:
            raise ConfigError("family_settings", f"no settings section {name!r} (known: "
                                                 f"{[c.SECTION for c in settings.sections()]})")
        return cls()

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
        """Plain JSON-able dict, one key per setting, the families' flat (tuples become lists): the papermill
        parameters."""
        out = {}
        for name in self.field_names():
            v = getattr(self, name)
            out[name] = list(v) if isinstance(v, tuple) else v
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
        """Every setting's name: the core's, each family section's after the objective's."""
        return tuple(f.name for f in settings.all_fields(cls))

    @classmethod
    def __record_fields__(cls) -> tuple:
        """What a trace stores: every setting, flat (grpo/trace/serialize.py)."""
        return cls.field_names()

    @classmethod
    def glossary(cls) -> dict:
        """{setting: {"default", "group", "help", "nullable", "rollout", "choices"?}} for every setting, in
        declaration order (loss_type's help ends with each registered loss type's definition)."""
        return settings.glossary(cls)

    @classmethod
    def glossary_markdown(cls) -> str:
        """The glossary as a Markdown table (field | default | meaning)."""
        return settings.glossary_markdown(cls.glossary())


def core_field_names() -> tuple:
    """The core's settings (no family's)."""
    return tuple(f.name for f in dataclasses.fields(StepConfig) if "help" in f.metadata)


_dataclass_init = StepConfig.__init__


def _init(self, *args, family_settings: tuple = (), **kw):
    """StepConfig(**core, **family knobs): each family knob goes to its section."""
    secs = settings.family_sections(family_settings, kw, _CORE_NAMES)
    _dataclass_init(self, *args, family_settings=secs, **kw)


_CORE_NAMES = frozenset(core_field_names()) | {"family_settings"}
settings.reserve(_CORE_NAMES)
StepConfig.__init__ = _init


def __getattr__(name: str):
    if name == "LOSS_TYPES":                 # the loss types the registered objective families answer
        return settings.loss_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
