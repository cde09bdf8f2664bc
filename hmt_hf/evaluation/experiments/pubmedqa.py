"""PubMedQA with fused contexts (Figs. 5-6), through `hmt_hf.evaluation.zero_shot` (on lm-evaluation-harness)."""

from __future__ import annotations

import importlib.util

from .base import ExperimentResult, metric_record


def run_pubmedqa(config, models, data, runner) -> ExperimentResult:
    """Figs. 5-6 through `hmt_hf.evaluation.zero_shot.run_pubmedqa` (long-answer PPL, short-answer accuracy with
    2..10 fused contexts) for the HMT and its backbone. Needs lm-evaluation-harness and PubMedQA offline:
    `config.pubmedqa_data`."""
    if importlib.util.find_spec("lm_eval") is None:
        return ExperimentResult.skipped("needs lm-evaluation-harness: pip install 'hmt_hf[lm_eval]'")
    data_path = config.pubmedqa_data
    if not data_path:
        return ExperimentResult.skipped("needs PubMedQA as a local file (offline): --pubmedqa-data PATH (json/jsonl)")
    from .. import zero_shot

    result = ExperimentResult()
    for name, model in (("HMT", models.hmt), ("Backbone", models.hmt.backbone)):
        outcome = zero_shot.run_pubmedqa(
            model, models.tokenizer, data_path, num_contexts=config.pubmedqa_contexts, progress=runner.progress
        )
        for key, entry in outcome["metrics"].items():
            _, contexts, metric = key.split("/")
            result.metrics.append(
                metric_record(
                    "pubmedqa",
                    "Figs. 5-6",
                    name,
                    metric,
                    entry["value"],
                    unit=entry["unit"],
                    variant=contexts.replace("_", "="),
                    weights=models.weights,
                )
            )
    return result
