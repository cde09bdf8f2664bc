"""`hmt-hf reproduce` (and `examples/reproduce_paper.py`): run named experiments mapped to the paper's tables and
figures and write a run directory (metrics.json, summary.md, tables, plots, comparison with earlier runs).

    hmt-hf reproduce --experiments list
    hmt-hf reproduce --model smollm2 --data wiki --segment-length 256 --lengths 2048,8192 --num-samples 4 \\
        --experiments ppl_vs_length,efficiency --output-dir results
    hmt-hf reproduce --run-dir results/hmt_evaluation_001 --resume ...     # continue an interrupted run
    hmt-hf reproduce --compare results/run_a results/run_b                 # compare finished runs

Every number is written with its protocol (`last_segment`: the paper's; `all_tokens`), the HMT retrieval mode and
the weights that produced it. Interrupted runs resume from the per-sample cache of the run directory.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from .results import ExperimentConfig, ResultLogger


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _key_value(text: str) -> tuple[str, str]:
    key, separator, value = text.rpartition("=")
    if not separator or not key or not value:
        raise argparse.ArgumentTypeError(f"{text!r} must be KEY=VALUE (e.g. bptt_depth=2=path/to/checkpoint)")
    return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--experiments",
        type=_name_list,
        default=None,
        help="comma-separated names, paper items (fig2, table8) or 'all'; 'list' shows them (default: ppl_vs_length)",
    )
    what.add_argument("--config", default=None, help="an ExperimentConfig as JSON; flags given here override it")
    what.add_argument(
        "--preset",
        default=None,
        help="the whole job: convert, train the HMT and its same-budget baseline, evaluate, report into "
        "--output-dir (quick: ~8 min on 2 CPU cores; books-cpu: ~1 h; paper: the paper's recipe, for a GPU)",
    )
    what.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="only compare finished run directories (writes --output-dir/comparison.md|.csv)",
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        dest="model_name",
        default=None,
        help="'smollm2' (offline GGUF, default), 'tiny' (random, for tests), a causal-LM folder / Hub "
        "id (wrapped as a fresh HMT), or a saved HMT folder (trained weights)",
    )
    model.add_argument("--gguf-file", default=None)
    model.add_argument("--tokenizer", dest="tokenizer_name", default=None, help="tokenizer folder / Hub id")
    model.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16")
    model.add_argument("--device", default=None, help="auto (default), cpu, cuda, cuda:1")
    for flag in (
        "segment-length",
        "representation-length",
        "sensory-memory-size",
        "num-memory-embeddings",
        "memory-search-dim",
    ):
        model.add_argument(
            f"--{flag}",
            type=int,
            default=None,
            help="HMT field (default: the checkpoint's, or the paper's for a fresh HMT)",
        )
    model.add_argument("--retrieval-mode", choices=("paper", "causal"), default=None)
    model.add_argument("--rmt-checkpoint", default=None, help="a saved RMT-trained HMT for the RMT baseline")
    model.add_argument(
        "--checkpoint",
        dest="variant_checkpoints",
        type=_key_value,
        action="append",
        default=None,
        metavar="KEY=PATH",
        help="checkpoint of an ablation variant, e.g. bptt_depth=2=PATH, "
        "sensory_memory_size=8=PATH, retrieval=off=PATH (repeatable)",
    )
    model.add_argument(
        "--training-run",
        dest="training_runs",
        type=_key_value,
        action="append",
        default=None,
        metavar="LABEL=DIR[,DIR]",
        help="training output dirs for two_stage, e.g. "
        "two_stage=out/stage1,out/stage2 and single_stage=out/single (repeatable)",
    )

    data = parser.add_argument_group("data and protocol")
    data.add_argument(
        "--data",
        dest="dataset",
        default=None,
        help="shakespeare (default), wiki, books, arxiv (hmt_hf.data corpora), a .txt file, a folder "
        "of .txt files, a .jsonl file, or 'random'",
    )
    data.add_argument("--data-dir", default=None, help="where `hmt-hf prepare-data` saved wiki/books/arxiv")
    data.add_argument(
        "--lengths",
        dest="sequence_lengths",
        type=_int_list,
        default=None,
        help="input lengths, comma-separated (default 2048,10240,30720,61440,102400)",
    )
    data.add_argument("--long-length", type=int, default=None, help="Table 4's input length (default 30720)")
    data.add_argument(
        "--ablation-length",
        type=int,
        default=None,
        help="input length of the ablations (default: the longest --lengths the data holds)",
    )
    data.add_argument("--num-samples", type=int, default=None, help="samples per length (default 10)")
    data.add_argument(
        "--protocol",
        choices=("last_segment", "all_tokens", "both"),
        default=None,
        help="last_segment (the paper's, default), all_tokens, or both",
    )
    data.add_argument(
        "--sample-stride",
        type=int,
        default=None,
        help="tokens between sample starts (default L for last_segment, no overlap for all_tokens)",
    )
    data.add_argument("--top-k", type=_int_list, default=None, help="top-k accuracies (default 1,5)")
    data.add_argument(
        "--max-logit-positions", type=int, default=None, help="positions whose logits are held at once (default 2048)"
    )

    baselines = parser.add_argument_group("baselines and ablations")
    baselines.add_argument(
        "--baselines",
        type=_name_list,
        default=None,
        help="hmt,rmt,chunked,sliding_window,vanilla,full_context (default: all)",
    )
    baselines.add_argument("--window-size", type=int, default=None, help="sliding window W (default min(4L, max))")
    baselines.add_argument("--window-stride", type=int, default=None, help="sliding window stride S (default L)")
    baselines.add_argument("--vanilla-max-length", type=int, default=None, help="default: the backbone's maximum")
    baselines.add_argument("--truncation", dest="truncation_strategy", choices=("tail", "head"), default=None)
    baselines.add_argument("--sensory-sizes", type=_int_list, default=None, help="Table 8 (default 8,16,32,64,128)")
    baselines.add_argument("--cache-sizes", type=_int_list, default=None, help="Fig. 10 (default 100,200,300,400)")
    baselines.add_argument("--bptt-depths", type=_int_list, default=None, help="Table 9 (default 2,5,15)")
    baselines.add_argument("--efficiency-length", type=int, default=None, help="default: the first --lengths")
    baselines.add_argument("--efficiency-warmup", type=int, default=None)
    baselines.add_argument("--efficiency-repeats", type=int, default=None)
    baselines.add_argument("--pubmedqa-data", default=None, help="PubMedQA json/jsonl for the pubmedqa experiment")
    baselines.add_argument(
        "--pubmedqa-contexts",
        type=_int_list,
        default=None,
        help="abstracts fused per PubMedQA prompt (default 2,5,10)",
    )

    output = parser.add_argument_group("run")
    output.add_argument("--output-dir", default="results", help="parent folder of run directories")
    output.add_argument("--name", default=None, help="run name (directory prefix; default hmt_evaluation)")
    output.add_argument("--run-dir", default=None, help="use exactly this run directory")
    output.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir (or the latest run of --name): completed samples are read from its cache",
    )
    output.add_argument("--seed", type=int, default=None)
    output.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    output.add_argument("--no-progress", action="store_true", help="no progress bars")
    output.add_argument("--fail-fast", action="store_true", help="stop at the first failing experiment")


_FLAG_FIELDS = (
    "experiments",
    "model_name",
    "gguf_file",
    "tokenizer_name",
    "dtype",
    "device",
    "segment_length",
    "representation_length",
    "sensory_memory_size",
    "num_memory_embeddings",
    "memory_search_dim",
    "retrieval_mode",
    "rmt_checkpoint",
    "dataset",
    "data_dir",
    "sequence_lengths",
    "long_length",
    "ablation_length",
    "num_samples",
    "sample_stride",
    "top_k",
    "max_logit_positions",
    "baselines",
    "window_size",
    "window_stride",
    "vanilla_max_length",
    "truncation_strategy",
    "sensory_sizes",
    "cache_sizes",
    "bptt_depths",
    "efficiency_length",
    "efficiency_warmup",
    "efficiency_repeats",
    "pubmedqa_data",
    "pubmedqa_contexts",
    "seed",
)


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """An [`ExperimentConfig`] from `--config` (if given) with every flag that was given applied on top."""
    values = ExperimentConfig.from_json(args.config).to_dict() if args.config else {}
    for name in _FLAG_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if args.name is not None:
        values["name"] = args.name
    if args.protocol is not None:
        values["protocols"] = ["last_segment", "all_tokens"] if args.protocol == "both" else [args.protocol]
    if args.variant_checkpoints:
        values["variant_checkpoints"] = dict(values.get("variant_checkpoints", {}), **dict(args.variant_checkpoints))
    if args.training_runs:
        runs = dict(values.get("training_runs", {}))
        runs.update({label: _name_list(directories) for label, directories in args.training_runs})
        values["training_runs"] = runs
    baselines = values.get("baselines")
    if baselines:
        aliases = {"sliding": "sliding_window", "full": "full_context", "window": "sliding_window"}
        values["baselines"] = [aliases.get(b, b) for b in baselines]
    return ExperimentConfig.from_dict(values)


def preflight(config: ExperimentConfig):
    """Raise a `ValueError` naming the problem and the fix for inputs that cannot work — before any model loads and
    before a run folder exists: a missing local model, checkpoint or data path, a missing offline SmolLM2."""
    from ..data.documents import looks_like_local_path
    from ..offline import smollm2_folder
    from .corpus import NAMED_CORPORA

    model = config.model_name
    if model == "smollm2":
        smollm2_folder()  # raises, naming the install command
    if model not in ("smollm2", "tiny") and looks_like_local_path(model) and not os.path.isdir(model):
        raise ValueError(f"--model {model}: no such folder; pass a model folder, a Hub id, `smollm2` or `tiny`.")
    paths = {f"--checkpoint {key}": path for key, path in config.variant_checkpoints.items()}
    paths |= {f"--training-run {key}": path for key, runs in config.training_runs.items() for path in runs}
    if config.rmt_checkpoint:
        paths["rmt_checkpoint"] = config.rmt_checkpoint
    for label, path in paths.items():
        if not os.path.isdir(path):
            raise ValueError(f"{label}={path}: no such folder.")
    data = config.dataset
    if data in NAMED_CORPORA and config.data_dir and not os.path.isdir(config.data_dir):
        raise ValueError(
            f"--data-dir {config.data_dir}: no such folder; build it with "
            f"`hmt-hf prepare-data {data} --output-dir {config.data_dir}`."
        )
    if data not in (*NAMED_CORPORA, "shakespeare", "random") and not os.path.exists(data):
        raise ValueError(
            f"--data {data}: no such file or folder; use a .txt/.jsonl file, a folder of .txt files, `shakespeare`, "
            f"or one of {NAMED_CORPORA} (built with `hmt-hf prepare-data NAME --output-dir DIR`, then --data-dir DIR)."
        )


def run_reproduction(
    config: ExperimentConfig,
    output_dir: str = "results",
    run_dir: str | None = None,
    resume: bool = False,
    progress: bool = True,
    fail_fast: bool = False,
) -> ResultLogger:
    """Run `config.experiments` and write the run directory; returns the [`ResultLogger`] (its `exp_dir`,
    `document`). Experiments that fail are recorded as failed (the others still run) unless `fail_fast`."""
    from .experiments import ModelSet, Runner, check_protocols, load_corpus, resolve_experiments

    experiments = resolve_experiments(config.experiments)
    check_protocols(config.protocols)
    if resume and run_dir is None:
        candidates = sorted(Path(output_dir).glob(f"{config.name}_*"))
        candidates = [c for c in candidates if (c / "metrics.json").exists()]
        if not candidates:
            raise FileNotFoundError(f"--resume: no earlier run named {config.name!r} in {output_dir}.")
        run_dir = str(candidates[-1])
    logger = ResultLogger(config.name, config, output_dir=output_dir, run_dir=run_dir, resume=resume)
    models = ModelSet(config, progress=progress)
    logger.set_device(models.device)
    runner = Runner(logger.cache, progress, tuple(config.top_k))
    corpus = None
    if any(e.uses_corpus for e in experiments):
        corpus = load_corpus(config, models)
        logger.set_data(corpus.describe())
    logger.describe_model("HMT (base)", models.hmt_fields() | {"weights": models.weights})
    if not models.trained:
        logger.add_note(
            f"Weights: {models.weights}. HMT and RMT numbers come from untrained memory parameters: they measure the "
            "mechanism on these weights, not the paper's claims about trained models (pass a trained HMT checkpoint "
            "as --model for those)."
        )
    logger.save("running")
    failed = False
    for experiment in experiments:
        print(f"[hmt-hf reproduce] {experiment.name} ({experiment.item_for(config)})", file=sys.stderr)
        start = time.perf_counter()
        try:
            result = experiment.run(config, models, corpus, runner)
        except (KeyboardInterrupt, Exception) as error:
            interrupted = isinstance(error, KeyboardInterrupt)
            reason = (
                "interrupted; rerun with --resume to continue" if interrupted else f"{type(error).__name__}: {error}"
            )
            logger.log_experiment(
                experiment.name,
                experiment.item_for(config),
                experiment.seed_names,
                "failed",
                reason,
                time.perf_counter() - start,
            )
            if interrupted or fail_fast:
                logger.save("partial")
                raise
            traceback.print_exc()
            failed = True
            logger.save("running")
            continue
        for record in result.metrics:
            record = dict(record)
            logger.log_metric(
                record.pop("experiment"),
                record.pop("model"),
                record.pop("metric"),
                record.pop("value"),
                record.pop("unit", None),
                **record,
            )
        for note in result.notes:
            logger.add_note(f"{experiment.name}: {note}")
        for series in result.series:
            logger.log_series(**series)
        for name, description in result.models.items():
            logger.describe_model(f"{experiment.name} / {name}", description)
        logger.log_experiment(
            experiment.name,
            experiment.item_for(config),
            experiment.seed_names,
            result.status,
            result.reason,
            time.perf_counter() - start,
        )
        logger.save("running")
    logger.document["status"] = "partial" if failed else "complete"
    logger.generate_report()
    return logger


def run(args: argparse.Namespace) -> int:
    from .experiments import EXPERIMENTS

    if args.preset is not None:
        from ..presets import run_preset

        try:
            summary = run_preset(args.preset, args.output_dir, args.model_name)
        except (ValueError, OSError, RuntimeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"report: {summary}")
        return 0
    if args.compare:
        from .reports import write_comparison
        from .results import load_runs

        path = write_comparison(load_runs(args.compare), Path(args.output_dir) / "comparison")
        print(f"comparison written to {path} and {path.with_suffix('.csv')}")
        return 0
    if args.experiments == ["list"]:
        for experiment in EXPERIMENTS.values():
            seeds = f" (also accepted: {', '.join(experiment.seed_names)})" if experiment.seed_names else ""
            print(f"{experiment.name:24s} {experiment.paper_item:34s} {experiment.description}{seeds}")
        return 0
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        config = config_from_args(args)
        preflight(config)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    logger = run_reproduction(config, args.output_dir, args.run_dir, args.resume, not args.no_progress, args.fail_fast)
    print(f"run directory: {logger.exp_dir}")
    print(f"  summary: {logger.exp_dir / 'summary.md'}")
    for entry in logger.document["experiments"]:
        print(f"  {entry['name']:24s} {entry['status']:9s} {entry['reason'] or ''}")
    return 0 if logger.document["status"] == "complete" else 1
