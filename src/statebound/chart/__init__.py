"""Charts: safe SCXML parsing, validation, and the immutable compiled model."""

from .compiler import compile_chart, compile_file, parse_duration, parse_instant
from .model import Chart, StateNode, TimeoutSpec, Transition

__all__ = ["Chart", "StateNode", "Transition", "TimeoutSpec", "compile_chart", "compile_file",
           "parse_duration", "parse_instant"]
