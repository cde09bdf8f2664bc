"""Efficiency (Table 7's parameters): latency, throughput, peak memory, FLOPs, parameter overhead."""

from __future__ import annotations

from ..baselines import (
    HMTScorer,
)
from ..evaluator import (
    measure_efficiency,
)
from ..scoring import make_samples
from .base import ExperimentResult, has_samples, metric_record


def run_efficiency(config, models, data, runner) -> ExperimentResult:
    """Latency p50/p95/p99 per sample and per step, throughput, peak memory, FLOPs estimate and parameters of every
    model on samples of `efficiency_length` tokens (every target scored). HMT/RMT run one segment per call, so
    their step latency is per segment."""
    segment_length = models.segment_length
    length = config.efficiency_length or config.sequence_lengths[0]
    if not has_samples(config, data, length, segment_length, "all_tokens"):
        return ExperimentResult.skipped(
            f"the test data ({len(data)} tokens) is shorter than {length + segment_length}"
        )
    samples = make_samples(
        data.token_ids,
        length,
        segment_length,
        "all_tokens",
        max(1, min(config.num_samples, config.efficiency_repeats)),
        None,
        data.byte_lengths,
    )
    result = ExperimentResult(
        notes=[
            "latency is wall-clock per sample (every target scored) and per step (one model call: one segment for "
            "HMT/RMT); throughput = input tokens / second; peak memory is CUDA max_memory_allocated on a GPU, else "
            "the process's peak RSS (weights included)."
        ]
    )
    scorers = models.baseline_scorers()
    for name, scorer in scorers.items():
        if isinstance(scorer, HMTScorer):
            scorer.segments_per_call = 1  # per-segment latency (streaming use)
        if not scorer.fits(length + segment_length):
            result.notes.append(f"{name} not measured: {length + segment_length} tokens exceed its positions.")
            continue
        stats = measure_efficiency(
            scorer, samples, config.efficiency_warmup, config.efficiency_repeats, runner.progress
        )
        result.models[name] = scorer.describe() | {
            "weights": models.weights_of(scorer),
            "step": stats["step_description"],
        }
        fields = {
            "sequence_length": length + segment_length,
            "num_samples": stats["num_measured"],
            "retrieval_mode": scorer.retrieval_mode if isinstance(scorer, HMTScorer) else None,
            "weights": models.weights_of(scorer),
        }
        for metric in (
            "latency_per_sample_ms_p50",
            "latency_per_sample_ms_p95",
            "latency_per_sample_ms_p99",
            "latency_per_step_ms_p50",
            "latency_per_step_ms_p95",
            "latency_per_step_ms_p99",
            "throughput",
            "peak_memory",
            "forward_flops_per_token",
            "positions_per_token",
            "parameters",
            "memory_parameters",
            "parameter_overhead",
        ):
            note = {
                "peak_memory": stats["peak_memory_kind"],
                "latency_per_step_ms_p50": stats["step_description"],
            }.get(metric)
            result.metrics.append(
                metric_record(
                    "efficiency", "Table 7 (parameters); efficiency", name, metric, stats[metric], note=note, **fields
                )
            )
    reference = next((n for n in ("Chunked", "Vanilla") if n in result.models), None)
    throughput = {m["model"]: m["value"] for m in result.metrics if m["metric"] == "throughput"}
    if reference is not None and throughput.get(reference):
        for name, value in throughput.items():
            result.metrics.append(
                metric_record(
                    "efficiency",
                    "Table 7 (parameters); efficiency",
                    name,
                    "speedup",
                    value / throughput[reference],
                    note=f"throughput / {reference} throughput",
                    sequence_length=length + segment_length,
                )
            )
    return result
