"""Reproduce the paper's tables and figures with named experiments; the same as `hmt-hf reproduce`.

    python examples/reproduce_paper.py --experiments list
    python examples/reproduce_paper.py --model smollm2 --data wiki --segment-length 256 --lengths 2048,8192 \
        --num-samples 4 --experiments ppl_vs_length,efficiency

See `python examples/reproduce_paper.py --help` for every option, and hmt_hf/evaluation/experiments.py for the
mapping of experiments to the paper.
"""

import argparse
import sys

from hmt_hf.evaluation import reproduce


def main() -> int:
    parser = argparse.ArgumentParser(prog="reproduce_paper.py")
    reproduce.add_arguments(parser)
    return reproduce.run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
