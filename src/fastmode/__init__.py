"""fastmode: an LLM inference server whose headline is a real, measured fast mode."""

from fastmode.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # `LLM` pulls in torch; import it on first use so `fastmode plan` stays light.
    if name == "LLM":
        from fastmode.llm import LLM

        return LLM
    raise AttributeError(name)
