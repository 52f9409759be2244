"""writescope: long-context MoE inference on one budgeted GPU."""
from .core import (CompletionOutput, GuidedDecodingParams, Logprob, RequestOutput,
                   RequestOutputKind, SamplingParams, StructuredOutputsParams)
from .llm import LLM

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "RequestOutputKind", "StructuredOutputsParams", "GuidedDecodingParams"]
__version__ = "0.1.0"
