"""`hmt-hf convert`: turn a decoder-only causal LM checkpoint (Hub id, folder, GGUF, or `smollm2`) into an HMT
checkpoint — weights, tokenizer, the remote-code files and a model card — loadable with
`AutoModelForCausalLM.from_pretrained(DIR)` (and `trust_remote_code=True` without the package).

    hmt-hf convert --model_name_or_path smollm2 --output_dir hmt-smollm2 --segment_length 1024
    hmt-hf convert --model_name_or_path HuggingFaceTB/SmolLM2-135M --output_dir hmt-smollm2 --dtype bfloat16
    hmt-hf convert config.json          # the same arguments from a JSON or YAML file
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from .training.arguments import DTYPE_CHOICES, HMTModelArguments


@dataclass
class ConvertArguments:
    model_name_or_path: str = field(
        metadata={"help": "The backbone: a Hub id, a local folder (with --gguf_file for GGUF), or `smollm2`."}
    )
    output_dir: str = field(metadata={"help": "Folder for the HMT checkpoint."})
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside the backbone's folder."})
    dtype: str | None = field(default=None, metadata={"help": "Weights dtype.", "choices": DTYPE_CHOICES})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Replace a non-empty --output_dir."})
    seed: int = field(default=0, metadata={"help": "Seed of the memory parameters' initialization."})


def parse(argv: list[str]):
    from transformers import HfArgumentParser

    from .cli import parse_dataclasses

    parser = HfArgumentParser((ConvertArguments, HMTModelArguments), prog="hmt-hf convert", description=__doc__)
    return parse_dataclasses(parser, argv)


def convert(args: ConvertArguments, hmt_args: HMTModelArguments):
    """Check the inputs (before loading anything), convert, save. Returns the saved model."""
    import torch
    from transformers import AutoTokenizer

    from . import HMTForCausalLM
    from .data.documents import looks_like_local_path
    from .hub import create_model_card
    from .offline import SMOLLM2, SMOLLM2_HUB_ID, resolve_backbone

    source, gguf_file = resolve_backbone(args.model_name_or_path, args.gguf_file)
    if looks_like_local_path(source) and not os.path.isdir(source):
        raise FileNotFoundError(f"--model_name_or_path {source}: no such folder.")
    if os.path.isdir(args.output_dir) and os.listdir(args.output_dir) and not args.overwrite_output_dir:
        raise FileExistsError(
            f"--output_dir {args.output_dir} is not empty; pass --overwrite_output_dir to replace it."
        )
    torch.manual_seed(args.seed)
    dtype = None if args.dtype in (None, "auto") else getattr(torch, args.dtype)
    model = HMTForCausalLM.from_backbone(source, gguf_file=gguf_file, dtype=dtype, **hmt_args.hmt_fields())
    tokenizer = AutoTokenizer.from_pretrained(source, **({"gguf_file": gguf_file} if gguf_file else {}))
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    base_model = SMOLLM2_HUB_ID if args.model_name_or_path == SMOLLM2 else source
    create_model_card(
        model,
        os.path.basename(os.path.abspath(args.output_dir)),
        base_model=None if looks_like_local_path(base_model) else base_model,
        training_text=(
            f"None: converted from the backbone with `hmt-hf convert` (memory parameters freshly initialized, seed "
            f"{args.seed}). The memory is UNTRAINED; train it with `hmt-hf train`."
        ),
    ).save(os.path.join(args.output_dir, "README.md"))
    return model


def cli(argv: list[str]) -> int:
    args, hmt_args = parse(argv)
    try:
        model = convert(args, hmt_args)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    overhead = model.memory_parameter_overhead()
    print(
        f"saved an HMT ({model.config.text_config.model_type} backbone, L={model.config.segment_length}, "
        f"{overhead['memory_parameters']:,} memory parameters = {overhead['overhead_percent']:.2f}%) to "
        f"{args.output_dir}; load it with AutoModelForCausalLM.from_pretrained({args.output_dir!r})"
    )
    return 0
