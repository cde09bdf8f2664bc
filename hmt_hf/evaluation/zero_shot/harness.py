"""The package's zero-shot questions as lm-evaluation-harness tasks, run by `lm_eval.evaluator.evaluate`.

The package builds the docs (task specs, PubMedQA fusion) and hands them to lm-eval in memory; lm-eval builds the
requests, runs them through the model's `LM` ([`lm_for`]) and computes the metrics. Two task kinds:

- [`ChoiceTask`] (`multiple_choice`, docs `{"context", "choices", "label"}`): lm-eval's `acc` (sum of
  log-likelihoods), `acc_norm` (per character of the choice) and `acc_bytes` (per UTF-8 byte), plus `acc_per_token`,
  which lm-eval lacks (per token of the choice, as the LM tokenised it).
- [`ContinuationTask`] (`loglikelihood`, docs `{"context", "continuation"}`): the continuation's per-token perplexity
  pooled over the docs (`token_perplexity = exp(sum NLL / sum tokens)`, lm-eval's `weighted_perplexity`
  aggregation), its `bits_per_byte` (lm-eval's aggregation) and the number of tokens scored (`tokens`).

Token counts come from the LM's own tokenisation of each request ([`encode_request`]).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import datasets
import numpy as np
from lm_eval.api.metrics import mean
from lm_eval.api.task import ConfigurableTask
from lm_eval.evaluator import evaluate

from ..lm_eval_backend import encode_request

LM_EVAL_CHOICE = ("acc", "acc_norm", "acc_bytes")  # lm-eval's multiple-choice accuracies that ChoiceTask reports


class InMemoryTask(ConfigurableTask):
    """A `ConfigurableTask` over given docs (a list of dicts, evaluated as the "test" split), zero-shot."""

    def __init__(self, name: str, docs: Sequence[dict], lm, **config):
        self._docs, self.lm = datasets.Dataset.from_list(list(docs)), lm
        super().__init__(config={"task": name, "test_split": "test", "num_fewshot": 0, **config})

    def download(self, dataset_kwargs=None, **kwargs) -> None:
        self.dataset = datasets.DatasetDict({"test": self._docs})

    def continuation_tokens(self, doc: dict, continuation: str) -> int:
        """Tokens of `continuation` after this doc's context, as the LM scores them."""
        return len(encode_request(self.lm, self.doc_to_text(doc), continuation)[1])


class ChoiceTask(InMemoryTask):
    """Multiple choice over docs `{"context", "choices", "label"}`: each candidate is `target_delimiter + choice`.
    Metrics: lm-eval's `acc`, `acc_norm`, `acc_bytes`, and `acc_per_token` (argmax of log-likelihood / tokens,
    first on ties)."""

    def __init__(self, name: str, docs: Sequence[dict], lm, target_delimiter: str = " "):
        metrics = [{"metric": metric, "aggregation": "mean", "higher_is_better": True} for metric in LM_EVAL_CHOICE]
        super().__init__(
            name,
            docs,
            lm,
            output_type="multiple_choice",
            doc_to_text="context",
            doc_to_choice="choices",
            doc_to_target="label",
            target_delimiter=target_delimiter,
            metric_list=metrics,
        )

    def choice_tokens(self, doc: dict) -> list[int]:
        return [self.continuation_tokens(doc, self.config.target_delimiter + choice) for choice in doc["choices"]]

    def process_results(self, doc: dict, results) -> dict:
        metrics = super().process_results(doc, results)
        per_token = np.array([logprob for logprob, _ in results]) / np.array(self.choice_tokens(doc))
        metrics["acc_per_token"] = float(np.argmax(per_token) == doc["label"])
        return metrics

    def aggregation(self) -> dict:
        return {**super().aggregation(), "acc_per_token": mean}

    def higher_is_better(self) -> dict:
        return {**super().higher_is_better(), "acc_per_token": True}


class ContinuationTask(InMemoryTask):
    """The log-likelihood of `doc["continuation"]` (delimiter included) after `doc["context"]`. Metrics:
    `token_perplexity` and `bits_per_byte` pooled over the docs, `tokens` (their sum)."""

    def __init__(self, name: str, docs: Sequence[dict], lm):
        metrics = [
            {"metric": "token_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
            {"metric": "bits_per_byte", "aggregation": "bits_per_byte", "higher_is_better": False},
            {"metric": "tokens", "aggregation": sum, "higher_is_better": None},
        ]
        super().__init__(
            name,
            docs,
            lm,
            output_type="loglikelihood",
            doc_to_text="context",
            doc_to_target="continuation",
            metric_list=metrics,
            process_results=self.continuation_metrics,
        )

    def continuation_metrics(self, doc: dict, results) -> dict:
        ((logprob, _),) = results
        tokens = self.continuation_tokens(doc, doc["continuation"])
        return {
            "token_perplexity": (logprob, tokens),
            "bits_per_byte": (logprob, len(doc["continuation"].encode("utf-8"))),
            "tokens": tokens,
        }


def truncated_requests(lm, requests: Sequence[tuple[str, str]]) -> int:
    """How many `(context, continuation)` requests lose context tokens to `lm`'s length limit (`HFLM` feeds
    `(context + continuation)[:-1]`, at most `max_length` tokens; `ContinuationScorer` the whole text, at most its
    `max_length`; HMT has no limit)."""
    scorer = getattr(lm, "scorer", None)
    limit = scorer.max_length if scorer is not None else lm.max_length + 1
    if limit is None:
        return 0
    return sum(len(c) + len(x) > limit for c, x in (encode_request(lm, *request) for request in requests))


@contextlib.contextmanager
def training_mode_kept(model):
    """`HFLM` (and so `HMTLM`) puts the model in eval mode for good; put a training model back afterwards."""
    training = bool(getattr(model, "training", False))
    try:
        yield
    finally:
        if training:
            model.train()


def evaluate_tasks(lm, tasks: Sequence[InMemoryTask]) -> dict[str, tuple[dict, list[dict]]]:
    """Run `tasks` together (lm-eval batches the requests of all of them by request type) and return, per task
    name, its metrics (`{"acc": ..., ...}`, lm-eval's "none" filter) and its samples in doc order."""
    out = evaluate(lm, {task.config.task: task for task in tasks}, bootstrap_iters=0, log_samples=True)
    results = {}
    for task in tasks:
        name = task.config.task
        metrics = {
            key.removesuffix(",none"): value
            for key, value in out["results"][name].items()
            if key.endswith(",none") and "_stderr" not in key
        }
        results[name] = metrics, sorted(out["samples"][name], key=lambda sample: sample["doc_id"])
    return results


def lm_settings(lm) -> dict:
    """What scored: the model, the lm-eval backend and its settings (HMT: retrieval mode, segment length, memory)."""
    import sys

    import lm_eval

    from .scorer import underlying_model

    scorer = getattr(lm, "scorer", None)  # HMTLM, ScorerLM: a ContinuationScorer
    token_scorer = scorer is not None and scorer.token_scorer
    model = scorer.model if token_scorer else underlying_model(scorer.model if scorer is not None else lm.model)
    max_length = getattr(lm, "max_length", None)
    settings = {
        "model": getattr(model, "name", None) if token_scorer else type(model).__name__,
        "lm_eval_model": type(lm).__name__,
        "lm_eval_version": lm_eval.__version__,
        "batch_size": lm.batch_size,
        "max_length": None if max_length in (None, sys.maxsize) else max_length,
        "prepend_bos": lm.add_bos_token,
        "model_kwargs": {key: repr(value) for key, value in (scorer.model_kwargs if scorer else {}).items()},
        "scoring": "lm-evaluation-harness: sum log p(continuation | context); continuation tokens = "
        "encode(context+continuation)[len(encode(context)):]"
        + ("" if scorer is None else "; one forward pass over context+continuation (ContinuationScorer)"),
    }
    if token_scorer and hasattr(model, "describe"):
        settings["scorer"] = model.describe()
    if scorer is not None and scorer.segment_length is not None:
        config = getattr(model, "config", None)
        settings.update(
            retrieval_mode=getattr(config, "retrieval_mode", None),
            segment_length=scorer.segment_length,
            use_memory=scorer.model_kwargs.get("use_memory", True),
            use_memory_search=getattr(config, "use_memory_search", None),
            use_sensory_memory=getattr(config, "use_sensory_memory", None),
            share_context_memory=scorer.share_context_memory,
        )
    return settings
