"""The `metrics.json` schema (JSON Schema, checked with `jsonschema`) and the unit of every metric.

`metrics.json`, schema `hmt_hf.metrics/1`:

| key | content |
|---|---|
| `schema_version` | `"hmt_hf.metrics/1"` |
| `run_id`, `name` | the run directory's name; the experiment name given to the logger |
| `created_at`, `updated_at` | ISO 8601 UTC |
| `status` | `running`, `partial` (interrupted or some experiment failed), `complete` |
| `experiments` | one entry per named experiment: `name`, `paper_item`, `seed_names`, `status` (`complete`, `skipped`, `failed`), `reason`, `seconds` |
| `config`, `config_fingerprint` | the full `ExperimentConfig`; a hash of it |
| `seed`, `git` (`commit`, `dirty`), `environment` (`python`, `platform`, `libraries`, `device`) | provenance |
| `data` | the token stream: source, tokens, documents, bytes |
| `models` | name -> the scorer's description (method, window, HMT fields, retrieval mode, checkpoint, weights) |
| `metrics` | list of `{experiment, paper_item, model, variant, metric, value, unit, protocol, retrieval_mode, sequence_length, num_samples, num_tokens, weights, note}` |
| `series` | curves (training loss): `{experiment, model, name, x_label, y_label, unit, x, y}` |
| `notes` | statements a reader needs (untrained weights, skipped lengths, unscored tokens) |
"""

from __future__ import annotations

import functools
import json
import math
import os

SCHEMA_VERSION = "hmt_hf.metrics/1"

# Units every metric name carries (a metric logged under another name must give its unit explicitly).
METRIC_UNITS = {
    "perplexity": "perplexity",
    "mean_sample_perplexity": "perplexity",
    "loss": "nats/token",
    "bits_per_byte": "bits/byte",
    "top_1_accuracy": "fraction",
    "top_5_accuracy": "fraction",
    "num_scored_tokens": "tokens",
    "num_unscored_tokens": "tokens",
    "latency_per_sample_ms_p50": "ms",
    "latency_per_sample_ms_p95": "ms",
    "latency_per_sample_ms_p99": "ms",
    "latency_per_step_ms_p50": "ms",
    "latency_per_step_ms_p95": "ms",
    "latency_per_step_ms_p99": "ms",
    "throughput": "tokens/s",
    "peak_memory": "MiB",
    "forward_flops_per_token": "FLOPs/token",
    "positions_per_token": "positions/token",
    "parameters": "parameters",
    "memory_parameters": "parameters",
    "parameter_overhead": "%",
    "speedup": "x",
    "relative_change": "%",
    "train_runtime": "s",
    "final_train_loss": "nats/token",
    "final_eval_loss": "nats/token",
    "final_eval_perplexity": "perplexity",
}


# ---------------------------------------------------------------------------------------------------- schema
_NULLABLE_STRING = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}

METRICS_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "hmt_hf evaluation run (metrics.json)",
    "type": "object",
    "required": [
        "schema_version",
        "run_id",
        "name",
        "created_at",
        "updated_at",
        "status",
        "experiments",
        "config",
        "config_fingerprint",
        "seed",
        "git",
        "environment",
        "data",
        "models",
        "metrics",
        "series",
        "notes",
    ],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "run_id": {"type": "string", "minLength": 1},
        "name": {"type": "string", "minLength": 1},
        "created_at": {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT"},
        "updated_at": {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT"},
        "status": {"enum": ["running", "partial", "complete"]},
        "experiments": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "paper_item", "seed_names", "status", "reason", "seconds"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "paper_item": {"type": "string"},
                    "seed_names": {"type": "array", "items": {"type": "string"}},
                    "status": {"enum": ["complete", "skipped", "failed"]},
                    "reason": _NULLABLE_STRING,
                    "seconds": {"type": ["number", "null"], "minimum": 0},
                },
            },
        },
        "config": {"type": "object"},
        "config_fingerprint": {"type": "string", "minLength": 1},
        "seed": {"type": "integer"},
        "git": {
            "type": "object",
            "required": ["commit", "dirty"],
            "properties": {"commit": _NULLABLE_STRING, "dirty": {"type": ["boolean", "null"]}},
        },
        "environment": {
            "type": "object",
            "required": ["python", "platform", "libraries", "device"],
            "properties": {
                "python": {"type": "string"},
                "platform": {"type": "string"},
                "libraries": {"type": "object"},
                "device": {
                    "type": "object",
                    "required": ["type", "name"],
                    "properties": {"type": {"type": "string"}, "name": {"type": "string"}},
                },
            },
        },
        "data": {"type": ["object", "null"]},
        "models": {"type": "object"},
        "metrics": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "experiment",
                    "paper_item",
                    "model",
                    "variant",
                    "metric",
                    "value",
                    "unit",
                    "protocol",
                    "retrieval_mode",
                    "sequence_length",
                    "num_samples",
                    "num_tokens",
                    "weights",
                    "note",
                ],
                "additionalProperties": False,
                "properties": {
                    "experiment": {"type": "string", "minLength": 1},
                    "paper_item": _NULLABLE_STRING,
                    "model": {"type": "string", "minLength": 1},
                    "variant": _NULLABLE_STRING,
                    "metric": {"type": "string", "minLength": 1},
                    "value": {"type": ["number", "null"]},
                    "unit": {"type": "string", "minLength": 1},
                    "protocol": {"enum": ["last_segment", "all_tokens", None]},
                    "retrieval_mode": {"enum": ["paper", "causal", None]},
                    "sequence_length": _NULLABLE_INT,
                    "num_samples": _NULLABLE_INT,
                    "num_tokens": _NULLABLE_INT,
                    "weights": _NULLABLE_STRING,
                    "note": _NULLABLE_STRING,
                },
            },
        },
        "series": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["experiment", "model", "name", "x_label", "y_label", "unit", "x", "y"],
                "properties": {
                    "experiment": {"type": "string"},
                    "model": {"type": "string"},
                    "name": {"type": "string"},
                    "x_label": {"type": "string"},
                    "y_label": {"type": "string"},
                    "unit": {"type": "string"},
                    "x": {"type": "array", "items": {"type": "number"}},
                    "y": {"type": "array", "items": {"type": ["number", "null"]}},
                },
            },
        },
        "notes": {"type": "array", "items": {"type": "string"}},
    },
}


class SchemaError(ValueError):
    """`metrics.json` does not follow `METRICS_SCHEMA`; the message lists every violation with its JSON path."""


def validate_metrics(document: dict | str | os.PathLike) -> dict:
    """Check a `metrics.json` (a dict or a path) against `METRICS_SCHEMA` with `jsonschema`; return it, or raise
    `SchemaError` listing every violation. Also rejects NaN/infinity, which JSON cannot carry (missing values must be
    `null`) and which `jsonschema` accepts as numbers."""
    if not isinstance(document, dict):
        with open(document, encoding="utf-8") as handle:
            document = json.load(handle, parse_constant=_reject_constant)
    errors = [
        f"$.{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in _validator().iter_errors(document)
    ]
    errors += _non_finite_numbers(document)
    if errors:
        raise SchemaError(f"metrics.json violates {SCHEMA_VERSION} ({len(errors)} problems):\n" + "\n".join(errors))
    return document


@functools.cache
def _validator():
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(METRICS_SCHEMA)
    return jsonschema.Draft202012Validator(METRICS_SCHEMA)


def _reject_constant(name):
    raise SchemaError(f"metrics.json contains {name}, which is not JSON; missing values must be null.")


def _non_finite_numbers(value, path: str = "$") -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{path}: {value} is not a finite number (use null)"]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in _non_finite_numbers(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [e for i, v in enumerate(value) for e in _non_finite_numbers(v, f"{path}[{i}]")]
    return []
