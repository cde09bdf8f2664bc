"""`hmt-hf reproduce` (and `examples/reproduce_paper.py`): run named experiments mapped to the paper's tables and
figures and write a run directory (metrics.json, summary.md, tables, plots, comparison with earlier runs).

    hmt-hf reproduce --experiments list
    hmt-hf reproduce --model smollm2 --data wiki --segment_length 256 --lengths 2048,8192 --num_samples 4 \\
        --experiments ppl_vs_length,efficiency --output_dir results
    hmt-hf reproduce --run_dir results/hmt_evaluation_001 --resume ...     # continue an interrupted run
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
from dataclasses import dataclass, field
from pathlib import Path

from .config import ExperimentConfig
from .results import ResultLogger


@dataclass
class ReproduceArguments:
    """What `hmt-hf reproduce` does with an [`ExperimentConfig`] (whose fields are the other flags)."""

    preset: str | None = field(
        default=None,
        metadata={
            "help": "The whole job: convert, train the HMT and its same-budget baseline, evaluate, report into "
            "--output_dir (quick: ~8 min on 2 CPU cores; books-cpu: ~1 h; paper: the paper's recipe, for a GPU)."
        },
    )
    compare: list[str] | None = field(
        default=None,
        metadata={"help": "Only compare finished run directories (writes --output_dir/comparison.md|.csv).",
                  "metavar": "RUN_DIR"},
    )  # fmt: skip
    config: str | None = field(
        default=None, metadata={"help": "An ExperimentConfig as JSON; the flags given beside it override it."}
    )
    output_dir: str = field(default="results", metadata={"help": "Parent folder of run directories."})
    run_dir: str | None = field(default=None, metadata={"help": "Use exactly this run directory."})
    resume: bool = field(
        default=False,
        metadata={
            "help": "Continue the run in --run_dir (or the latest run of --name): completed samples come from its cache."
        },
    )
    threads: int | None = field(default=None, metadata={"help": "torch intra-op threads."})
    progress: bool = field(default=True, metadata={"help": "Progress bars (--no-progress: none)."})
    fail_fast: bool = field(default=False, metadata={"help": "Stop at the first failing experiment."})


def _parser():
    from transformers import HfArgumentParser

    return HfArgumentParser(
        (ExperimentConfig, ReproduceArguments),
        prog="hmt-hf reproduce",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def parse(argv: list[str]) -> tuple[ExperimentConfig, ReproduceArguments]:
    """Flags (or one .json/.yaml file holding both dataclasses' fields). With `--config FILE`, the file's
    `ExperimentConfig` is the default of every flag; repeated flags (`--checkpoint`) add to its entries."""
    from ..cli import parse_dataclasses

    parser = _parser()
    known, _ = parser.parse_known_args(argv)
    if known.config:
        defaults = ExperimentConfig.from_json(known.config).to_dict()
        defaults["variant_checkpoints"] = [f"{k}={v}" for k, v in defaults["variant_checkpoints"].items()]
        defaults["training_runs"] = [f"{k}={','.join(v)}" for k, v in defaults["training_runs"].items()]
        parser.set_defaults(**defaults)
    return parse_dataclasses(parser, argv)


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
            f"--data_dir {config.data_dir}: no such folder; build it with "
            f"`hmt-hf prepare-data {data} --output_dir {config.data_dir}`."
        )
    if data not in (*NAMED_CORPORA, "shakespeare", "random") and not os.path.exists(data):
        raise ValueError(
            f"--data {data}: no such file or folder; use a .txt/.jsonl file, a folder of .txt files, `shakespeare`, "
            f"or one of {NAMED_CORPORA} (built with `hmt-hf prepare-data NAME --output_dir DIR`, then --data_dir DIR)."
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
    from .experiments import ModelSet, Runner, load_corpus, resolve_experiments

    experiments = resolve_experiments(config.experiments)
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


def cli(argv: list[str]) -> int:
    try:
        config, args = parse(argv)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.preset is not None:
        from ..presets import run_preset

        backbone = None if config.model_name == ExperimentConfig.model_name else config.model_name
        try:
            summary = run_preset(args.preset, args.output_dir, backbone)
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
    if config.experiments == ["list"]:
        from .experiments import EXPERIMENTS

        for experiment in EXPERIMENTS.values():
            seeds = f" (also accepted: {', '.join(experiment.seed_names)})" if experiment.seed_names else ""
            print(f"{experiment.name:24s} {experiment.paper_item:34s} {experiment.description}{seeds}")
        return 0
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        preflight(config)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    logger = run_reproduction(config, args.output_dir, args.run_dir, args.resume, args.progress, args.fail_fast)
    print(f"run directory: {logger.exp_dir}")
    print(f"  summary: {logger.exp_dir / 'summary.md'}")
    for entry in logger.document["experiments"]:
        print(f"  {entry['name']:24s} {entry['status']:9s} {entry['reason'] or ''}")
    return 0 if logger.document["status"] == "complete" else 1
