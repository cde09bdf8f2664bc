"""`hmt-hf generate`: continue a prompt (text, or a file of any length) with an HMT checkpoint, streaming the new
text to stdout as it is produced. The prompt's full segments are read into memory; decoding rolls the memory over.

    hmt-hf generate --model_name_or_path runs/hmt/stage2 --prompt "To be, or not to be" --max_new_tokens 50
    hmt-hf generate --model_name_or_path you/hmt-smollm2 --prompt_file book.txt --do_sample --top_p 0.9
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field


@dataclass
class GenerateArguments:
    model_name_or_path: str = field(metadata={"help": "An HMT checkpoint: a folder or a Hub id."})
    prompt: str | None = field(default=None, metadata={"help": "The prompt text."})
    prompt_file: str | None = field(default=None, metadata={"help": "A UTF-8 text file holding the prompt."})
    max_new_tokens: int = field(default=100, metadata={"help": "Tokens to generate."})
    do_sample: bool = field(default=False, metadata={"help": "Sample instead of greedy decoding."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold."})
    seed: int = field(default=0, metadata={"help": "Seed for sampling."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Load the model code from the checkpoint."})

    def __post_init__(self):
        if (self.prompt is None) == (self.prompt_file is None):
            raise ValueError("pass exactly one of --prompt TEXT or --prompt_file PATH.")
        if self.max_new_tokens < 0:
            raise ValueError(f"--max_new_tokens={self.max_new_tokens} must be >= 0.")


def generate(args: GenerateArguments, stream=sys.stdout) -> str:
    """Check the inputs (before loading anything), load, generate with a streamer. Returns the new text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer

    from .data.documents import looks_like_local_path

    if args.prompt_file is not None and not os.path.isfile(args.prompt_file):
        raise FileNotFoundError(f"--prompt_file {args.prompt_file}: no such file.")
    if looks_like_local_path(args.model_name_or_path) and not os.path.isdir(args.model_name_or_path):
        raise FileNotFoundError(f"--model_name_or_path {args.model_name_or_path}: no such folder.")
    prompt = args.prompt
    if prompt is None:
        with open(args.prompt_file, encoding="utf-8") as handle:
            prompt = handle.read()
    kwargs = {"trust_remote_code": args.trust_remote_code}
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **kwargs).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise ValueError("the prompt is empty after tokenization.")
    torch.manual_seed(args.seed)

    class Printer(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False):
            print(text, file=stream, flush=True, end="" if not stream_end else None)

    sampling = {"temperature": args.temperature, "top_p": args.top_p} if args.do_sample else {}
    output = model.generate(
        ids,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample,
        streamer=Printer(tokenizer, skip_prompt=True),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        **sampling,
    )
    return tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True)


def parse(argv: list[str]) -> tuple[GenerateArguments]:
    from transformers import HfArgumentParser

    from .cli import parse_dataclasses

    return parse_dataclasses(HfArgumentParser(GenerateArguments, prog="hmt-hf generate", description=__doc__), argv)


def cli(argv: list[str]) -> int:
    try:
        (args,) = parse(argv)
        generate(args)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
