"""`hmt-hf push`: upload an HMT checkpoint folder (what `hmt-hf convert` or `hmt-hf train` wrote: weights, config,
remote-code files, tokenizer, model card) to the Hugging Face Hub, so that anyone can load it with
`AutoModelForCausalLM.from_pretrained(REPO, trust_remote_code=True)` without the package.

    hmt-hf push --model_name_or_path runs/hmt/stage2 --repo_id you/hmt-smollm2 [--private]
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

# Training leftovers that are not part of a model repository.
IGNORED = ["checkpoint-*", "checkpoint-*/**", "training_args.bin", "*.pt", "*.pth", "telemetry.jsonl", "runs/**"]


@dataclass
class PushArguments:
    model_name_or_path: str = field(metadata={"help": "An HMT checkpoint folder (hmt-hf convert / train output)."})
    repo_id: str = field(metadata={"help": "The Hub repository, `user/name` (created if missing)."})
    private: bool = field(default=False, metadata={"help": "Create the repository as private."})
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (default: main)."})
    commit_message: str = field(default="Upload HMT checkpoint (hmt_hf)", metadata={"help": "Commit message."})


def push(args: PushArguments) -> str:
    """Check the folder (before any network call), write a card if it has none, upload it. Returns the commit URL."""
    from huggingface_hub import HfApi, ModelCard

    folder = args.model_name_or_path
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"--model_name_or_path {folder}: no checkpoint there (no config.json).")
    if json.loads(open(config_path, encoding="utf-8").read()).get("model_type") != "hmt":
        raise ValueError(f"--model_name_or_path {folder} is not an HMT checkpoint; convert it with `hmt-hf convert`.")
    readme = os.path.join(folder, "README.md")
    if os.path.isfile(readme):
        card = ModelCard.load(readme)
        # The card's usage snippet names the folder; on the Hub it must name the repository.
        local_name = os.path.basename(os.path.abspath(folder))
        card.text = card.text.replace(f'from_pretrained("{local_name}"', f'from_pretrained("{args.repo_id}"')
    else:
        from transformers import AutoModelForCausalLM

        from .hub import create_model_card

        card = create_model_card(AutoModelForCausalLM.from_pretrained(folder), args.repo_id)
    api = HfApi()
    api.create_repo(args.repo_id, private=args.private, exist_ok=True)
    commit = api.upload_folder(
        repo_id=args.repo_id,
        folder_path=folder,
        revision=args.revision,
        commit_message=args.commit_message,
        ignore_patterns=IGNORED + ["README.md"],
    )
    card.push_to_hub(args.repo_id, revision=args.revision)
    return str(commit)


def parse(argv: list[str]) -> tuple[PushArguments]:
    from transformers import HfArgumentParser

    from .cli import parse_dataclasses

    return parse_dataclasses(HfArgumentParser(PushArguments, prog="hmt-hf push", description=__doc__), argv)


def cli(argv: list[str]) -> int:
    (args,) = parse(argv)
    from huggingface_hub.errors import HfHubHTTPError

    try:
        url = push(args)
    except (ValueError, OSError, HfHubHTTPError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"pushed {args.model_name_or_path} to {args.repo_id} ({url}); load it with "
          f"AutoModelForCausalLM.from_pretrained({args.repo_id!r}, trust_remote_code=True)")  # fmt: skip
    return 0
