#!/usr/bin/env python
"""Does HMT's memory help? Held-out perplexity of HMT against the chunked backbone, sample by sample.

Two measurements (both on the test split of the offline corpora, `hmt-hf prepare-data NAME --output-dir DIR`):

* `untrained`: a freshly converted HMT (`from_backbone`, memory parameters untrained) in the default layout
  (`attention_sink=True, normalize_memory=True`) and as the paper writes it (both False, Eq. 1-5: the raw final
  hidden state as memory, at position 0), against the plain chunked backbone at the same L. Plus the diagnostics that explain the difference:
  per-segment losses, attention mass on position 0, memory-embedding norms, retrieval-weight entropy.
* `trained`: checkpoints written by `examples/train_hmt.py` with `--method hmt|rmt|chunked` on the same windows,
  steps and schedule: HMT (paper and causal retrieval) and RMT against the chunked baselines.

Every sample is a contiguous piece of the concatenated test documents (an EOS between documents), cut without
overlap and spread over the stream; each model scores the same samples. Two protocols from the same forward pass:
`all_tokens` (every target 1..T-1) and `last_segment` (the paper's: the targets of the sample's last segment).
Perplexities are token-weighted over samples; `worst`/`best` are the extreme per-sample ratios to the reference.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/memory_quality.py untrained --corpora books,wiki,arxiv \\
        --lengths 1024,4096,16384 --output reports/untrained_memory
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/memory_quality.py trained --corpora books,wiki \\
        --lengths 2048,8192,16384 --checkpoint HMT=runs/books-cpu/hmt/stage2 ... --output reports/books_cpu
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch  # noqa: I001
from common import load_tokenizer, set_threads, smollm2_location

from hmt_hf import HMTForCausalLM
from hmt_hf.evaluation import ChunkedTransformer, HMTScorer, comparison

# The package default (attention sink, normalized memory) and the paper's Eq. 1-5 exactly, on the same weights.
LAYOUTS = {
    "default": {"attention_sink": True, "normalize_memory": True},
    "paper_layout": {"attention_sink": False, "normalize_memory": False},
}


def scorers_untrained(model: HMTForCausalLM) -> dict:
    length = model.config.segment_length
    return {
        f"chunked (L={length})": ChunkedTransformer(model.backbone, length),
        "HMT default": HMTScorer(model, name="HMT default", overrides=LAYOUTS["default"]),
        "HMT paper (Eq. 1-5)": HMTScorer(model, name="HMT paper", overrides=LAYOUTS["paper_layout"]),
    }


def load_checkpoint(path: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, AutoConfig.from_pretrained(path)


def scorers_trained(checkpoints: dict[str, str]) -> dict:
    """`NAME=PATH` checkpoints: HMT folders are scored in both retrieval modes (RMT ones as they are), plain
    backbones (a chunked run's `backbone` folder) as chunked models at `chunk_length` from `NAME` (`...L=1024`)."""
    scorers = {}
    for name, path in checkpoints.items():
        model, config = load_checkpoint(path)
        if config.model_type == "hmt" and config.use_sensory_memory:
            scorers[f"{name} (paper retrieval)"] = HMTScorer(model, name=name, overrides={"retrieval_mode": "paper"})
            scorers[f"{name} (causal retrieval)"] = HMTScorer(model, name=name, overrides={"retrieval_mode": "causal"})
        elif config.model_type == "hmt":
            scorers[name] = HMTScorer(model, name=name, overrides={"use_memory_search": False})
        else:
            chunk = int(name.rsplit("L=", 1)[1].rstrip(")")) if "L=" in name else None
            if chunk is None:
                raise SystemExit(f"--checkpoint {name}={path}: a plain backbone needs its chunk length in the name")
            scorers[name] = ChunkedTransformer(model, chunk)
    return scorers


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("untrained", "trained", "summary"), help="summary: rewrite summary.md")
    parser.add_argument("--corpora", default="books,wiki,arxiv")
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--num-samples", type=int, default=3, help="samples per corpus and length (at most)")
    parser.add_argument("--max-tokens", type=int, default=None, help="at most this many tokens per corpus and length")
    parser.add_argument("--data-root", default="data", help="folder holding prepare-data's books/wiki/arxiv")
    parser.add_argument("--backbone", default="smollm2", help="untrained: backbone to convert (smollm2 or folder)")
    parser.add_argument("--checkpoint", action="append", default=[], help="trained: NAME=PATH (repeat)")
    parser.add_argument("--reference", default=None, help="model the ratios are taken against (default: first)")
    parser.add_argument("--segment-length", type=int, default=256)
    parser.add_argument("--sensory-memory-size", type=int, default=32)
    parser.add_argument("--representation-length", type=int, default=128)
    parser.add_argument("--num-memory-embeddings", type=int, default=300)
    parser.add_argument("--diagnostics-length", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", required=True, help="folder for metrics.json and summary.md")
    args = parser.parse_args()
    set_threads(args.threads)
    start = time.time()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    if args.mode == "summary":
        return comparison.write_summary(json.loads((output / "metrics.json").read_text()), output)

    if args.mode == "untrained":
        backbone, gguf = smollm2_location() if args.backbone == "smollm2" else (args.backbone, None)
        tokenizer = load_tokenizer(args.backbone)
        torch.manual_seed(0)
        model = HMTForCausalLM.from_backbone(
            backbone, gguf_file=gguf, segment_length=args.segment_length,
            sensory_memory_size=args.sensory_memory_size, representation_length=args.representation_length,
            num_memory_embeddings=args.num_memory_embeddings,
        ).eval()  # fmt: skip
        scorers = scorers_untrained(model)
        budgets, curves = {}, {}
        weights = f"{args.backbone} backbone, freshly converted: HMT memory parameters UNTRAINED (seed 0)"
    else:
        checkpoints = dict(item.rsplit("=", 1) for item in args.checkpoint)  # names may hold "=" (L=256)
        if not checkpoints:
            raise SystemExit("trained: pass --checkpoint NAME=PATH for each model")
        missing = [f"{name}={path}" for name, path in checkpoints.items() if not Path(path, "config.json").is_file()]
        if missing:  # before any model loads
            raise SystemExit(f"trained: no checkpoint (config.json) at {', '.join(missing)}; train it first.")
        scorers = scorers_trained(checkpoints)
        tokenizer = load_tokenizer(next(iter(checkpoints.values())))
        model = next((s.model for s in scorers.values() if isinstance(s, HMTScorer)), None)
        weights = "trained checkpoints: " + ", ".join(f"{k}={v}" for k, v in checkpoints.items())
        budgets = {name: comparison.training_budget(path) for name, path in checkpoints.items()}
        curves = {name: comparison.learning_curve(path) for name, path in checkpoints.items()}
    reference = args.reference or next(iter(scorers))
    results, diagnostics = comparison.compare(
        scorers, args.corpora.split(","), [int(n) for n in args.lengths.split(",")], tokenizer, args.data_root,
        args.segment_length, args.num_samples, reference, args.diagnostics_length, model,
        LAYOUTS if args.mode == "untrained" else None, log=lambda line: print(line, flush=True),
        max_tokens=args.max_tokens,
    )  # fmt: skip
    document = {
        "benchmark": f"memory_quality {args.mode}",
        "weights": weights,
        "reference": reference,
        "hmt": {
            "segment_length": args.segment_length,
            "sensory_memory_size": args.sensory_memory_size,
            "representation_length": args.representation_length,
            "num_memory_embeddings": args.num_memory_embeddings,
        },  # fmt: skip
        "protocols": {
            "all_tokens": "every target 1..T-1 of each sample",
            "last_segment": "the targets of each sample's last segment (the paper's protocol)",
        },
        "training_budget": budgets,
        "learning_curves": curves,
        "results": results,
        "diagnostics": diagnostics,
        "wall_seconds": round(time.time() - start, 1),
        "threads": args.threads,
    }
    summary = comparison.save(document, output)
    print(f"wrote {output / 'metrics.json'} and {summary} ({document['wall_seconds']} s)")


if __name__ == "__main__":
    main()
