import os
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Test the checkout these tests live in, whatever else is installed.
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(__file__)]

from tiny_backbones import tiny_config  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hmt_hf import HMTForCausalLM  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: on the shared 2-core CI machine, two threads spin-wait on each other
    between tiny matrix products (a 10-step training run went from 0.5 s to 13 s). Use with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Small HMT: 8 new tokens per segment, so a 29-token input has 3 full segments and a partial one, and the cache
# (N=3) is full and evicting by the last segment.
SMALL_HMT = {"segment_length": 8, "sensory_memory_size": 3, "representation_length": 4, "num_memory_embeddings": 3}


def make_hmt(model_type: str = "llama", seed: int = 0, **fields) -> HMTForCausalLM:
    """A tiny random backbone of `model_type` wrapped as an HMT, in eval mode."""
    torch.manual_seed(seed)
    backbone = AutoModelForCausalLM.from_config(tiny_config(model_type))
    return HMTForCausalLM.from_backbone(backbone, **{**SMALL_HMT, **fields}).eval()


@pytest.fixture
def hmt():
    return make_hmt()
