"""`hmt-hf reproduce --preset NAME --output_dir DIR`: the whole job in one command.

Convert a backbone to an HMT, train it (both stages) and the same-budget chunked baseline on the same windows,
steps, tokens and schedule, then score HMT (paper and causal retrieval), the trained HMT in RMT mode, and the
baseline as chunked, sliding-window and vanilla models on held-out documents, sample by sample. Writes

    DIR/checkpoints/hmt        the trained HMT (AutoModelForCausalLM.from_pretrained)
    DIR/checkpoints/baseline   the trained baseline backbone (a plain causal LM)
    DIR/report/                metrics.json, summary.md, plots (perplexity vs length, learning curves)
    DIR/runs/, DIR/logs/       the training runs (resumable) and their logs

Rerunning the same command resumes: finished stages are skipped, unfinished ones continue from their checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Preset:
    """One end-to-end configuration. `train` holds `hmt-hf train` arguments shared by the HMT and its baseline."""

    description: str
    corpus: str
    lengths: tuple[int, ...]
    num_samples: int
    train: dict = field(default_factory=dict)


COMMON = {
    "model_name_or_path": "smollm2", "sensory_memory_size": 32, "num_memory_embeddings": 300,
    "retrieval_mode": "paper", "stage": "both", "lr_schedule": "step_decay", "lr_decay_steps": 100,
    "lr_decay_gamma": 0.9, "weight_decay": 0.0, "per_device_train_batch_size": 1, "seed": 42, "data_seed": 42,
    "do_train": True, "do_eval": False, "eval_strategy": "no", "logging_steps": 2, "save_strategy": "steps",
    "save_total_limit": 1, "report_to": "none", "disable_tqdm": True,
}  # fmt: skip

# SmolLM2 at L=256 on CPU (full fine-tuning): the quick and books-cpu presets differ only in steps and depth.
CPU_L256 = {
    **COMMON,
    "segment_length": 256,
    "representation_length": 128,
    "stage1_bptt_depth": 2,
    "learning_rate": 5e-5,
}

PRESETS = {
    "quick": Preset(
        "SmolLM2-135M, L=256, k=32, j=128, N=300; 12 stage-1 steps (2 x 256 tokens) and 24 stage-2 steps "
        "(3 x 256 tokens) on the offline books corpus; 8 minutes on 2 CPU cores",
        corpus="books",
        lengths=(2048, 4096),
        num_samples=2,
        train={**CPU_L256, "stage1_max_steps": 12, "bptt_depth": 3, "max_steps": 24, "save_steps": 6},
    ),
    "books-cpu": Preset(
        "SmolLM2-135M, L=256, k=32, j=128, N=300; 60 stage-1 steps (2 x 256 tokens) and 120 stage-2 steps "
        "(4 x 256 tokens) on the offline books corpus: the budget of reports/books_cpu (its HMT trained 43 min on "
        "one core of a shared 2-core machine)",
        corpus="books",
        lengths=(2048, 8192, 16384),
        num_samples=3,
        train={**CPU_L256, "stage1_max_steps": 60, "bptt_depth": 4, "max_steps": 120, "save_steps": 20},
    ),
    "paper": Preset(
        "The paper's recipe (Table 7): L=1024, j=512, k=32, N=300, 15-segment BPTT in stage 2, 700 steps per stage, "
        "batch 2, LR 1e-5 with x0.9 every 100 steps, bf16 — for a GPU",
        corpus="books",
        lengths=(2048, 10240, 30720),
        num_samples=4,
        train={
            **COMMON,
            "segment_length": 1024,
            "representation_length": 512,
            "stage1_bptt_depth": 2,
            "stage1_max_steps": 700,
            "bptt_depth": 15,
            "max_steps": 700,
            "learning_rate": 1e-5,
            "per_device_train_batch_size": 2,
            "bf16": True,
            "activation_checkpointing": True,
            "save_steps": 100,
        },
    ),  # fmt: skip
}


def log(message: str):
    print(f"[hmt-hf reproduce {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def check(name: str, output_dir: str, model: str | None = None):
    """Fail before anything slow: an unknown preset, a missing backbone folder or offline SmolLM2."""
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r} is unknown: use one of {sorted(PRESETS)}.")
    from .data.documents import looks_like_local_path
    from .offline import smollm2_folder

    model = model or PRESETS[name].train["model_name_or_path"]
    if model == "smollm2":
        smollm2_folder()
    elif looks_like_local_path(model) and not os.path.isdir(model):
        raise ValueError(f"--model {model}: no such folder; pass a model folder, a Hub id or `smollm2`.")
    if os.path.isfile(output_dir):
        raise ValueError(f"--output_dir {output_dir} is a file; pass a folder.")


def train_both(preset: Preset, root: Path, threads: int) -> dict[str, Path]:
    """Train the HMT and the chunked baseline side by side (one process each), showing their progress."""
    data_dir = root / "data" / preset.corpus
    runs, logs = root / "runs", root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    jobs = {}
    for method in ("hmt", "chunked"):
        args = {**preset.train, "dataset_name": str(data_dir), "output_dir": str(runs / method), "method": method}
        args_file = logs / f"{method}.json"
        args_file.write_text(json.dumps(args, indent=1))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "hmt_hf.training.run", str(args_file), "--resume_from_checkpoint", "last"]
        handle = open(logs / f"{method}.log", "a", encoding="utf-8")
        jobs[method] = (subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env), handle)
    try:
        while any(process.poll() is None for process, _ in jobs.values()):
            time.sleep(15)
            steps = {"stage1": preset.train["stage1_max_steps"], "stage2": preset.train["max_steps"]}
            log("training: " + "; ".join(f"{m} {progress(runs / m, steps)}" for m in jobs))
    finally:
        for process, handle in jobs.values():
            if process.poll() is None:
                process.terminate()
            handle.close()
    for method, (process, _) in jobs.items():
        if process.returncode != 0:
            tail = (logs / f"{method}.log").read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"training {method} failed (exit {process.returncode}); {logs / method}.log:\n{tail}")
    return {"hmt": runs / "hmt" / "stage2", "baseline": runs / "chunked" / "backbone"}


def progress(run: Path, max_steps: dict[str, int]) -> str:
    """`stageN step/total` of a training run, from the telemetry its stages write at every log."""
    for stage in ("stage2", "stage1"):
        folder = run / stage
        if (folder / "train_results.json").is_file():
            return f"{stage} done"
        try:  # the run appends to this file while we read it: a partial last line is skipped
            lines = (folder / "telemetry.jsonl").read_text().splitlines()
        except OSError:
            continue
        steps = []
        for line in lines:
            try:
                steps.append(json.loads(line).get("step", 0))
            except ValueError:
                pass
        return (
            f"{stage} step {steps[-1] if steps else 0}/{max_steps[stage]}"  # the last record (a resumed run appends)
        )
    return "loading the model and tokenizing the corpus"


def export(trained: dict[str, Path], root: Path) -> dict[str, Path]:
    """Copy the final models to DIR/checkpoints/{hmt,baseline} (without optimizer checkpoints)."""
    exported = {}
    for name, source in trained.items():
        target = root / "checkpoints" / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("checkpoint-*", "training_args.bin"))
        exported[name] = target
    return exported


def evaluate(preset: Preset, root: Path, checkpoints: dict[str, Path], threads: int) -> Path:
    """Score the trained HMT and baseline on the held-out test documents; write DIR/report."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .configuration_hmt import HMT_FIELDS
    from .evaluation import comparison

    torch.set_num_threads(threads)
    hmt = AutoModelForCausalLM.from_pretrained(checkpoints["hmt"]).eval()
    baseline = AutoModelForCausalLM.from_pretrained(checkpoints["baseline"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoints["hmt"])
    length = hmt.config.segment_length
    scorers = comparison.standard_scorers(hmt, baseline)
    start = time.time()
    results, diagnostics = comparison.compare(
        scorers, [preset.corpus], list(preset.lengths), tokenizer, str(root / "data"), length, preset.num_samples,
        diagnostics_length=preset.lengths[-1], diagnostics_model=hmt, log=log,
    )  # fmt: skip
    sources = {"HMT": root / "runs" / "hmt", f"chunked (trained baseline, L={length})": root / "runs" / "chunked"}
    document = {
        "benchmark": "hmt-hf reproduce --preset",
        "weights": f"trained: HMT {checkpoints['hmt']}, baseline {checkpoints['baseline']} (same windows, steps, "
        "tokens and schedule)",
        "reference": next(iter(scorers)),
        "hmt": {k: getattr(hmt.config, k) for k in HMT_FIELDS},
        "protocols": {
            "all_tokens": "every target 1..T-1 of each sample",
            "last_segment": "the targets of each sample's last segment (the paper's protocol)",
        },
        "training_budget": {name: comparison.training_budget(str(path)) for name, path in sources.items()},
        "learning_curves": {name: comparison.learning_curve(str(path)) for name, path in sources.items()},
        "results": results,
        "diagnostics": diagnostics,
        "wall_seconds": round(time.time() - start, 1),
        "threads": threads,
    }
    summary = comparison.save(document, root / "report")
    write_card(hmt, checkpoints["hmt"], document)
    return summary


def write_card(hmt, folder: Path, document: dict):
    """The exported HMT's model card, with the report's results (the same-budget baseline beside HMT) as its
    `model-index` and the training budget of both."""
    from .hub import create_model_card
    from .offline import SMOLLM2_HUB_ID

    results = [
        {
            "dataset_name": f"held-out {row['corpus']} test documents", "dataset_type": row["corpus"],
            "dataset_split": "test", "metric_type": "perplexity", "metric_value": row["perplexity"],
            "metric_name": f"{row['model']}, {row['length']}-token samples, {row['protocol'].replace('_', ' ')}",
        }
        for row in document["results"]
        if row["model"] in (document["reference"], "HMT (paper retrieval)")
    ]  # fmt: skip
    budget = document["training_budget"]
    training = "; ".join(
        f"{name}: " + ", ".join(f"{stage} {b['steps']} steps / {b['tokens']:,} tokens / {b['wall_seconds']:.0f} s"
                                for stage, b in stages.items())
        for name, stages in budget.items()
    )  # fmt: skip
    lines = [f"| {r['metric_name']} | {r['metric_value']} |" for r in results]
    create_model_card(
        hmt,
        folder.name,
        base_model=SMOLLM2_HUB_ID if "smollm2" in str(hmt.config.text_config._name_or_path).lower() else None,
        eval_results=results,
        training_text=f"`hmt-hf reproduce --preset`, the HMT and its same-budget chunked baseline on the same "
        f"windows, steps and schedule ({training}).",
        evaluation_text="Perplexity on held-out documents (see the run's report/summary.md):\n\n"
        "| model, samples, protocol | perplexity |\n|---|---|\n" + "\n".join(lines),
    ).save(folder / "README.md")


def run_preset(name: str, output_dir: str, model: str | None = None) -> Path:
    """Run the preset end to end (resumable); returns the report's summary.md. `model` replaces the preset's backbone
    (a Hub id or folder: `--preset paper --model HuggingFaceTB/SmolLM2-135M` on a machine with the Hub)."""
    check(name, output_dir, model)
    preset = PRESETS[name]
    if model is not None:
        preset = Preset(preset.description, preset.corpus, preset.lengths, preset.num_samples,
                        {**preset.train, "model_name_or_path": model})  # fmt: skip
    root = Path(output_dir)
    started = time.time()
    log(f"preset {name}: {preset.description}")
    data_dir = root / "data" / preset.corpus
    if not (data_dir / "dataset_dict.json").is_file():
        from .data import prepare_data

        log(f"[1/4] preparing the {preset.corpus} corpus (split by document) in {data_dir}")
        prepare_data(preset.corpus, output_dir=data_dir)
    threads = max(1, (os.cpu_count() or 2) // 2)
    log(f"[2/4] training the HMT and the same-budget chunked baseline ({threads} thread(s) each); logs in {root}/logs")
    trained = train_both(preset, root, threads)
    log("[3/4] exporting the trained models to checkpoints/hmt and checkpoints/baseline")
    checkpoints = export(trained, root)
    log(f"[4/4] scoring held-out {preset.corpus} documents at {', '.join(map(str, preset.lengths))} tokens")
    summary = evaluate(preset, root, checkpoints, threads=os.cpu_count() or 2)
    log(f"done in {time.time() - started:.0f} s: report {summary}")
    return summary
