"""Ablations of the memory: retrieval on/off (Fig. 8), sensory memory size (Table 8), cache size (Fig. 10),
representation length (Fig. 9), BPTT depth (Table 9)."""

from __future__ import annotations

import math

from .base import ExperimentResult, ablation_length, variant_sweep


def run_retrieval(config, models, data, runner) -> ExperimentResult:
    variants = [
        ("retrieval on", "retrieval=on", {"use_memory_search": True}, True),
        ("retrieval off", "retrieval=off", {"use_memory_search": False}, True),
        ("no memory", None, {}, False),
    ]
    return variant_sweep(
        "retrieval",
        "Fig. 8",
        config,
        models,
        data,
        runner,
        variants,
        notes=["'no memory' is the plain chunked backbone of the same model (use_memory=False)."],
    )


def run_sensory_size(config, models, data, runner) -> ExperimentResult:
    variants = [
        (f"k={k}", f"sensory_memory_size={k}", {"sensory_memory_size": k, "use_sensory_memory": k > 0}, True)
        for k in config.sensory_sizes
    ]
    return variant_sweep("sensory_size", "Table 8", config, models, data, runner, variants)


def run_cache_size(config, models, data, runner) -> ExperimentResult:
    length = ablation_length(config, models, data)
    notes = []
    if length is not None:
        segments = math.ceil((length + models.segment_length) / models.segment_length)
        if any(size >= segments for size in config.cache_sizes):
            notes.append(
                f"Samples have {segments} segments, so the cache never holds more than {segments - 1} memories: "
                f"cache sizes >= {segments - 1} give identical results here (lengthen the inputs to separate them)."
            )
    variants = [
        (f"N={n}", f"num_memory_embeddings={n}", {"num_memory_embeddings": n}, True) for n in config.cache_sizes
    ]
    return variant_sweep("cache_size", "Fig. 10", config, models, data, runner, variants, notes)


def run_representation_length(config, models, data, runner) -> ExperimentResult:
    length = models.segment_length
    variants = [
        (f"j={j}", f"representation_length={j}", {"representation_length": j}, True)
        for j in dict.fromkeys((length // 2, length))
    ]
    return variant_sweep("representation_length", "Fig. 9", config, models, data, runner, variants)


def run_bptt_depth(config, models, data, runner) -> ExperimentResult:
    keys = {depth: f"bptt_depth={depth}" for depth in config.bptt_depths}
    available = {d: k for d, k in keys.items() if k in config.variant_checkpoints}
    if not available:
        example = " ".join(f"--checkpoint {k}=PATH" for k in keys.values())
        return ExperimentResult.skipped(
            "needs HMT checkpoints trained with each BPTT depth (examples/train_hmt.py); pass " + example
        )
    missing = [d for d in keys if d not in available]
    variants = [(f"depth={d}", k, {}, True) for d, k in available.items()]
    notes = [f"No checkpoint for depths {missing}: not evaluated."] if missing else []
    return variant_sweep("bptt_depth", "Table 9", config, models, data, runner, variants, notes)
