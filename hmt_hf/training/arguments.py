"""Command-line arguments of `examples/train_hmt.py`, in the style of transformers' `run_clm.py`.

`HfArgumentParser((ModelArguments, DataTrainingArguments, HMTArguments, TrainingArguments))` parses them from the
command line or from a single `.json` file.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .stages import METHODS

STAGE_CHOICES = ("1", "2", "both")
LR_SCHEDULE_CHOICES = ("step_decay", "trainer")
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")


@dataclass
class ModelArguments:
    """Which model to train: a backbone to wrap, or an HMT checkpoint to continue; optionally through LoRA."""

    model_name_or_path: str = field(
        metadata={
            "help": "A decoder-only causal LM (Hub id or folder) to wrap as a new HMT, or an HMT checkpoint "
            "(config.json with model_type 'hmt', e.g. the output of a previous stage) to continue training."
        }
    )
    gguf_file: str | None = field(
        default=None, metadata={"help": "GGUF file inside model_name_or_path (e.g. the offline SmolLM2)."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or folder, if not the one saved with the model."}
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where to cache downloaded models and datasets (and their Arrow files)."}
    )
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model on the Hub."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow custom code of the backbone's repository to run."}
    )
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "Load the weights in this dtype ('auto' = the checkpoint's). Mixed precision is TrainingArguments' "
            "--bf16/--fp16; keep fp32 weights for it.",
            "choices": DTYPE_CHOICES,
        },
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention implementation of the backbone: eager, sdpa, flash_attention_2."}
    )
    use_lora: bool = field(
        default=False,
        metadata={
            "help": "Train LoRA adapters on the backbone's attention projections plus the whole memory module "
            "(modules_to_save=['memory']) instead of every weight. On a backbone, the fresh HMT is saved once in "
            "<output_dir>/base_model as the adapters' base model (AutoPeftModelForCausalLM loads it)."
        },
    )
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (the paper: 8)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Backbone module names to adapt (default: peft's choice for the backbone's model_type, e.g. "
            "q_proj v_proj for Llama). Matched inside the backbone only."
        },
    )
    save_merged_model: bool = field(
        default=False,
        metadata={"help": "With --use_lora: also save merge_and_unload()'s plain HMT in <output_dir>/merged."},
    )


@dataclass
class DataTrainingArguments:
    """Which documents to train and evaluate on, and how they are cut into samples."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "A dataset on the Hub or a local folder / file of documents."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of that dataset."})
    train_file: str | None = field(
        default=None, metadata={"help": "Training documents: a txt/json/jsonl/parquet file or a folder."}
    )
    validation_file: str | None = field(default=None, metadata={"help": "Held-out documents, same formats."})
    text_column: str | None = field(
        default=None, metadata={"help": "Column holding the document text (default: 'text' or the only column)."}
    )
    validation_split_percentage: int = field(
        default=5,
        metadata={
            "help": "Without a validation split, hold out this percentage of the training documents (whole "
            "documents: none straddles train and validation)."
        },
    )
    window_stride: int | None = field(
        default=None,
        metadata={"help": "Distance between training windows in tokens (default: one segment, as the paper)."},
    )
    eval_max_length: int | None = field(
        default=None,
        metadata={
            "help": "Held-out documents are scored in consecutive pieces of at most this many tokens, every token "
            "once (default: bptt_depth x segment_length, the same pieces for both stages). 0 = whole documents."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training windows (debugging, quick runs)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N evaluation pieces (debugging, quick runs)."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenization (datasets.map num_proc)."}
    )

    def __post_init__(self):
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError(
                "No data: pass --dataset_name (Hub name or local folder) or --train_file / --validation_file."
            )
        if not 0 <= self.validation_split_percentage < 100:
            raise ValueError(f"--validation_split_percentage={self.validation_split_percentage} must be in [0, 100).")
        for name in ("window_stride", "max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name}={value} must be a positive integer.")
        if self.eval_max_length is not None and self.eval_max_length < 0:
            raise ValueError(f"--eval_max_length={self.eval_max_length} must be >= 0 (0 = whole documents).")


@dataclass
class HMTModelArguments:
    """`HMTConfig` fields of a new model (`hmt-hf convert`, `hmt-hf train`). Fields left unset keep `HMTConfig`'s
    defaults for a new model, and the checkpoint's values for an HMT checkpoint."""

    segment_length: int | None = field(
        default=None, metadata={"help": "L: new tokens per segment (memory and sensory slots not counted)."}
    )
    sensory_memory_size: int | None = field(default=None, metadata={"help": "k: sensory memory tokens."})
    num_memory_embeddings: int | None = field(default=None, metadata={"help": "N: cached memory embeddings."})
    representation_length: int | None = field(
        default=None, metadata={"help": "j: tokens read by the representation encoder (default L // 2)."}
    )
    memory_search_dim: int | None = field(default=None, metadata={"help": "d_h: width of W_q and W_k."})
    retrieval_mode: str | None = field(
        default=None, metadata={"help": "paper (Eq. 1 exactly) or causal.", "choices": ("paper", "causal")}
    )
    loss_on_last_segment_only: bool | None = field(
        default=None, metadata={"help": "Score only the last segment of each window (the reference code's loss)."}
    )
    attention_sink: bool | None = field(
        default=None,
        metadata={"help": "Start every backbone pass with the BOS embedding (default True); False is Eq. 4 exactly."},
    )
    normalize_memory: bool | None = field(
        default=None,
        metadata={
            "help": "Memory embeddings at token scale and a cosine memory search (default True); False is Eq. 3 and "
            "Eq. 5 exactly."
        },
    )

    memory_readout: str | None = field(
        default=None,
        metadata={
            "help": "Where M_n is read: memory_slot (Eq. 5, the default) or segment_mean (the segment's mean state).",
            "choices": ("memory_slot", "segment_mean"),
        },
    )

    def hmt_fields(self) -> dict:
        """The HMTConfig fields given on the command line (unset ones are left out)."""
        return {f.name: getattr(self, f.name) for f in fields(HMTModelArguments) if getattr(self, f.name) is not None}


@dataclass
class HMTArguments(HMTModelArguments):
    """HMT fields of a new model and the paper's two-stage recipe.

    The training samples of a stage are windows of `depth x segment_length` tokens over the concatenated documents
    (stride `--window_stride`, one segment by default); backpropagation runs through every segment of a window.
    """

    method: str = field(
        default="hmt",
        metadata={
            "help": "hmt: the HMT. rmt: the same-budget RMT baseline (memory token only: no sensory memory, no memory "
            "search). chunked: the same-budget plain backbone on independent segment_length-token chunks (memory "
            "frozen and unused; the trained backbone is also saved alone in <output_dir>/backbone). All three train "
            "on the same windows, steps, tokens and LR schedule.",
            "choices": METHODS,
        },
    )
    stage: str = field(
        default="both",
        metadata={
            "help": "1: recurrent memory + sensory memory, no memory search, short unrolls. 2: with memory search, "
            "long unrolls. both: stage 1, then stage 2 from its weights (the paper's recipe).",
            "choices": STAGE_CHOICES,
        },
    )
    bptt_depth: int = field(
        default=15,
        metadata={"help": "Segments per training window in stage 2, each backpropagated through (the paper: 15)."},
    )
    stage1_bptt_depth: int = field(
        default=2, metadata={"help": "Segments per training window in stage 1 (the paper: 2)."}
    )
    stage1_max_steps: int | None = field(
        default=None,
        metadata={"help": "Optimizer steps of stage 1 with --stage both (default: --max_steps / --num_train_epochs)."},
    )
    lr_schedule: str = field(
        default="step_decay",
        metadata={
            "help": "step_decay: the paper's LR x lr_decay_gamma every lr_decay_steps steps (after --warmup_steps). "
            "trainer: TrainingArguments' --lr_scheduler_type.",
            "choices": LR_SCHEDULE_CHOICES,
        },
    )
    lr_decay_steps: int = field(default=100, metadata={"help": "Optimizer steps between two LR decays."})
    lr_decay_gamma: float = field(default=0.9, metadata={"help": "LR factor per decay (the paper: 0.9 or 0.7)."})
    memory_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Peak LR of the memory parameters HMT adds (T, W_q, W_k, initial memory, search temperature, "
            "memory gain); default: --learning_rate. They start from scratch, so a fine-tuning LR barely moves them. "
            "The backbone keeps --learning_rate, so a chunked baseline trained with the same flags is unchanged. Resume "
            "a run with the setting it was started with (the optimizer state has a param group per setting)."
        },
    )

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"--method={self.method!r} is invalid: use one of {METHODS}.")
        self.stage = str(self.stage)
        if self.stage not in STAGE_CHOICES:
            raise ValueError(f"--stage={self.stage!r} is invalid: use one of {STAGE_CHOICES}.")
        if self.lr_schedule not in LR_SCHEDULE_CHOICES:
            raise ValueError(f"--lr_schedule={self.lr_schedule!r} is invalid: use one of {LR_SCHEDULE_CHOICES}.")
        if self.bptt_depth < 1 or self.stage1_bptt_depth < 1:
            raise ValueError(
                f"--bptt_depth={self.bptt_depth} and --stage1_bptt_depth={self.stage1_bptt_depth} must be >= 1."
            )
        if self.method == "hmt" and self.stage != "1" and self.bptt_depth < 3:
            raise ValueError(
                f"--bptt_depth={self.bptt_depth}: stage 2 trains memory search, which needs at least two cached memories"
                " to choose between (with one, the softmax is 1 and W_q, W_k and T get exactly zero gradient); a "
                "window's third segment is the first with two. Use --bptt_depth >= 3 (the paper: up to 15)."
            )
        if self.lr_decay_steps < 1 or not 0 < self.lr_decay_gamma <= 1:
            raise ValueError(
                f"--lr_decay_steps={self.lr_decay_steps} must be >= 1 and --lr_decay_gamma={self.lr_decay_gamma} "
                "in (0, 1]."
            )
        if self.memory_learning_rate is not None and not self.memory_learning_rate > 0:
            raise ValueError(f"--memory_learning_rate={self.memory_learning_rate} must be > 0 (or unset).")
        if self.stage1_max_steps is not None and self.stage1_max_steps < 1:
            raise ValueError(f"--stage1_max_steps={self.stage1_max_steps} must be >= 1.")

    def hmt_fields(self) -> dict:
        fields = super().hmt_fields()
        if self.method == "rmt":
            fields["use_sensory_memory"] = False
        return fields
