"""writescope: long-context MoE inference on one budgeted GPU.

The names below are imported on first use (PEP 562), so that ``writescope``'s command line
starts inside its own ``main`` -- where Ctrl-C during the seconds torch takes to import is one
line, not a traceback -- and ``from writescope import LLM`` works as before."""
import importlib

_EXPORTS = {"LLM": ".llm", "SamplingParams": ".core", "RequestOutput": ".core",
            "CompletionOutput": ".core", "Logprob": ".core", "RequestOutputKind": ".core",
            "StructuredOutputsParams": ".core", "GuidedDecodingParams": ".core",
            "BeamSearchParams": ".engine.beam", "BeamSearchOutput": ".engine.beam",
            "BeamSearchSequence": ".engine.beam"}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])
