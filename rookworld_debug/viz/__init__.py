"""Views over GRPO step records: token strips (HTML), tables (pandas Stylers), plots (plotly), boards.

Views never compute GRPO math; they render what the phases recorded, each number with its definition.
"""
from .tokens import METRICS, Metric, TokenStrip, token_metric_stack, token_strip, token_strips
from .htmlview import HTMLView

__all__ = ["METRICS", "Metric", "TokenStrip", "HTMLView", "token_strip", "token_strips",
           "token_metric_stack"]
