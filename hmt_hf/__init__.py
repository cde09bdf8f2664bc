"""hmt_hf: the Hierarchical Memory Transformer (arXiv 2405.06067) for any Hugging Face decoder-only causal LM."""

from transformers import AutoConfig, AutoModelForCausalLM

from .configuration_hmt import HMTConfig
from .memory_hmt import (
    HMTMemory,
    HMTMemoryState,
    MemoryEmbeddingGenerator,
    MemorySearch,
    RepresentationEncoder,
    SensoryMemory,
)
from .modeling_hmt import HMTCausalLMOutput, HMTForCausalLM, HMTPreTrainedModel
from .streaming import HMTStream, StreamScore

__version__ = "0.1.0"

AutoConfig.register(HMTConfig.model_type, HMTConfig, exist_ok=True)
AutoModelForCausalLM.register(HMTConfig, HMTForCausalLM, exist_ok=True)
# save_pretrained then writes `auto_map` and copies the remote-code files beside the weights.
HMTConfig.register_for_auto_class()
HMTForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "HMTCausalLMOutput",
    "HMTConfig",
    "HMTForCausalLM",
    "HMTMemory",
    "HMTMemoryState",
    "HMTPreTrainedModel",
    "HMTStream",
    "MemoryEmbeddingGenerator",
    "MemorySearch",
    "RepresentationEncoder",
    "SensoryMemory",
    "StreamScore",
]
