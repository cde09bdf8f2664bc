"""`hmt-hf evaluate`: perplexity and bits per byte of an HMT checkpoint on held-out documents, with its baselines
(the chunked backbone at the same L, a sliding window, the whole-context backbone, the HMT's RMT mode) scored on
the same samples, under the paper's last-segment protocol and over all tokens.

    hmt-hf evaluate --model_name_or_path quick/checkpoints/hmt --dataset_name quick/data/books \\
        --baseline_name_or_path quick/checkpoints/baseline --lengths 2048,4096 --output_dir quick/eval
    hmt-hf evaluate config.json      # the same arguments from a JSON (or YAML) file
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field


@dataclass
class EvaluateArguments:
    model_name_or_path: str = field(metadata={"help": "An HMT checkpoint: a folder or a Hub id."})
    dataset_name: str = field(
        metadata={
            "help": "Held-out documents: a `hmt-hf prepare-data` folder (its test split), a .txt file, a folder of "
            ".txt files or a .jsonl file with a 'text' field."
        }
    )
    baseline_name_or_path: str | None = field(
        default=None,
        metadata={"help": "The same-budget baseline backbone (a causal LM); default: the HMT's own backbone."},
    )
    lengths: str = field(default="2048,8192", metadata={"help": "Comma-separated sample lengths in tokens."})
    num_samples: int = field(default=3, metadata={"help": "Samples per length, spread over the documents."})
    max_tokens: int | None = field(
        default=None, metadata={"help": "Cap on the tokens scored per length (fewer samples at long lengths)."}
    )
    output_dir: str | None = field(
        default=None, metadata={"help": "Write metrics.json, summary.md and a plot here (default: print only)."}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Load the model code from the checkpoint."})
    threads: int | None = field(default=None, metadata={"help": "CPU threads (default: torch's)."})

    def __post_init__(self):
        try:
            self.length_list = [int(n) for n in self.lengths.split(",")]
        except ValueError:
            raise ValueError(f"--lengths {self.lengths!r}: give comma-separated integers, e.g. 2048,8192.") from None
        if not self.length_list or min(self.length_list) < 2:
            raise ValueError(f"--lengths {self.lengths!r}: every length must be at least 2 tokens.")
        if self.num_samples < 1:
            raise ValueError(f"--num_samples={self.num_samples} must be >= 1.")


def check_paths(args: EvaluateArguments):
    """Fail fast (before any model loads) on a local path that does not exist."""
    from ..data.documents import looks_like_local_path

    for flag in ("model_name_or_path", "baseline_name_or_path"):
        path = getattr(args, flag)
        if path is not None and looks_like_local_path(path) and not os.path.isdir(path):
            raise FileNotFoundError(f"--{flag} {path}: no such folder.")
    if not os.path.exists(args.dataset_name):
        raise FileNotFoundError(
            f"--dataset_name {args.dataset_name}: no such file or folder (build one with `hmt-hf prepare-data books "
            "--output_dir data/books`)."
        )


def evaluate(args: EvaluateArguments, log=print) -> dict:
    """Score the checkpoint and its baselines; returns the comparison document (rows in `document["results"]`)."""
    import time

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from . import comparison

    check_paths(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    kwargs = {"trust_remote_code": args.trust_remote_code}
    config = AutoConfig.from_pretrained(args.model_name_or_path, **kwargs)  # before any weights load
    if not hasattr(config, "segment_length"):
        raise ValueError(f"--model_name_or_path {args.model_name_or_path} is not an HMT (model_type="
                         f"{config.model_type!r}); convert it first with `hmt-hf convert`.")  # fmt: skip
    hmt = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **kwargs).eval()
    baseline = None
    if args.baseline_name_or_path is not None:
        baseline = AutoModelForCausalLM.from_pretrained(args.baseline_name_or_path, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, **kwargs)
    scorers = comparison.standard_scorers(hmt, baseline)
    started = time.time()
    results, _ = comparison.compare(
        scorers, [args.dataset_name], args.length_list, tokenizer, None, hmt.config.segment_length,
        args.num_samples, log=log, max_tokens=args.max_tokens, bits_per_byte=True,
    )  # fmt: skip
    if not results:
        raise ValueError(
            f"--dataset_name {args.dataset_name}: no test text as long as {min(args.length_list)} tokens."
        )
    document = {
        "benchmark": "hmt-hf evaluate",
        "weights": f"HMT {args.model_name_or_path}, baseline {args.baseline_name_or_path or 'its own backbone'}",
        "reference": next(iter(scorers)),
        "protocols": {
            "all_tokens": "every target 1..T-1 of each sample",
            "last_segment": "the targets of each sample's last segment (the paper's protocol)",
        },
        "results": results,
        "diagnostics": {},
        "wall_seconds": round(time.time() - started, 1),
    }
    if args.output_dir:
        comparison.save(document, args.output_dir)
    return document


def table(document: dict) -> str:
    import pandas as pd

    frame = pd.DataFrame(document["results"])
    frame["change"] = frame["change_vs_reference"].map("{:+.1%}".format)
    columns = ["length", "protocol", "model", "perplexity", "bits_per_byte", "change", "num_samples"]
    return frame[columns].to_markdown(index=False)


def parse(argv: list[str]) -> tuple[EvaluateArguments]:
    from transformers import HfArgumentParser

    from ..cli import parse_dataclasses

    return parse_dataclasses(HfArgumentParser(EvaluateArguments, prog="hmt-hf evaluate", description=__doc__), argv)


def cli(argv: list[str]) -> int:
    try:
        (args,) = parse(argv)
        document = evaluate(args, log=lambda line: print(line, file=sys.stderr, flush=True))
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(table(document))
    if args.output_dir:
        print(f"report: {os.path.join(args.output_dir, 'summary.md')}", file=sys.stderr)
    return 0
