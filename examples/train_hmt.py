#!/usr/bin/env python
"""Train an HMT with transformers' Trainer (the same as `hmt-hf train`): see `hmt_hf/training/run.py` for the
arguments, and examples/README_training.md. `torchrun` and `accelerate launch` run this file.

    python examples/train_hmt.py examples/train_args_example.json
    accelerate launch --config_file examples/accelerate_configs/ddp.yaml examples/train_hmt.py args.json
"""

import sys

from hmt_hf.training.run import cli, main, parse_args  # noqa: F401  (main/parse_args: the script's Python API)

if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
