"""The pure interpreter: the W3C SCXML algorithm over immutable positions."""

from .interpreter import Interpreter
from .state import ArmedTimeout, Invocation, Position

__all__ = ["Interpreter", "Position", "Invocation", "ArmedTimeout"]
