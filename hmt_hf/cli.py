"""The `hmt-hf` command: `hmt-hf convert`, `prepare-data`, `train`, `evaluate`, `reproduce`, `generate`, `push`.

Each subcommand lives in the module that implements it; that module defines `add_arguments(parser)` and
`run(args) -> int`, or `cli(argv) -> int` when it parses its own arguments (`train`: HfArgumentParser, as
run_clm.py). Modules are imported only when their subcommand runs, so `hmt-hf --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMANDS = {
    "convert": (
        "hmt_hf.convert",
        "Turn a decoder-only causal LM (Hub id, folder, GGUF, smollm2) into an HMT checkpoint.",
    ),
    "prepare-data": ("hmt_hf.data.corpora", "Build offline long-document corpora (books, wiki, arxiv) on disk."),
    "train": ("hmt_hf.training.run", "Train an HMT (or a same-budget baseline) with Trainer: the two-stage recipe."),
    "generate": ("hmt_hf.generate", "Continue a prompt (text or a file of any length) with an HMT, streaming output."),
    "push": ("hmt_hf.push", "Upload an HMT checkpoint folder (weights, code, tokenizer, card) to the Hub."),
    "evaluate": (
        "hmt_hf.evaluation.cli",
        "Perplexity and bits per byte of an HMT checkpoint on held-out documents, beside its baselines.",
    ),
    "reproduce": ("hmt_hf.evaluation.reproduce", "Run named experiments that reproduce the paper's tables/figures."),
}


def parse_dataclasses(parser, argv: list[str]) -> tuple:
    """`HfArgumentParser` dataclasses from flags, or from one `.json` / `.yaml` config file."""
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(os.path.abspath(argv[0]))
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def parse(argv: list[str]):
    """Parse an `hmt-hf` command line as `main` would, without running it: its dataclasses or namespace.
    Raises `SystemExit` on arguments the command rejects (the README test checks every command with it)."""
    if not argv or argv[0] not in SUBCOMMANDS:
        raise SystemExit(f"unknown command {argv[:1]}: use one of {list(SUBCOMMANDS)}")
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    if hasattr(module, "parse"):
        return module.parse(argv[1:])
    subparser = argparse.ArgumentParser(prog=f"hmt-hf {argv[0]}", description=SUBCOMMANDS[argv[0]][1])
    module.add_arguments(subparser)
    return subparser.parse_args(argv[1:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="hmt-hf", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        subparsers.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    if hasattr(module, "cli"):
        return int(module.cli(argv[1:]) or 0)
    return int(module.run(parse(argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
