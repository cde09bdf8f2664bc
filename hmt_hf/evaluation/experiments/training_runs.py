"""Two-stage against single-stage training (Fig. 12), from the training runs' own logs."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from ..baselines import (
    HMTScorer,
)
from .base import ExperimentResult, ablation_length, has_samples, metric_record, protocol_samples, quality_records


def _stage_dirs(directories: str | Sequence[str]) -> list[Path]:
    """The stage folders of a training run, in order: the dirs given, where a `train_hmt.py --stage both` output
    dir (holding `stage1/` and `stage2/`) stands for its two stages."""
    result = []
    for directory in [directories] if isinstance(directories, str) else directories:
        path = Path(directory)
        stages = [path / "stage1", path / "stage2"]
        if not (path / "trainer_state.json").exists() and all(s.is_dir() for s in stages):
            result += stages
        else:
            result.append(path)
    return result


def _read_training_stage(path: Path) -> dict:
    """Losses, runtime and telemetry of one stage folder written by `examples/train_hmt.py` (Trainer's
    `trainer_state.json`, `train_results.json`, `eval_results.json`, the `telemetry.jsonl` of TelemetryCallback);
    a folder holding only `checkpoint-*/trainer_state.json` is read from its latest checkpoint."""
    state_path = path / "trainer_state.json"
    if not state_path.exists():
        checkpoints = sorted(
            path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1])
        )
        if not checkpoints:
            raise FileNotFoundError(f"{path} holds no trainer_state.json (nor checkpoint-*/trainer_state.json).")
        state_path = checkpoints[-1]
    history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])
    stage = {
        "steps": [],
        "losses": [],
        "runtime": None,
        "eval_loss": None,
        "last_step": 0,
        "peak_memory": None,
        "tokens_per_second": None,
    }
    for entry in history:
        stage["last_step"] = max(stage["last_step"], entry.get("step", 0))
        if "loss" in entry:
            stage["steps"].append(entry.get("step", 0))
            stage["losses"].append(entry["loss"])
        if "eval_loss" in entry:
            stage["eval_loss"] = entry["eval_loss"]
        if "train_runtime" in entry:
            stage["runtime"] = entry["train_runtime"]
        if "train_tokens_per_second" in entry:  # Trainer's, over the session so far: the last one covers it all
            stage["tokens_per_second"] = entry["train_tokens_per_second"]
    for name, key, field_name in (
        ("train_results.json", "train_runtime", "runtime"),
        ("eval_results.json", "eval_loss", "eval_loss"),
    ):
        if (path / name).exists():
            value = json.loads((path / name).read_text(encoding="utf-8")).get(key)
            stage[field_name] = value if value is not None else stage[field_name]
    telemetry = path / "telemetry.jsonl"
    if telemetry.exists():
        records = [json.loads(line) for line in telemetry.read_text(encoding="utf-8").splitlines() if line.strip()]
        peaks = [r["peak_memory_mib"] for r in records if "peak_memory_mib" in r]
        stage["peak_memory"] = max(peaks) if peaks else None
    return stage


def run_two_stage(config, models, data, runner) -> ExperimentResult:
    """Fig. 12: the training runs' wall-clock time (sum of `train_runtime` over stages), final training and
    evaluation losses, training telemetry and loss curves, read from `examples/train_hmt.py` output folders; the
    final model of each run is also scored on the test data when its last stage folder holds a saved HMT."""
    runs = config.training_runs
    if not runs:
        return ExperimentResult.skipped(
            "needs the output dirs of training runs (examples/train_hmt.py): --training-run two_stage=OUT_DIR (with "
            "stage1/ and stage2/) or two_stage=STAGE1_DIR,STAGE2_DIR, and --training-run single_stage=DIR"
        )
    result = ExperimentResult(notes=["training time is the sum of `train_runtime` over a run's stages."])
    length = ablation_length(config, models, data)
    item = "Fig. 12"
    for label, directories in runs.items():
        stages = [_read_training_stage(path) for path in _stage_dirs(directories)]
        steps, losses, offset = [], [], 0
        for stage in stages:
            steps += [offset + step for step in stage["steps"]]
            losses += stage["losses"]
            offset += stage["last_step"]
        result.series.append(
            {
                "experiment": "two_stage",
                "model": label,
                "name": "training loss",
                "x": steps,
                "y": losses,
                "x_label": "optimizer step (stages concatenated)",
                "y_label": "loss",
                "unit": "nats/token",
            }
        )
        runtimes = [stage["runtime"] for stage in stages]
        final_eval = stages[-1]["eval_loss"]
        fields = {"variant": label, "note": " + ".join(str(p) for p in _stage_dirs(directories))}
        values = {
            "train_runtime": sum(runtimes) if all(r is not None for r in runtimes) else None,
            "final_train_loss": losses[-1] if losses else None,
            "final_eval_loss": final_eval,
            "final_eval_perplexity": None if final_eval is None else math.exp(final_eval),
        }
        for metric, value in values.items():
            result.metrics.append(metric_record("two_stage", item, "HMT", metric, value, **fields))
        peaks = [s["peak_memory"] for s in stages if s["peak_memory"] is not None]
        if peaks:
            result.metrics.append(
                metric_record("two_stage", item, "HMT", "train_peak_memory", max(peaks), unit="MiB", **fields)
            )
        final_dir = _stage_dirs(directories)[-1]
        config_path = final_dir / "config.json"
        is_hmt = config_path.exists() and json.loads(config_path.read_text()).get("model_type") == "hmt"
        if length is None or not is_hmt:
            result.notes.append(f"two_stage: {final_dir} holds no saved HMT, so only its training log is reported.")
            continue
        model = models.checkpoint(str(final_dir))
        scorer = HMTScorer(model, name=f"HMT ({label})", max_logit_positions=config.max_logit_positions)
        result.models[scorer.name] = scorer.describe() | {"weights": f"HMT checkpoint {final_dir}"}
        for protocol in config.protocols:
            if not has_samples(config, data, length, model.config.segment_length, protocol):
                continue
            samples = protocol_samples(config, data, length, model.config.segment_length, protocol)
            outcome = runner.evaluate(scorer, samples, "two_stage", desc=f"{label} ({protocol})")
            result.metrics += quality_records(
                "two_stage",
                item,
                "HMT",
                scorer,
                outcome.metrics,
                models,
                runner.top_k,
                variant=label,
                protocol=protocol,
                sequence_length=length,
            )
    return result
