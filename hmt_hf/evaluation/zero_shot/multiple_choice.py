"""Zero-shot multiple choice through lm-evaluation-harness: `run_zero_shot`."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from .tasks import DataSource, MultipleChoiceTask, expand_tasks, load_task_dataset

logger = logging.getLogger(__name__)

# Reported accuracies: the choice predicted is the argmax (first on ties) of ...
NORMALISATIONS = {
    "acc": "sum of log-likelihoods (lm-eval acc)",
    "acc_norm": "log-likelihood per character of the choice (lm-eval acc_norm)",
    "acc_per_token": "log-likelihood per token of the choice (harness.ChoiceTask's addition to lm-eval)",
    "acc_per_byte": "log-likelihood per UTF-8 byte of the choice (lm-eval acc_bytes)",
}
# The lm-eval metric (of `harness.ChoiceTask`) each is read from.
LM_EVAL_METRICS = {"acc": "acc", "acc_norm": "acc_norm", "acc_per_token": "acc_per_token", "acc_per_byte": "acc_bytes"}


def run_zero_shot(
    model,
    tokenizer,
    tasks: str | MultipleChoiceTask | Sequence[str | MultipleChoiceTask] = "smallbench",
    *,
    data: Mapping[str, DataSource] | None = None,
    split: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    max_length: int | str | None = "model",
    prepend_bos: bool | None = None,
    share_context_memory: bool = True,
    model_kwargs: Mapping | None = None,
    metric_prefix: str = "zero_shot",
    return_predictions: bool = False,
    progress: bool = True,
) -> dict:
    """Zero-shot multiple-choice accuracy by log-likelihood on each task, evaluated by lm-evaluation-harness.

    Each task's rows are built into questions by its spec (context, choices, gold index) and evaluated by
    `lm_eval.evaluator.evaluate` as an in-memory `multiple_choice` task ([`harness.ChoiceTask`]) with the model's
    lm-eval backend ([`lm_for`]: `HMTLM` for HMT, lm-eval's `HFLM` for a transformers causal LM, `ScorerLM` for a
    baseline `Scorer` or another module).

    Args:
        model, tokenizer: any causal LM (HMT, its backbone, a baseline) and its tokenizer.
        tasks: task names / Hub names / `MultipleChoiceTask`s (see [`get_task`]); "smallbench" = the seed's four
            kinds (sentiment → SST-2, nli → MNLI, qa → ARC-Easy, paraphrase → MRPC).
        data: `{task name: local file(s) or datasets.Dataset}`; tasks not listed load their Hub dataset.
        split: Hub split for every task (default: each task's own, e.g. "validation").
        limit: score only the first `limit` rows of each task (recorded in the result).
        batch_size, max_length, prepend_bos, share_context_memory, model_kwargs, progress: see [`lm_for`].
        metric_prefix: first part of the metric names.
        return_predictions: also return per-example log-likelihoods, token counts and hits.

    Returns:
        `{"metrics": {"zero_shot/<task>/<acc|acc_norm|acc_per_token|acc_per_byte|chance>": {"value", "unit"},
        "zero_shot/average/<...>": ...}, "records": [...], "tasks": {<task>: {metrics, num_examples, dataset,
        template, ...}}, "settings": {...}}`. Accuracies are fractions in [0, 1]; `chance` is the mean of
        1 / number of choices. Each of `records` holds the arguments of `ResultLogger.log_metric` but the model name:
        `logger.log_metric(model="HMT", **record)`.
    """
    specs = expand_tasks(tasks)
    data = dict(data or {})
    unknown = sorted(set(data) - {spec.name for spec in specs})
    if unknown:
        raise ValueError(f"data names tasks that are not being run: {unknown} (tasks: {[s.name for s in specs]}).")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} must be None or an int >= 1.")
    details, docs = {}, {}
    for spec in specs:
        task_split = split or spec.split
        source = data.get(spec.name)
        rows = load_task_dataset(
            source,
            hub_path=spec.dataset_path,
            hub_name=spec.dataset_name,
            split=task_split,
            what=f"Task {spec.name!r}",
        )
        available = len(rows)
        if limit is not None:
            rows = rows.select(range(min(limit, available))) if hasattr(rows, "select") else list(rows)[:limit]
        examples = [spec.build(row, index) for index, row in enumerate(rows)]
        if not examples:
            raise ValueError(f"Task {spec.name!r}: the dataset has no rows.")
        docs[spec.name] = [vars(example) for example in examples]
        details[spec.name] = {
            "chance": sum(1 / len(example.choices) for example in examples) / len(examples),
            "num_examples": len(examples),
            "num_requests": sum(len(example.choices) for example in examples),
            "dataset": spec.hub_id + f":{task_split}" if source is None else _describe_source(source),
            "rows_available": available,
            "limit": limit,
            "context_template": spec.context_template,
            "target_delimiter": spec.target_delimiter,
        }

    from ..lm_eval_backend import lm_for
    from .harness import ChoiceTask, evaluate_tasks, lm_settings, training_mode_kept, truncated_requests

    with training_mode_kept(model):
        lm = lm_for(
            model,
            tokenizer,
            batch_size=batch_size,
            max_length=max_length,
            prepend_bos=prepend_bos,
            share_context_memory=share_context_memory,
            model_kwargs=model_kwargs,
            progress=progress,
        )
        harness_tasks = [ChoiceTask(spec.name, docs[spec.name], lm, spec.target_delimiter) for spec in specs]
        outcomes = evaluate_tasks(lm, harness_tasks)
    settings = lm_settings(lm)
    results = {"metrics": {}, "records": [], "tasks": {}, "settings": settings}
    for spec, task in zip(specs, harness_tasks):
        metrics, samples = outcomes[spec.name]
        outcome = {metric: metrics[name] for metric, name in LM_EVAL_METRICS.items()}
        outcome.update(details[spec.name])
        outcome["truncated_requests"] = truncated_requests(
            lm,
            [(doc["context"], spec.target_delimiter + choice) for doc in docs[spec.name] for choice in doc["choices"]],
        )
        if return_predictions:
            outcome["predictions"] = [_prediction(task, sample) for sample in samples]
        results["tasks"][spec.name] = outcome
        for metric in (*NORMALISATIONS, "chance"):
            add_metric(
                results,
                f"{metric_prefix}/{spec.name}",
                metric,
                outcome[metric],
                "fraction",
                retrieval_mode=settings.get("retrieval_mode"),
                num_samples=outcome["num_examples"],
                note=f"zero-shot multiple choice on {outcome['dataset']}",
            )
    if len(specs) > 1:
        for metric in (*NORMALISATIONS, "chance"):
            value = sum(results["tasks"][spec.name][metric] for spec in specs) / len(specs)
            add_metric(
                results,
                f"{metric_prefix}/average",
                metric,
                value,
                "fraction",
                retrieval_mode=settings.get("retrieval_mode"),
                num_samples=sum(results["tasks"][spec.name]["num_examples"] for spec in specs),
                note="unweighted mean over tasks: " + ", ".join(spec.name for spec in specs),
            )
    return results


def _prediction(task, sample: dict) -> dict:
    """One question's lm-eval sample as a record: per-choice log-likelihoods, token counts, greediness, and whether
    each normalisation got it right (1.0 / 0.0)."""
    doc = sample["doc"]
    return {
        "index": doc["index"],
        "label": doc["label"],
        **{metric: sample[name] for metric, name in LM_EVAL_METRICS.items()},
        "logprobs": [logprob for logprob, _ in sample["filtered_resps"]],
        "num_tokens": task.choice_tokens(doc),
        "is_greedy": [bool(greedy) for _, greedy in sample["filtered_resps"]],
    }


def add_metric(results: dict, experiment: str, metric: str, value: float, unit: str, **fields):
    """Record a number twice: `results["metrics"]["<experiment>/<metric>"] = {"value", "unit"}`, and as a record
    whose keys are `ResultLogger.log_metric` arguments (`logger.log_metric(model=..., **record)`)."""
    results["metrics"][f"{experiment}/{metric}"] = {"value": value, "unit": unit}
    results["records"].append({"experiment": experiment, "metric": metric, "value": value, "unit": unit, **fields})


def _describe_source(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, Sequence):
        return ",".join(os.fspath(item) for item in source)
    return f"{type(source).__name__}({len(source)} rows)"
