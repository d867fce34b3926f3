"""The hand-written loop's fault sets (`lab.handloop` re-exports every name here): each maps a fault written into
the loop to the phase it breaks first and the cause code a diagnosis should name, and each `*_SETTINGS` the
`LoopConfig` keywords a fault needs to change the step at all. Data only: the faults themselves live in the loop
(`if fault == "name"` where the bug is) and in the helpers it calls (`faults_fresh`, `faults_novel`,
`faults_sixth`, `faults_seventh`, `faults_eighth`)."""
from __future__ import annotations

# fault → (phase it breaks, the finding code that names it; "" = the phase alone: no known mechanism)
FAULTS = {
    "rows_prompt_major": ("generation", "rows_not_grouped"),
    "mask_after_eos": ("generation", "tokens_after_eos_trained"),
    "mask_drops_eos": ("generation", "eos_not_in_mask"),
    "reward_shift": ("rewards", "reward_rows_misaligned"),
    "reward_wrong_labels": ("rewards", "rewards_other_labels"),
    "adv_no_std": ("advantages", "declaration_mismatch"),        # the loop computes scale_rewards='none'
    "adv_grouping_stride": ("advantages", "advantage_grouping"),
    "adv_ddof0": ("advantages", "advantage_std_ddof"),
    "sampler_no_temperature": ("scoring", "temperature_not_applied"),
    "logps_no_temperature": ("scoring", "temperature_not_applied"),
    "logps_no_position_ids": ("scoring", "position_ids_left_pad"),
    "logps_unshifted": ("scoring", "logits_not_shifted"),
    "ref_is_policy": ("scoring", "reference_tracks_policy"),
    "loss_kl_sign": ("loss", "kl_sign_flipped"),
    "loss_adv_sign": ("loss", "loss_advantage_sign"),
    "loss_wrong_aggregation": ("loss", "declaration_mismatch"),  # the loop computes another loss_type
    "accum_no_divide": ("gradient", "gradient_scaled"),
    "no_zero_grad": ("gradient", "gradient_not_zeroed"),
    "optimizer_reset": ("update", "optimizer_state_reset"),
    "no_clip": ("update", "grad_clip_not_applied"),
    "lr_changed": ("update", "update_scaled"),
    "no_step": ("update", "optimizer_no_op"),
}
# written after an earlier version of the replay's checks was frozen; the generic fits were written after them, so
# these are no longer held out (the faults in FROZEN_FAULTS are): the cause is the code a fit names, "" where none does
HELDOUT_FAULTS = {
    "sampler_top_k": ("scoring", "sampler_logps_after_warping"),   # samples from the top-5 renormalised; records those
    "completion_texts_rolled": ("generation", "completion_text_misaligned"),   # texts of the next row scored
    "mask_shifted": ("generation", "generation_shifted"),   # the loss mask shifted one token right
    "reward_negated": ("rewards", "reward_sign_flipped"),
    "adv_not_centred": ("advantages", "advantage_not_centered"),
    "adv_clipped": ("advantages", "advantages_clamped"),    # advantages clipped to ±0.5 (not declared)
    "ref_refreshed": ("scoring", "reference_tracks_policy"),   # the reference re-copied from the policy each step
    "scoring_bf16": ("scoring", "declaration_mismatch"),    # the loss forward under bf16 autocast, declared fp32
    "ratio_inverted": ("loss", "loss_terms"),               # ratio = exp(ℓ_old − ℓ)
    "entropy_bonus_undeclared": ("loss", "loss_terms"),     # + 0.01 · ℓ per token added to the loss
    "zero_grad_per_micro_batch": ("gradient", "gradient_micro_batches"),   # only the last micro-batch's survives
    "grad_doubled_by_hook": ("gradient", "gradient_scaled"),   # a gradient hook that multiplies by 2
    "weight_decay_changed": ("update", "update_along_weights"),   # weight decay raised after the snapshot
    "clip_after_step": ("update", "grad_clip_not_applied"),
    "lr_zero": ("update", "optimizer_no_op"),           # a schedule at 0 for this step
}
# faults that only exist in a loop of a given shape (the setting they need)
SHAPE_FAULTS = {
    "sampler_not_synced": ("generation", "sampler_weights_stale"),    # the sampler copy is never synced
    "old_logps_recomputed": ("scoring", "logps_from_other_weights"),  # π_old recomputed on every pass
}
# written after the generic fits and the declaration fits were frozen (the commit that froze them is named in
# docs/DIAGNOSIS.md), scored against them unchanged
FROZEN_FAULTS = {
    "reward_scaled_half": ("rewards", "rewards_scaled"),                  # a reward weight of 0.5 left in
    "reward_clamped": ("rewards", "rewards_clamped"),                     # rewards capped at 0.3
    "adv_reversed_in_group": ("advantages", "advantages_permuted"),       # right per group, then flipped in it
    "adv_times_g": ("advantages", "advantages_scaled"),                   # × G (a sum where a mean was meant)
    "adv_batch_mean": ("advantages", "advantages_affine_per_set"),        # (r − batch mean) / group std
    "adv_std_floor": ("advantages", "advantages_affine_per_set"),         # ÷ max(std_g, 0.3) instead of std_g + ε
    "ref_logps_bf16_stored": ("scoring", "scoring_rounded"),              # reference log-probs kept in bf16
    "sampler_temperature_squared": ("scoring", "scoring_temperature"),    # the sampler divides by T twice
    "logps_mb_order_reversed": ("scoring", "scoring_permuted"),           # micro-batches' log-probs joined reversed
    "kl_beta_squared": ("loss", "loss_terms"),                            # β² where β was meant
    "kl_k1_estimator": ("loss", "declaration_mismatch"),                  # the k1 estimator, k3 declared
    "pg_no_gradient": ("loss", "loss_terms"),                             # the policy term's ratio detached
    "scheduler_stepped_early": ("update", "update_scaled"),               # scheduler.step() before optimizer.step()
    "update_clamped": ("update", "update_clamped"),                       # each weight moves at most 1e-5
    "grad_value_clipped": ("update", "update_grad_clamped"),              # clip_grad_value_(1e-3) before the step
}
# faults whose fitted parameter is a ratio of the step's own counts: the diagnosis must name the counts
STRUCTURE_FAULTS = {
    "dapo_tokens_with_truncated": ("loss", "loss_scaled"),     # ÷ tokens counted before truncated rows are masked
    "dapo_tokens_all_positions": ("loss", "loss_scaled"),      # ÷ N·T: every completion position, padding included
    "loss_divided_by_g": ("loss", "loss_scaled"),              # an extra ÷ G (a mean over the group's rows)
    "ratio_against_ref": ("loss", "loss_wiring"),              # ratio = exp(ℓ − ℓ_ref): the reference for π_old
    "kl_against_old": ("loss", "loss_wiring"),                 # the KL's d = ℓ_old − ℓ: π_old for the reference
    "loss_uses_rewards": ("loss", "loss_wiring"),              # the rewards passed where the advantages belong
}
# written and frozen before the fits of position, precision path, generation and reward memory were written; each is
# a bug class reported against a public trainer, and its cause is what the mechanism says a diagnosis must name
SEALED_FAULTS = {
    "scoring_prompt_right_padded": ("scoring", "scoring_padding_side"),   # the loss forward re-pads prompts right
    "sampler_no_position_ids": ("scoring", "position_ids_left_pad"),      # the sampler's forwards take no position ids
    "logsoftmax_bf16": ("scoring", "logsoftmax_not_upcast"),        # bf16 loop: log_softmax of bf16 logits
    "scoring_fp16": ("scoring", "declaration_mismatch"),            # the loss forward under fp16 autocast, fp32 declared
    "adv_per_micro_batch": ("advantages", "advantage_grouping"),    # standardised over each micro-batch's rows
    "adv_std_over_batch": ("advantages", "declaration_mismatch"),   # ÷ the batch's std (scale_rewards='batch')
    "grpo_length_is_t": ("loss", "declaration_mismatch"),           # per-sequence mean ÷ T, not the row's length
    "old_logps_from_ref": ("scoring", "logps_from_other_weights"),  # π_old's log-probs taken from the reference
    "ref_logps_no_temperature": ("scoring", "temperature_not_applied"),   # the reference's logits not ÷ T
    "clip_per_micro_batch": ("gradient", "gradient_clipped_early"),   # clip_grad_norm_ after each micro-batch
    "reward_first_per_prompt": ("rewards", "reward_cached"),        # a cache keyed by prompt: each group's first reward
    "kl_detached": ("loss", "loss_terms"),                          # the KL's ℓ detached: no gradient through it
}
# written after the sealed set's fits, from bugs of the same trackers, to probe what its fits generalise to (not
# held out: the diagnosis was written before them, but by the same hands)
PROBE_FAULTS = {
    "kl_k3_reversed": ("loss", "kl_direction_reversed"),   # k3 of d = ℓ − ℓ_ref: the estimator of the other direction
    "grpo_sum_not_mean": ("loss", "declaration_mismatch"),   # each row's loss summed over its tokens, not averaged
    "accum_divided_twice": ("gradient", "gradient_scaled"),  # the micro-batch loss ÷ k in the loss and ÷ k again
    "reward_text_with_prompt": ("rewards", "rewards_other_labels"),   # the reward scores prompt + completion
    "clip_max_not_min": ("loss", "clip_bound_reversed"),          # −max(r·A, clip(r)·A): the optimistic bound (later pass)
}
# a second held-out set: written and frozen in its own commit before any fit for them, scored on its first run
# (`python -m rookworld_debug.lab.sealed --only blind`); each expectation is what the bug does, whatever the
# diagnosis had a name for when it was written
BLIND_FAULTS = {
    # the micro-batch loss is its own tokens' mean ÷ k (the gradient-accumulation normaliser bug): bnpo's aggregation
    "accum_token_mean_per_micro_batch": ("loss", "declaration_mismatch"),
    "old_not_detached": ("loss", "loss_terms"),              # π_old = ℓ not detached: the ratio is 1 with no gradient
    "kl_mean_over_all_positions": ("loss", "loss_terms"),   # the KL term ÷ N·T positions, the policy term ÷ its tokens
    "logps_tempered_after_log_softmax": ("scoring", "temperature_after_log_softmax"),   # log_softmax(z) / T
    "reward_length_penalty": ("rewards", "reward_length_term"),   # − 0.002 per completion token, undeclared
    "clip_grad_norm_per_parameter": ("update", "update_clip_per_parameter"),   # each tensor clipped to the max norm
    "sampler_synced_before_step": ("generation", "sampler_weights_stale"),   # the copy synced before opt.step()
}
# a third held-out set, written and frozen the same way (`--only unseen`): bug classes of public trackers that no
# earlier set had, each with what the bug does
UNSEEN_FAULTS = {
    "ref_in_train_mode": ("scoring", "dropout_active"),            # the reference scored with its dropout on
    "sampler_top_p_unrecorded": ("generation", "sampler_distribution_changed"),   # nucleus 0.9, unwarped log-probs kept
    "ref_logps_unshifted": ("scoring", "logits_not_shifted"),      # only the reference's logits taken unshifted
    "kl_summed_per_row": ("loss", "loss_terms"),                   # the KL summed over each row, the PG its row mean
    "adv_first_rows_each_micro_batch": ("loss", "loss_wiring"),    # every micro-batch takes adv[:n_mb], not adv[rows]
    "texts_with_special_tokens": ("generation", "completion_text_misaligned"),   # decoded keeping <|endoftext|>
    "last_micro_batch_no_backward": ("gradient", "gradient_micro_batches"),   # the last micro-batch's backward skipped
    "ref_mixup_each_step": ("scoring", "reference_tracks_policy"),  # ref ← 0.4·ref + 0.6·policy before each rollout
    "adv_whitened_again": ("advantages", "advantages_scaled"),     # group advantages whitened again over the batch
}
# a fourth held-out set, written and frozen the same way (`--only fresh`, with the consecutive-step faults of
# between_steps.FRESH_BETWEEN_FAULTS): bug classes of public trackers that no earlier set had, each with what it does
FRESH_FAULTS = {
    "sampler_one_seed_every_row": ("generation", "sampling_draws_shared"),   # one uniform per position for all rows
    "logps_no_attention_mask": ("scoring", "attention_mask_not_applied"),    # the loss forward attends to the pads
    "logps_padded_vocab": ("scoring", "logsoftmax_over_padded_vocab"),       # log_softmax over 63 zero-logit pad rows
    "kl_penalty_in_reward": ("rewards", "kl_in_reward"),          # r − β·Σ(ℓ_sampler − ℓ_ref), the KL in the loss too
    "ratio_bf16": ("loss", "ratio_low_precision"),                # exp(ℓ − ℓ_old) taken in bf16 (later pass)
    "ratio_clipped_in_log_space": ("loss", "clip_range_log_scale"),   # exp(clamp(ℓ − ℓ_old, ±ε)) for clamp(r, 1 ± ε)
    "dual_clip_every_sign": ("loss", "dual_clip_positive_advantages"),   # min(pg, −3·A) on A > 0 tokens too
    "adv_discounted_per_token": ("loss", "advantage_discounted_per_token"),   # A·0.99^(L − 1 − t) per token
    "checkpointing_blocks_no_grad": ("gradient", "gradient_parameters_missing"),   # only ln_f and the head get grads
    "optimizer_without_vectors": ("update", "parameters_not_in_optimizer"),   # biases and LayerNorms never stepped
    "clip_norm_of_first_shard": ("update", "grad_norm_of_shard"),  # the clip's norm over half the parameters only
}
BLIND_SETTINGS = {"accum_token_mean_per_micro_batch": {"loss_type": "dapo"},
                  "kl_mean_over_all_positions": {"loss_type": "dapo"},
                  "clip_grad_norm_per_parameter": {"max_grad_norm": 0.01},
                  "sampler_synced_before_step": {"separate_sampler": True, "steps": 3}}
# the setting each needs to change the step at all
SEALED_SETTINGS = {"logsoftmax_bf16": {"autocast": "bfloat16"}, "adv_per_micro_batch": {"micro_batches": 4},
                   "old_logps_from_ref": {"num_iterations": 2}, "clip_per_micro_batch": {"max_grad_norm": 1e-3}}
PROBE_SETTINGS = {"clip_max_not_min": {"num_iterations": 2, "lr": 1e-3}}
FRESH_SETTINGS = {"ratio_bf16": {"num_iterations": 2}, "ratio_clipped_in_log_space": {"num_iterations": 2, "lr": 1e-3},
                  "clip_norm_of_first_shard": {"max_grad_norm": 0.01}}
# a fifth held-out set, written and frozen the same way (`--only novel`, with the consecutive-step faults of
# between_steps.NOVEL_BETWEEN_FAULTS): bug classes of public trackers that no earlier set had, each expectation what
# the bug does; the source of each is named beside it
NOVEL_FAULTS = {
    # OpenRLHF issue: a completion cut at the budget gets its last sampled token overwritten with EOS
    "eos_forced_on_truncated": ("generation", "eos_forced_on_truncated"),
    # TRL's GRPOTrainer issue: a reward function returning one value is broadcast to every completion
    "reward_single_value_broadcast": ("rewards", "reward_ignores_completion"),
    # THUDM/slime pull request: rewards reshaped into one global group, standardised over the whole batch
    "adv_whole_batch_one_group": ("advantages", "advantage_grouping"),
    # TRL's GRPOTrainer issue: the sampler's prompt carries a second BOS the trainer's prompt ids lack
    "sampler_prompt_extra_bos": ("scoring", "sampler_prompt_differs"),
    # prime-rl pull request (review): position ids counted from 1 in the loss forward
    "position_ids_from_one": ("scoring", "position_ids_offset"),
    # prime-rl pull request (review): labels shifted left on unshifted logits, ℓ_t is the next token's log-prob
    "logps_labels_shifted_left": ("scoring", "scoring_shifted"),
    # ChenmienTan/RL2 pull request: the ratio clipped to [ε, 1 + ε] where [1 − ε, 1 + ε] was meant (later pass)
    "clip_lower_bound_epsilon": ("loss", "clip_range_lower_bound"),
    # TRL issue (a retain_graph=True workaround): a running loss total backpropagated after each micro-batch
    "backward_on_running_loss": ("gradient", "gradient_micro_batches"),
    # TRL's AlignProp trainer issue: optimizer.step() inside the micro-batch loop (later micro-batches are
    # scored at weights an earlier micro-batch's step already moved)
    "optimizer_step_per_micro_batch": ("scoring", "optimizer_stepped_per_micro_batch"),
}
NOVEL_SETTINGS = {"eos_forced_on_truncated": {"max_new_tokens": 118},
                  "clip_lower_bound_epsilon": {"num_iterations": 2, "lr": 1e-3}}
# a sixth held-out set, written and frozen the same way (`--only sixth`, with the consecutive-step faults of
# between_steps.SIXTH_BETWEEN_FAULTS and the TRL faults of faults_trl.SIXTH_TRL_FAULTS): bug classes of public
# trackers that no earlier set had, each expectation what the bug does; the source of each is named beside it
SIXTH_FAULTS = {
    # transformers' generate (custom stopping criteria; also reported against unsloth and lm-evaluation-harness):
    # a stopping criterion that returns one bool for the batch stops every row when the first row emits EOS
    "batch_stops_at_first_eos": ("generation", "generation_stopped_for_batch"),
    # OpenRLHF pull request (rewards promoted to at least FP32), CarperAI's trlx and THUDM/slime pull requests (a
    # rewards tensor built without a float dtype): rewards written into an integer buffer, truncated toward zero
    "rewards_in_integer_tensor": ("rewards", "rewards_truncated_to_integer"),
    # THUDM/slime pull request (group ordering in the balanced data): the rows reordered to balance the micro-batches'
    # token counts before the (-1, G) reshape that forms the groups, so a group is not one prompt's G rows
    "adv_groups_after_balancing": ("advantages", "advantage_grouping"),
    # transformers pull request (a packed-sequence mask ignored when a 2D all-ones attention mask is passed; TRL's
    # packing without flash attention): rows packed into one sequence attend to the rows packed before them
    "packed_rows_attend_across": ("scoring", "packed_sequences_cross_attend"),
    # TRL's GRPOTrainer pull request (max_prompt_length ignored when generating with vLLM): the trainer scores the
    # prompts cut to max_prompt_length while the sampler generated from the whole prompts
    "prompt_truncated_for_trainer_only": ("scoring", "prompt_tokens_differ"),
    # verl pull request (rollout correction): the truncated importance-sampling weight π_θ / π_sampler not detached,
    # so the policy term's gradient flows through the weight too
    "is_weight_not_detached": ("loss", "importance_weight_not_detached"),
    # DeepSpeed issue (ZeRO with bf16 accumulates gradients in bf16): the accumulation buffer rounded to bf16 after
    # each micro-batch's backward
    "grads_accumulated_in_bf16": ("gradient", "gradient_accumulated_in_bf16"),
    # DeepSpeedExamples (DeepSpeed-Chat) pull request and a transformers issue: a name-based no-decay list
    # ("bias", "LayerNorm.weight") that GPT-2's ln_1 / ln_2 / ln_f weights do not match, so they are decayed
    "norm_weights_decayed": ("update", "weight_decay_on_norm_weights"),
}
SIXTH_SETTINGS = {"norm_weights_decayed": {"weight_decay": 0.1, "lr": 1e-3}}
# the sixth set's one-step healthy controls: the plain loop, and AdamW's two parameter groups over four micro-batches
SIXTH_HEALTHY = ({}, {"weight_decay": 0.1, "lr": 1e-3, "micro_batches": 4})
# a seventh held-out set, written and frozen the same way (`--only seventh`, with the consecutive-step faults of
# between_steps.SEVENTH_BETWEEN_FAULTS, the TRL faults of faults_trl.SEVENTH_TRL_FAULTS and the faults in the
# project's own step of faults_heldout.SEVENTH_STEP_FAULTS): bug classes of public trackers that no earlier set had,
# each expectation what the bug does; the source of each is named beside it
SEVENTH_FAULTS = {
    # ColossalAI issue (an actor's action mask cut with [:, 1:]), DeepSpeedExamples issue (the actor loss's mask
    # sliced from the wrong start) and a minimind pull request (the loss mask's boundary leaves out the first answer
    # token): the first completion token is left out of the loss mask
    "mask_drops_first_token": ("generation", "first_token_not_in_mask"),
    # NVIDIA-NeMo/RL pull request (record the log-prob of the sampled token; also a TRL vLLM-server review): the
    # sampler's log-prob read as the first entry of vLLM's per-position logprob dictionary, the top-ranked token's
    "sampler_logps_of_top_token": ("scoring", "sampler_logps_other_token"),
    # rllm issue and pull request (a log-prob list shorter than the completion's ids zero-padded at its tail to the
    # action length): each row's last sampled token gets a sampler log-prob of 0
    "sampler_logps_tail_zero_padded": ("scoring", "sampler_logps_zero_padded"),
    # an issue against a GRPO tutorial's example code (the ratio taken of SUMMED sequence log-probs, the product of
    # the token ratios) and a pull request of a GRPO trainer (GSPO's length-normalised sequence ratio): the ratio
    # exp(Σ_t (ℓ − ℓ_old)) per row where the token ratios were meant
    "ratio_sequence_summed": ("loss", "sequence_ratio_not_length_normalised"),
    # NVIDIA/Megatron-LM pull requests (the tied embedding and output weight counted twice in the global gradient
    # norm, so the gradient is over-clipped): clip_grad_norm_'s norm counts the tied wte / lm_head gradient twice
    "grad_norm_counts_tied_twice": ("update", "grad_norm_counts_shared_twice"),
    # pytorch/examples issue and Pytorch-UNet issue and pull request (clip_grad_norm_ before scaler.unscale_): the
    # gradient clipped while it still carries the loss scale of 2^16, then unscaled by the optimizer step
    "clip_before_unscale": ("update", "clip_before_unscale"),
}
SEVENTH_SETTINGS = {"ratio_sequence_summed": {"num_iterations": 2, "lr": 1e-3},
                    "grad_norm_counts_tied_twice": {"max_grad_norm": 0.01}}
# the seventh set's one-step healthy controls: the plain loop, two optimizer passes over four micro-batches (the pass
# declared), and bf16 autocast with AdamW's two parameter groups
SEVENTH_HEALTHY = ({}, {"num_iterations": 2, "micro_batches": 4},
                   {"autocast": "bfloat16", "weight_decay": 0.1, "lr": 1e-3})
# an eighth held-out set, written and frozen the same way (`--only eighth`, with the consecutive-step faults of
# between_steps.EIGHTH_BETWEEN_FAULTS, the TRL faults of faults_trl.EIGHTH_TRL_FAULTS and the faults in the project's
# own step of faults_heldout.EIGHTH_STEP_FAULTS): bug classes of public trackers, none an earlier set's mechanism,
# each expectation what the bug does; the source of each is named beside it
EIGHTH_FAULTS = {
    # huggingface/trl pull request (the attention mask was not passed to the GRPO forward) and huggingface/transformers
    # issues (a GPT model's generate() attending the left padding of a batch): the sampler's forwards get no attention
    # mask, so each completion is sampled attending its prompt's left padding, while the trainer scores with the mask
    "sampler_no_attention_mask": ("scoring", "attention_mask_not_applied"),
    # verl issue (Dr. GRPO's seq-mean-token-sum-norm sums the sequences' losses, divided by the horizon but not
    # averaged over them: the loss and gradient are the micro-batch size times too large): under loss_type dr_grpo each
    # micro-batch's loss the sum over its rows of the row's token sum / T, not their mean
    "dr_grpo_rows_summed": ("loss", "loss_summed_over_rows"),
    # huggingface/trl pull requests and the issue they close (the KL's bias correction multiplied by the sequence-level
    # importance ratio, (B, 1), under importance_sampling_level = "sequence": a spurious gradient term (Σ_t k3)·∇ mean
    # log π): the per-token k3 KL corrected by exp(mean_t(ℓ − ℓ_old)) of its row, not by its own token's ratio
    "kl_corrected_by_sequence_ratio": ("loss", "kl_correction_sequence_ratio"),
    # facebookresearch/mmf pull request (parameters tied to a head put in the optimizer twice: "optimizer contains a
    # parameter group with duplicate parameters") and a zhuhanqing/APOLLO issue (tied embedding and LM head in the
    # optimizer's groups twice): AdamW built over named_parameters(remove_duplicate=False), the tied wte / lm_head
    # weight stepped twice per optimizer step
    "tied_weight_stepped_twice": ("update", "tied_weight_stepped_twice"),
    # huggingface/trl issue (a trainer's grouping by num_generations while another group size applies, rewards
    # misgrouped) and a huggingface/trl issue (the group size GRPO used was not the configured num_generations): the
    # group statistics taken over groups of G/2 rows, each half of a prompt's completions its own group
    "adv_groups_half_size": ("advantages", "advantage_grouping"),
    # an AndreHe02/rewarding-unlikely-release issue (in its verl trainer the last mini-batch has fewer rows while the
    # accumulation's denominator is constant) and a
    # databricks/compose-rl pull request (micro-batch sizes that do not divide the batch: each micro-batch's mean
    # weighted alike): each micro-batch's per-sequence loss averaged over its own rows, then divided by the number of
    # micro-batches, over micro-batches of 3, 3 and 2 rows
    "micro_batch_rows_mean": ("loss", "micro_batches_weighted_equally"),
}
EIGHTH_SETTINGS = {"dr_grpo_rows_summed": {"loss_type": "dr_grpo"}, "micro_batch_rows_mean": {"micro_batches": 3}}
# the eighth set's one-step healthy controls: the plain loop, a learning-rate schedule with warm-up over three steps,
# micro-batches of unequal size, and truncated completions masked out of the loss
EIGHTH_HEALTHY = ({}, {"scheduler": True, "warmup_steps": 2, "steps": 3}, {"micro_batches": 3},
                  {"mask_truncated": True, "max_new_tokens": 48})
ALL_FAULTS = {**FAULTS, **HELDOUT_FAULTS, **SHAPE_FAULTS, **FROZEN_FAULTS, **STRUCTURE_FAULTS, **SEALED_FAULTS,
              **PROBE_FAULTS, **BLIND_FAULTS, **UNSEEN_FAULTS, **FRESH_FAULTS, **NOVEL_FAULTS, **SIXTH_FAULTS,
              **SEVENTH_FAULTS, **EIGHTH_FAULTS}
