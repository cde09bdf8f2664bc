"""Perplexity against input length: Figs. 2-3, Table 2, Table 4."""

from __future__ import annotations

from ..evaluator import (
    relative_change,
)
from .base import EXPERIMENTS, ExperimentResult, length_sweep, metric_record


def run_ppl_vs_length(config, models, data, runner) -> ExperimentResult:
    item = EXPERIMENTS["ppl_vs_length"].item_for(config)
    return length_sweep(
        "ppl_vs_length",
        item,
        config,
        models,
        data,
        runner,
        models.baseline_scorers(),
        config.sequence_lengths,
        scope="ppl_vs_length",
    )


def run_average_ppl(config, models, data, runner) -> ExperimentResult:
    """Table 2: per model, the mean of its PPL over the input lengths; the relative change of HMT vs the paper's
    baseline (the chunked backbone) and vs every other model. Shares the per-sample cache of `ppl_vs_length`."""
    sweep = length_sweep(
        "ppl_vs_length",
        "Table 2",
        config,
        models,
        data,
        runner,
        models.baseline_scorers(),
        config.sequence_lengths,
        scope="ppl_vs_length",
    )
    if sweep.status != "complete":
        return sweep
    result = ExperimentResult(notes=sweep.notes, models=sweep.models)
    for protocol in config.protocols:
        rows = [m for m in sweep.metrics if m["metric"] == "perplexity" and m["protocol"] == protocol]
        lengths = sorted({m["sequence_length"] for m in rows if m["value"] is not None})
        complete = {}
        for model in dict.fromkeys(m["model"] for m in rows):
            values = {m["sequence_length"]: m["value"] for m in rows if m["model"] == model}
            if all(values.get(length) is not None for length in lengths):
                complete[model] = sum(values[length] for length in lengths) / len(lengths)
            else:
                missing = [length for length in lengths if values.get(length) is None]
                result.notes.append(f"{model} has no average ({protocol}): not run at lengths {missing}.")
        variant = "mean over lengths " + ", ".join(str(length) for length in lengths)
        for model, value in complete.items():
            source = next(m for m in rows if m["model"] == model)
            result.metrics.append(
                metric_record(
                    "average_ppl",
                    "Table 2",
                    model,
                    "perplexity",
                    value,
                    variant=variant,
                    protocol=protocol,
                    retrieval_mode=source.get("retrieval_mode"),
                    weights=source.get("weights"),
                )
            )
        if "HMT" in complete:
            for reference, value in complete.items():
                if reference == "HMT":
                    continue
                result.metrics.append(
                    metric_record(
                        "average_ppl",
                        "Table 2",
                        "HMT",
                        "relative_change",
                        relative_change(complete["HMT"], value),
                        variant=f"vs {reference}",
                        protocol=protocol,
                        note=f"100 x (HMT - {reference}) / {reference} of the mean PPL; negative = HMT lower",
                    )
                )
    return result


def run_long_input(config, models, data, runner) -> ExperimentResult:
    return length_sweep(
        "long_input",
        "Table 4",
        config,
        models,
        data,
        runner,
        models.baseline_scorers(),
        [config.long_length],
        scope="long_input",
    )
