"""`hmt-hf reproduce` as a script (the same arguments): `python examples/reproduce_paper.py --experiments list`."""

import sys

from hmt_hf.cli import main

if __name__ == "__main__":
    sys.exit(main(["reproduce", *sys.argv[1:]]))
