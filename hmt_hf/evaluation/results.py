"""Keeping runs comparable: the run directory, its provenance, the per-sample cache that lets an interrupted evaluation
resume, and `ResultLogger`, which writes them (the configuration is `config.py`, the schema `schema.py`).

A run directory (`ResultLogger.exp_dir`) holds:

    metrics.json          every metric with its unit, the full config, git commit, seed, library versions, device
                          (schema `METRICS_SCHEMA`, version `SCHEMA_VERSION`; `validate_metrics` checks a file)
    summary.md            the tables a person reads, with the protocol and weights behind every number
    tables/*.csv|*.tex    one long-format CSV per experiment, and LaTeX pivot tables
    plots/*.png           PPL vs length, ablation bars, efficiency bars, training curves
    comparison.md|.csv    this run next to earlier runs of the same name in the same output folder
    cache/samples.jsonl   one line per (model, sample) scored: rerunning into this directory skips them

The `metrics.json` fields and schema are in `schema.py`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from .config import ExperimentConfig
from .schema import METRIC_UNITS, SCHEMA_VERSION, validate_metrics


# ---------------------------------------------------------------------------------------------------- provenance
def git_state(path: str | os.PathLike | None = None) -> dict:
    """`{"commit", "dirty"}` of the git checkout holding `path` (this package by default); nulls outside git."""
    folder = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(status.strip())}


def environment_info(device=None) -> dict:
    """Python, platform, versions of the libraries that change numbers, and the device."""
    import importlib.metadata

    libraries = {}
    for name in (
        "hmt_hf",
        "torch",
        "transformers",
        "accelerate",
        "datasets",
        "evaluate",
        "peft",
        "tokenizers",
        "numpy",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            libraries[name] = importlib.metadata.version(name)
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "libraries": libraries,
        "device": device_info(device),
    }


def device_info(device=None) -> dict:
    import torch

    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(device), "count": torch.cuda.device_count()}
    return {
        "type": device.type,
        "name": platform.processor() or platform.machine() or "cpu",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _json_safe(value):
    """NaN/inf -> None, tensors/numpy scalars -> Python numbers, tuples -> lists (recursively)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return _json_safe(value.item())
    if isinstance(value, Path):
        return str(value)
    return value


def write_json_atomic(path: Path, document: dict):
    """Write through a temporary file and rename, so an interruption never leaves half a JSON file."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, allow_nan=False)
        handle.write("\n")
    os.replace(temporary, path)


# ---------------------------------------------------------------------------------------------------- cache
class ResultCache:
    """Per-sample results of a run, one JSON line each, keyed by (model, sample, ...) and checked against a
    fingerprint of the scorer and data, so a rerun into the same run directory skips completed samples and never
    reuses a result computed with other settings. Lines cut short by an interruption are ignored."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._entries: dict[str, dict] = {}
        if self.path.exists():
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # the line being written when the run was killed
                    if isinstance(entry, dict) and "key" in entry:
                        self._entries[entry["key"]] = entry

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, fingerprint: str) -> dict | None:
        entry = self._entries.get(key)
        if entry is None or entry.get("fingerprint") != fingerprint:
            return None
        return entry["record"]

    def put(self, key: str, fingerprint: str, record: dict):
        entry = {"key": key, "fingerprint": fingerprint, "record": _json_safe(record)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, allow_nan=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._entries[key] = entry


# ---------------------------------------------------------------------------------------------------- logger
_METRIC_KEY_FIELDS = ("experiment", "model", "variant", "metric", "protocol", "sequence_length")


class ResultLogger:
    """A run directory and its `metrics.json` (see the module docstring), written after every experiment so an
    interrupted run leaves a valid, `partial` file.

    Args:
        experiment_name (`str`): name of the run (directory prefix).
        config ([`ExperimentConfig`], *optional*).
        output_dir (`str`): parent folder of run directories (default `results`).
        auto_increment (`bool`): a new `<name>_NNN` directory per run (the seed notebook's behaviour); `False`
            uses `<output_dir>/<name>`.
        run_dir (`str`, *optional*): use exactly this directory; with `resume=True` an existing run there is
            continued (its cache reused, its metrics kept), after checking the config fingerprint matches.
    """

    def __init__(
        self,
        experiment_name: str,
        config: ExperimentConfig | None = None,
        output_dir: str | os.PathLike = "results",
        auto_increment: bool = True,
        run_dir: str | os.PathLike | None = None,
        resume: bool = False,
    ):
        self.experiment_name = experiment_name
        self.config = config if config is not None else ExperimentConfig(name=experiment_name)
        self.output_dir = Path(output_dir) if run_dir is None else Path(run_dir).parent
        if run_dir is not None:
            self.exp_dir = Path(run_dir)
        elif auto_increment:
            self.exp_dir = self._next_run_dir(self.output_dir, experiment_name)
        else:
            self.exp_dir = self.output_dir / experiment_name
        metrics_path = self.exp_dir / "metrics.json"
        if metrics_path.exists() and not resume:
            raise FileExistsError(
                f"{self.exp_dir} already holds a run; pass resume=True (CLI: --resume) to continue it, or choose "
                "another run directory."
            )
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        self.document = self._new_document()
        if metrics_path.exists():
            self._resume(metrics_path)
        self.cache = ResultCache(self.exp_dir / "cache" / "samples.jsonl")

    @staticmethod
    def _next_run_dir(output_dir: Path, name: str) -> Path:
        numbers = [
            int(match.group(1))
            for p in output_dir.glob(f"{glob_escape(name)}_*")
            if (match := re.fullmatch(re.escape(name) + r"_(\d{3,})", p.name))
        ]
        return output_dir / f"{name}_{max(numbers, default=0) + 1:03d}"

    def _new_document(self) -> dict:
        now = utc_now()
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.exp_dir.name,
            "name": self.experiment_name,
            "created_at": now,
            "updated_at": now,
            "status": "running",
            "experiments": [],
            "config": _json_safe(self.config.to_dict()),
            "config_fingerprint": self.config.fingerprint(),
            "seed": self.config.seed,
            "git": git_state(),
            "environment": environment_info(),
            "data": None,
            "models": {},
            "metrics": [],
            "series": [],
            "notes": [],
        }

    def _resume(self, metrics_path: Path):
        previous = validate_metrics(metrics_path)
        if previous["config_fingerprint"] != self.document["config_fingerprint"]:
            changed = sorted(
                key
                for key in set(previous["config"]) | set(self.document["config"])
                if previous["config"].get(key) != self.document["config"].get(key)
                and key not in ("experiments", "notes", "name", "paper_table")
            )
            raise ValueError(
                f"{self.exp_dir} was run with other settings (changed: {changed}); resuming would mix results. "
                "Use a new run directory, or the same settings."
            )
        for key in ("run_id", "created_at", "experiments", "models", "metrics", "series", "notes", "data"):
            self.document[key] = previous[key]

    # -- recording
    @property
    def metrics(self) -> list[dict]:
        return self.document["metrics"]

    def set_device(self, device):
        self.document["environment"]["device"] = device_info(device)

    def set_data(self, description: dict):
        self.document["data"] = _json_safe(description)

    def describe_model(self, name: str, description: dict):
        self.document["models"][name] = _json_safe(description)

    def add_note(self, text: str):
        if text not in self.document["notes"]:
            self.document["notes"].append(text)

    def log_metric(
        self,
        experiment: str,
        model: str,
        metric: str,
        value,
        unit: str | None = None,
        *,
        paper_item: str | None = None,
        variant: str | None = None,
        protocol: str | None = None,
        retrieval_mode: str | None = None,
        sequence_length: int | None = None,
        num_samples: int | None = None,
        num_tokens: int | None = None,
        weights: str | None = None,
        note: str | None = None,
    ) -> dict:
        """Record one number with its unit (replacing an earlier record with the same experiment, model, variant,
        metric, protocol and length). `unit` defaults to `METRIC_UNITS[metric]`."""
        if unit is None:
            if metric not in METRIC_UNITS:
                raise ValueError(f"Metric {metric!r} has no default unit; pass unit= (e.g. 'ms', 'perplexity').")
            unit = METRIC_UNITS[metric]
        record = {
            "experiment": experiment,
            "paper_item": paper_item,
            "model": model,
            "variant": variant,
            "metric": metric,
            "value": _json_safe(None if value is None else float(value)),
            "unit": unit,
            "protocol": protocol,
            "retrieval_mode": retrieval_mode,
            "sequence_length": None if sequence_length is None else int(sequence_length),
            "num_samples": None if num_samples is None else int(num_samples),
            "num_tokens": None if num_tokens is None else int(num_tokens),
            "weights": weights,
            "note": note,
        }
        key = tuple(record[k] for k in _METRIC_KEY_FIELDS)
        self.document["metrics"] = [
            m for m in self.document["metrics"] if tuple(m[k] for k in _METRIC_KEY_FIELDS) != key
        ]
        self.document["metrics"].append(record)
        return record

    def log_series(
        self,
        experiment: str,
        model: str,
        name: str,
        x,
        y,
        x_label: str = "step",
        y_label: str = "loss",
        unit: str = "",
    ):
        """Record a curve (e.g. training loss per step)."""
        self.document["series"] = [
            s for s in self.document["series"] if (s["experiment"], s["model"], s["name"]) != (experiment, model, name)
        ]
        self.document["series"].append(
            {
                "experiment": experiment,
                "model": model,
                "name": name,
                "x_label": x_label,
                "y_label": y_label,
                "unit": unit or "",
                "x": _json_safe(list(x)),
                "y": _json_safe(list(y)),
            }
        )

    def log_experiment(
        self,
        name: str,
        paper_item: str,
        seed_names: tuple[str, ...] | list[str] = (),
        status: str = "complete",
        reason: str | None = None,
        seconds: float | None = None,
    ):
        """Record that a named experiment ran (or was skipped / failed, and why)."""
        entry = {
            "name": name,
            "paper_item": paper_item,
            "seed_names": list(seed_names),
            "status": status,
            "reason": reason,
            "seconds": None if seconds is None else round(float(seconds), 3),
        }
        entries = self.document["experiments"]
        positions = [i for i, e in enumerate(entries) if e["name"] == name]
        if positions:  # a rerun keeps the experiment's place in the report
            entries[positions[0]] = entry
        else:
            entries.append(entry)

    def save(self, status: str | None = None) -> Path:
        """Write `metrics.json` (validated first: an invalid document is never written)."""
        if status is not None:
            self.document["status"] = status
        self.document["updated_at"] = utc_now()
        validate_metrics(self.document)
        path = self.exp_dir / "metrics.json"
        write_json_atomic(path, self.document)
        return path

    def generate_report(self, save_name: str = "summary.md", compare: bool = True) -> Path:
        """Write `metrics.json`, `summary.md` (as `save_name`), CSV and LaTeX tables, plots and, when earlier runs
        of the same name exist in the output folder, the comparison with them. Returns the summary's path."""
        from .reports import write_comparison, write_reports

        self.save()
        summary = write_reports(self.exp_dir, self.document, summary_name=save_name)
        if compare:
            earlier = sorted(
                p
                for p in self.output_dir.glob(f"{glob_escape(self.experiment_name)}*")
                if p != self.exp_dir and (p / "metrics.json").exists()
            )
            if earlier:
                write_comparison(load_runs([*earlier, self.exp_dir]), self.exp_dir / "comparison")
        return summary


def load_runs(run_dirs) -> list[dict]:
    """The validated `metrics.json` of each run directory."""
    return [validate_metrics(Path(d) / "metrics.json") for d in run_dirs]


def glob_escape(text: str) -> str:
    return re.sub(r"([\[\]*?])", r"[\1]", text)
