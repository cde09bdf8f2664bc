"""`ExperimentConfig`: everything that defines an evaluation run. It is also the command line of `hmt-hf reproduce`
(`HfArgumentParser`: every field is a flag, with the aliases in its metadata), so a JSON config file and the flags
are the same thing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field

from .scoring import PROTOCOLS

BASELINE_ALIASES = {"sliding": "sliding_window", "full": "full_context", "window": "sliding_window"}
_HMT_FIELD_HELP = "HMT field (default: the checkpoint's, or the paper's for a fresh HMT)."


def _flag(help_text: str, *aliases: str, **kwargs) -> dict:
    return {"help": help_text, "aliases": list(aliases), **kwargs}


def _split(value, what: str) -> list[str]:
    """A comma-separated string (the command line) or a list (JSON, Python) → a list of non-empty strings."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)):
        raise ValueError(f"{what}={value!r}: give a comma-separated list.")
    return [str(part).strip() for part in parts if str(part).strip()]


def _int_list(value, what: str) -> list[int]:
    try:
        return [int(part) for part in _split(value, what)]
    except ValueError:
        raise ValueError(f"{what}={value!r}: give comma-separated integers, e.g. 2048,8192.") from None


def _key_values(value, what: str, example: str) -> dict[str, str]:
    """`KEY=VALUE` strings (repeated flags) or a dict (JSON) → a dict; the key may itself contain `=`."""
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    pairs = {}
    for item in [value] if isinstance(value, str) else value:
        key, separator, path = str(item).rpartition("=")
        if not separator or not key or not path:
            raise ValueError(f"{what} {item!r}: give KEY=VALUE, e.g. {example}.")
        pairs[key] = path
    return pairs


@dataclass
class ExperimentConfig:
    """Everything that defines an evaluation run, recorded in full in `metrics.json` (and hashed into its
    `config_fingerprint`, so runs with different settings are never mixed up).

    The first block is the seed notebook's interface (`ExperimentConfig(name=..., model_name=..., dataset=...,
    segment_length=..., ...)`). HMT fields left `None` take the loaded checkpoint's value, or the paper's default
    for a fresh HMT (L=1024, j=L/2, k=32, N=300). List fields also take a comma-separated string and the two
    mapping fields `KEY=VALUE` strings (the command line); `__post_init__` normalizes them.
    """

    name: str = field(default="hmt_evaluation", metadata=_flag("Run name (directory prefix)."))
    model_name: str = field(
        default="smollm2",
        metadata=_flag(
            "'smollm2' (offline GGUF), 'tiny' (random, for tests), a causal-LM folder / Hub id (wrapped as a fresh "
            "HMT), or a saved HMT folder (trained weights).",
            "--model",
        ),
    )
    dataset: str = field(
        default="shakespeare",
        metadata=_flag(
            "shakespeare, wiki, books, arxiv (hmt_hf.data corpora), a .txt file, a folder of .txt files, a .jsonl "
            "file, or 'random'.",
            "--data",
        ),
    )
    segment_length: int | None = field(default=None, metadata=_flag(_HMT_FIELD_HELP))
    num_memory_embeddings: int | None = field(default=None, metadata=_flag(_HMT_FIELD_HELP))
    sensory_memory_size: int | None = field(default=None, metadata=_flag(_HMT_FIELD_HELP))
    batch_size: int = field(default=1, metadata=_flag("Recorded in the config (scoring runs one sample at a time)."))
    learning_rate: float | None = field(default=None, metadata=_flag("Recorded in the config (not used to score)."))
    seed: int = field(default=42, metadata=_flag("Seed of sampling and of fresh memory parameters."))
    paper_table: str | None = field(default=None, metadata=_flag("Recorded in the config: the paper item aimed at."))

    # Model
    representation_length: int | None = field(default=None, metadata=_flag(_HMT_FIELD_HELP))
    memory_search_dim: int | None = field(default=None, metadata=_flag(_HMT_FIELD_HELP))
    retrieval_mode: str | None = field(
        default=None, metadata=_flag(_HMT_FIELD_HELP + " paper or causal.", choices=("paper", "causal"))
    )
    gguf_file: str | None = field(default=None, metadata=_flag("GGUF file inside --model's folder or repo."))
    tokenizer_name: str | None = field(default=None, metadata=_flag("Tokenizer folder / Hub id.", "--tokenizer"))
    dtype: str = field(default="float32", metadata=_flag("float32, bfloat16 or float16."))
    device: str = field(default="auto", metadata=_flag("auto, cpu, cuda, cuda:1."))
    rmt_checkpoint: str | None = field(default=None, metadata=_flag("A saved RMT-trained HMT for the RMT baseline."))
    variant_checkpoints: dict[str, str] | str | None = field(
        default=None,
        metadata=_flag(
            "Checkpoint of an ablation variant as KEY=PATH, e.g. bptt_depth=2=PATH, sensory_memory_size=8=PATH, "
            "retrieval=off=PATH (repeat the flag for more).",
            "--checkpoint",
            action="append",
            metavar="KEY=PATH",
        ),
    )
    training_runs: dict[str, list[str]] | str | None = field(
        default=None,
        metadata=_flag(
            "Training output folders for two_stage as LABEL=DIR[,DIR], e.g. two_stage=out/stage1,out/stage2 and "
            "single_stage=out/single (repeat the flag for more).",
            "--training-run",
            action="append",
            metavar="LABEL=DIR[,DIR]",
        ),
    )

    # Data and protocol
    data_dir: str | None = field(default=None, metadata=_flag("Where `hmt-hf prepare-data` saved wiki/books/arxiv."))
    experiments: list[str] | str | None = field(
        default_factory=lambda: ["ppl_vs_length"],
        metadata=_flag("Comma-separated names, paper items (fig2, table8) or 'all'; 'list' shows them."),
    )
    sequence_lengths: list[int] | str | None = field(
        default_factory=lambda: [2048, 10240, 30720, 61440, 102400],
        metadata=_flag("Input lengths in tokens, comma-separated.", "--lengths"),
    )
    long_length: int = field(default=30720, metadata=_flag("Table 4's input length."))
    ablation_length: int | None = field(
        default=None, metadata=_flag("Input length of the ablations (default: the longest --lengths the data holds).")
    )
    num_samples: int = field(default=10, metadata=_flag("Samples per length."))
    protocols: list[str] | str | None = field(
        default_factory=lambda: ["last_segment"],
        metadata=_flag("last_segment (the paper's), all_tokens, or both (comma-separated).", "--protocol"),
    )
    sample_stride: int | None = field(
        default=None, metadata=_flag("Tokens between sample starts (default L for last_segment, none for all_tokens).")
    )
    top_k: list[int] | str | None = field(default_factory=lambda: [1, 5], metadata=_flag("Top-k accuracies."))
    max_logit_positions: int = field(default=2048, metadata=_flag("Positions whose logits are held at once."))

    # Baselines
    baselines: list[str] | str | None = field(
        default_factory=lambda: ["hmt", "rmt", "chunked", "sliding_window", "vanilla", "full_context"],
        metadata=_flag("Comma-separated: hmt, rmt, chunked, sliding_window, vanilla, full_context."),
    )
    window_size: int | None = field(default=None, metadata=_flag("Sliding window W (default min(4L, max))."))
    window_stride: int | None = field(default=None, metadata=_flag("Sliding window stride S (default L)."))
    vanilla_max_length: int | None = field(default=None, metadata=_flag("Default: the backbone's maximum."))
    truncation_strategy: str = field(
        default="tail", metadata=_flag("Vanilla's truncation: tail or head.", "--truncation", choices=("tail", "head"))
    )

    # Ablations and efficiency
    sensory_sizes: list[int] | str | None = field(
        default_factory=lambda: [8, 16, 32, 64, 128], metadata=_flag("Table 8's sensory memory sizes.")
    )
    cache_sizes: list[int] | str | None = field(
        default_factory=lambda: [100, 200, 300, 400], metadata=_flag("Fig. 10's memory cache sizes N.")
    )
    bptt_depths: list[int] | str | None = field(
        default_factory=lambda: [2, 5, 15], metadata=_flag("Table 9's BPTT depths.")
    )
    efficiency_length: int | None = field(default=None, metadata=_flag("Default: the first --lengths."))
    efficiency_warmup: int = field(default=1, metadata=_flag("Untimed warm-up passes of the efficiency experiment."))
    efficiency_repeats: int = field(default=5, metadata=_flag("Timed passes of the efficiency experiment."))
    pubmedqa_data: str | None = field(default=None, metadata=_flag("PubMedQA json/jsonl for the pubmedqa experiment."))
    pubmedqa_contexts: list[int] | str | None = field(
        default_factory=lambda: [2, 5, 10], metadata=_flag("Abstracts fused per PubMedQA prompt.")
    )

    notes: list[str] | str | None = field(default_factory=list, metadata=_flag("Notes recorded with the run."))

    def __post_init__(self):
        for name in ("sequence_lengths", "top_k", "sensory_sizes", "cache_sizes", "bptt_depths", "pubmedqa_contexts"):
            setattr(self, name, _int_list(getattr(self, name) or [], f"--{name}"))
        self.experiments = _split(self.experiments or ["ppl_vs_length"], "--experiments")
        self.baselines = [BASELINE_ALIASES.get(b, b) for b in _split(self.baselines or [], "--baselines")]
        self.notes = [self.notes] if isinstance(self.notes, str) else list(self.notes or [])
        protocols = _split(self.protocols or ["last_segment"], "--protocol")
        self.protocols = list(PROTOCOLS) if protocols == ["both"] else protocols
        for protocol in self.protocols:
            if protocol not in PROTOCOLS:
                raise ValueError(f"--protocol {protocol!r} is invalid: use {', '.join(PROTOCOLS)} or both.")
        self.variant_checkpoints = _key_values(
            self.variant_checkpoints or {}, "--checkpoint", "bptt_depth=2=path/to/checkpoint"
        )
        runs = _key_values(self.training_runs or {}, "--training-run", "two_stage=out/stage1,out/stage2")
        self.training_runs = {label: _split(folders, f"--training-run {label}") for label, folders in runs.items()}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> ExperimentConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown ExperimentConfig fields {unknown}; known fields: {sorted(known)}.")
        return cls(**values)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> ExperimentConfig:
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    def fingerprint(self, ignore: tuple[str, ...] = ("experiments", "notes", "name", "paper_table")) -> str:
        """A hash of the settings that change numbers (not which experiments run, not notes or names)."""
        values = {k: v for k, v in self.to_dict().items() if k not in ignore}
        return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]
