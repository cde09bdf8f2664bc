"""Zero-shot multiple choice: predictions under each normalisation, accuracies, and `run_zero_shot`."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from .scorer import ContinuationScore, ContinuationScorer, underlying_model
from .tasks import DataSource, MultipleChoiceExample, MultipleChoiceTask, expand_tasks, load_task_dataset

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------- multiple choice
NORMALISATIONS = {
    "acc": "sum of log-likelihoods",
    "acc_norm": "log-likelihood per character of the choice (lm-eval acc_norm)",
    "acc_per_token": "log-likelihood per token",
    "acc_per_byte": "log-likelihood per UTF-8 byte of the choice",
}


def choose(example: MultipleChoiceExample, scores: Sequence[ContinuationScore]) -> dict[str, int]:
    """The predicted choice index under every normalisation (argmax, first on ties)."""
    divisors = {
        "acc": [1.0] * len(scores),
        "acc_norm": [len(choice) for choice in example.choices],
        "acc_per_token": [score.num_tokens for score in scores],
        "acc_per_byte": [len(choice.encode("utf-8")) for choice in example.choices],
    }
    predictions = {}
    for metric, divisor in divisors.items():
        values = [score.logprob / d for score, d in zip(scores, divisor)]
        predictions[metric] = max(range(len(values)), key=lambda i: (values[i], -i))
    return predictions


def evaluate_multiple_choice(
    scorer: ContinuationScorer, task: MultipleChoiceTask, rows, *, return_predictions: bool = False
) -> dict:
    """Accuracy of `scorer`'s model on `task` over `rows` (an iterable of dataset rows)."""
    examples = [task.build(row, index) for index, row in enumerate(rows)]
    if not examples:
        raise ValueError(f"Task {task.name!r}: the dataset has no rows.")
    requests = [
        (example.context, task.target_delimiter + choice) for example in examples for choice in example.choices
    ]
    scores = scorer.score(requests, desc=task.name)
    correct = {metric: 0 for metric in NORMALISATIONS}
    predictions, position = [], 0
    for example in examples:
        example_scores = scores[position : position + len(example.choices)]
        position += len(example.choices)
        chosen = choose(example, example_scores)
        for metric, index in chosen.items():
            correct[metric] += index == example.label
        if return_predictions:
            predictions.append(
                {
                    "index": example.index,
                    "label": example.label,
                    **{f"prediction_{metric}": index for metric, index in chosen.items()},
                    "logprobs": [score.logprob for score in example_scores],
                    "num_tokens": [score.num_tokens for score in example_scores],
                    "is_greedy": [score.is_greedy for score in example_scores],
                }
            )
    total = len(examples)
    result = {metric: correct[metric] / total for metric in NORMALISATIONS}
    result.update(
        chance=sum(1 / len(example.choices) for example in examples) / total,
        num_examples=total,
        num_requests=len(requests),
        truncated_requests=sum(score.truncated_tokens > 0 for score in scores),
    )
    if return_predictions:
        result["predictions"] = predictions
    return result


def scorer_settings(scorer: ContinuationScorer) -> dict:
    model = scorer.model if scorer.token_scorer else underlying_model(scorer.model)
    config = getattr(model, "config", None)
    settings = {
        "model": getattr(model, "name", None) if scorer.token_scorer else type(model).__name__,
        "batch_size": scorer.batch_size,
        "max_length": scorer.max_length,
        "prepend_bos": scorer.prepend_bos,
        "model_kwargs": {k: repr(v) for k, v in scorer.model_kwargs.items()},
        "scoring": "sum log p(continuation | context) over one forward pass of context+continuation; continuation "
        "tokens = encode(context+continuation)[len(encode(context)):] (lm-eval)",
    }
    if scorer.token_scorer and hasattr(model, "describe"):
        settings["scorer"] = model.describe()
    if scorer.segment_length is not None:
        settings.update(
            retrieval_mode=getattr(config, "retrieval_mode", None),
            segment_length=scorer.segment_length,
            use_memory=scorer.model_kwargs.get("use_memory", True),
            use_memory_search=getattr(config, "use_memory_search", None),
            use_sensory_memory=getattr(config, "use_sensory_memory", None),
            share_context_memory=scorer.share_context_memory,
        )
    return settings


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
    """Zero-shot multiple-choice accuracy by log-likelihood on each task.

    Args:
        model, tokenizer: any causal LM (HMT, its backbone, a baseline) and its tokenizer.
        tasks: task names / Hub names / `MultipleChoiceTask`s (see [`get_task`]); "smallbench" = the seed's four
            kinds (sentiment → SST-2, nli → MNLI, qa → ARC-Easy, paraphrase → MRPC).
        data: `{task name: local file(s) or datasets.Dataset}`; tasks not listed load their Hub dataset.
        split: Hub split for every task (default: each task's own, e.g. "validation").
        limit: score only the first `limit` rows of each task (recorded in the result).
        batch_size, max_length, prepend_bos, share_context_memory, model_kwargs, progress: see
            [`ContinuationScorer`].
        metric_prefix: first part of the metric names.
        return_predictions: also return per-example log-likelihoods and predictions.

    Returns:
        `{"metrics": {"zero_shot/<task>/<acc|acc_norm|acc_per_token|acc_per_byte|chance>": {"value", "unit"},
        "zero_shot/average/<...>": ...}, "records": [...], "tasks": {<task>: {metrics, num_examples, dataset,
        template, ...}}, "settings": {...}}`. Accuracies are fractions in [0, 1]. Each of `records` holds the
        arguments of `ResultLogger.log_metric` but the model name: `logger.log_metric(model="HMT", **record)`.
    """
    specs = expand_tasks(tasks)
    data = dict(data or {})
    unknown = sorted(set(data) - {spec.name for spec in specs})
    if unknown:
        raise ValueError(f"data names tasks that are not being run: {unknown} (tasks: {[s.name for s in specs]}).")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} must be None or an int >= 1.")
    scorer = ContinuationScorer(
        model,
        tokenizer,
        batch_size=batch_size,
        max_length=max_length,
        prepend_bos=prepend_bos,
        share_context_memory=share_context_memory,
        model_kwargs=model_kwargs,
        progress=progress,
    )
    settings = scorer_settings(scorer)
    results = {"metrics": {}, "records": [], "tasks": {}, "settings": settings}
    for spec in specs:
        task_split = split or spec.split
        rows = load_task_dataset(
            data.get(spec.name),
            hub_path=spec.dataset_path,
            hub_name=spec.dataset_name,
            split=task_split,
            what=f"Task {spec.name!r}",
        )
        available = len(rows)
        if limit is not None:
            rows = rows.select(range(min(limit, available))) if hasattr(rows, "select") else list(rows)[:limit]
        outcome = evaluate_multiple_choice(scorer, spec, rows, return_predictions=return_predictions)
        source = data.get(spec.name)
        outcome.update(
            dataset=spec.hub_id + f":{task_split}" if source is None else _describe_source(source),
            rows_available=available,
            limit=limit,
            context_template=spec.context_template,
            target_delimiter=spec.target_delimiter,
        )
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
