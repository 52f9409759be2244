"""writescope: long-context MoE inference on one budgeted GPU."""
from .core import RequestOutput, SamplingParams
from .llm import LLM

__all__ = ["LLM", "SamplingParams", "RequestOutput"]
__version__ = "0.1.0"
