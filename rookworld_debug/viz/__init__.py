"""Views over GRPO step records: token strips (HTML), tables (pandas Stylers), plots (plotly), boards,
warning banners. Views never compute GRPO math; they render what the phases recorded, each number
with its definition.

Two layers:
- plain-array views (`token_strip`, `advantage_table`, `loss_waterfall`, …): lists/arrays/tensors + labels;
- `*_from_trace` adapters: pick the fields out of a StepTrace (or any object with `rollout`, `rewards`,
  `advantages`, `loss`, `update`, `evaluation`, `setup` attributes).

In a notebook call `setup_notebook_rendering()` once so exported HTML carries plotly.js (offline).
"""
from .adapters import (advantage_table_from_trace, banner_from_trace, before_after_figure_from_trace,
                       before_after_table_from_trace, board_from_trace, completion_metrics_from_trace, completion_token_texts, decode_bpe_token,
                       delta_logp_scatter_from_trace, flags_from_trace, grad_norms_from_trace,
                       invariants_table_from_trace, loss_waterfall_from_trace, per_sequence_kl_from_trace,
                       provenance_table_from_trace, reward_breakdown_from_trace, reward_components_table_from_trace,
                       rollout_token_strips, token_heatmap_from_trace, token_strips_from_trace)
from .banners import Flag, flags_from_records, warning_banner
from .diagnosis import diagnosis_card, diagnosis_card_from_trace
from .fix_card import fix_card, fix_card_from_trace
from .board import BoardView, board_from_a, board_from_p, board_from_prompt, board_view
from .htmlview import HTMLView
from .completions import completion_name, completions_rows, completions_table, completions_table_from_trace
from .summary import details_view, executive_summary_from_trace, invariants_note, written_by
from .replay import ReplayView, replay_figure, replay_table, replay_tokens, replay_view
from .capture import capture_table_from_trace
from .signal import (group_cosine_figure_from_trace, group_size_figure_from_trace, sampler_gap_figure_from_trace,
                     signal_noise_from_trace)
from .iterations import (iteration_ratio_histogram_from_trace, iteration_table_from_trace,
                         iteration_token_strips_from_trace, loss_type_comparison_from_trace,
                         loss_type_comparison_table)
from .rlvr import (rlvr_cosine_table, rlvr_findings_from_trace, rlvr_findings_table, rlvr_side_by_side_figure,
                   rlvr_side_by_side_from_trace, rlvr_side_by_side_table)
from .plots import (before_after_figure, delta_logp_scatter, grad_norm_figure, loss_waterfall, per_sequence_bar,
                    reward_breakdown_figure, setup_notebook_rendering, steps_figure, token_heatmap)
from .tables import (advantage_table, before_after_table, invariants_table, metrics_table, provenance_table,
                     reward_components_table)
from .tokens import (METRICS, Metric, TokenStrip, TokenText, token_metric_stack, token_strip, token_strips, token_text,
                     token_text_from_raw)

__all__ = [
    # rookworld-rlvr's mini beside TRL's objectives; its findings
    "rlvr_side_by_side_from_trace", "rlvr_side_by_side_table", "rlvr_side_by_side_figure", "rlvr_cosine_table",
    "rlvr_findings_table", "rlvr_findings_from_trace",
    # token strips
    "METRICS", "Metric", "TokenStrip", "token_strip", "token_strips", "token_metric_stack", "HTMLView",
    "TokenText", "token_text", "token_text_from_raw",
    # tables
    "advantage_table", "reward_components_table", "before_after_table", "invariants_table", "provenance_table",
    "metrics_table",
    # plots
    "setup_notebook_rendering", "reward_breakdown_figure", "loss_waterfall", "token_heatmap", "per_sequence_bar",
    "grad_norm_figure", "before_after_figure", "delta_logp_scatter", "steps_figure",
    # board, banners
    "BoardView", "board_view", "board_from_p", "board_from_a", "board_from_prompt",
    "Flag", "warning_banner", "flags_from_records", "diagnosis_card", "diagnosis_card_from_trace",
    "fix_card", "fix_card_from_trace",
    # adapters over records / StepTrace
    "decode_bpe_token", "completion_token_texts", "rollout_token_strips", "token_strips_from_trace",
    "completion_metrics_from_trace",
    "advantage_table_from_trace", "reward_components_table_from_trace", "reward_breakdown_from_trace",
    "loss_waterfall_from_trace", "token_heatmap_from_trace", "per_sequence_kl_from_trace", "grad_norms_from_trace",
    "before_after_table_from_trace", "before_after_figure_from_trace", "delta_logp_scatter_from_trace",
    "board_from_trace", "flags_from_trace", "banner_from_trace", "invariants_table_from_trace",
    "provenance_table_from_trace",
    # the step at a glance
    "completion_name", "completions_rows", "completions_table", "completions_table_from_trace",
    "executive_summary_from_trace", "details_view", "written_by", "invariants_note",
    # the replay of a step, phase by phase (diagnosis.diagnose_step)
    "ReplayView", "replay_view", "replay_table", "replay_tokens", "replay_figure",
    # a step captured from TRL's GRPOTrainer
    "capture_table_from_trace",
    # signal or noise
    "signal_noise_from_trace", "group_cosine_figure_from_trace", "group_size_figure_from_trace",
    "sampler_gap_figure_from_trace",
    # inner PPO iterations and the loss-type comparison
    "iteration_table_from_trace", "iteration_ratio_histogram_from_trace", "iteration_token_strips_from_trace",
    "loss_type_comparison_from_trace", "loss_type_comparison_table",
]
