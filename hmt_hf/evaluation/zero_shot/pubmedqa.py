"""PubMedQA with fused contexts (Figs. 5-6): prompts of 2-10 abstracts, yes/no/maybe accuracy and long-answer
perplexity."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .multiple_choice import LM_EVAL_METRICS, add_metric
from .tasks import DataSource, load_task_dataset

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------- PubMedQA
PUBMEDQA_DECISIONS = ("yes", "no", "maybe")
PUBMEDQA_TEMPLATE = "{contexts}\n\nQuestion: {question}\nAnswer:"


@dataclass(frozen=True)
class PubMedQAExample:
    """One PubMedQA question: its abstract (`contexts`, the paragraphs), the long answer (the abstract's conclusion)
    and the short answer (yes / no / maybe)."""

    question: str
    contexts: tuple[str, ...]
    long_answer: str
    final_decision: str

    @classmethod
    def from_row(cls, row: Mapping, index: int = 0) -> PubMedQAExample:
        """From the Hub schema (`qiaojin/PubMedQA`: question, context {contexts, labels, meshes}, long_answer,
        final_decision) or the simple local schema (question, contexts [list of str], long_answer, final_decision)."""
        where = f"PubMedQA row {index}"
        missing = [name for name in ("question", "long_answer", "final_decision") if name not in row]
        if "contexts" in row:
            contexts = row["contexts"]
        elif isinstance(row.get("context"), Mapping) and "contexts" in row["context"]:
            contexts = row["context"]["contexts"]
        else:
            missing.append("context.contexts (Hub) or contexts (local)")
        if missing:
            raise ValueError(
                f"{where}: missing {', '.join(missing)} (columns: {', '.join(map(str, row))}). Expected the Hub schema "
                "(question, context {contexts, labels, meshes}, long_answer, final_decision) or a local one "
                "(question, contexts: [str], long_answer, final_decision)."
            )
        if isinstance(contexts, str):
            contexts = [contexts]
        contexts = tuple(text.strip() for text in contexts if isinstance(text, str) and text.strip())
        if not contexts:
            raise ValueError(f"{where}: the row has no context paragraphs.")
        decision = str(row["final_decision"]).strip().lower()
        if decision not in PUBMEDQA_DECISIONS:
            raise ValueError(f"{where}: final_decision {row['final_decision']!r} is not one of {PUBMEDQA_DECISIONS}.")
        for name in ("question", "long_answer"):
            if not isinstance(row[name], str) or not row[name].strip():
                raise ValueError(f"{where}: {name} is empty.")
        return cls(row["question"].strip(), contexts, row["long_answer"].strip(), decision)

    @property
    def abstract(self) -> str:
        return " ".join(self.contexts)


@dataclass(frozen=True)
class FusedQuestion:
    """A question of row `row` asked after the abstracts of `context_rows` (its own among them).
    `filler_rows` are rows of `context_rows` that come from outside the row's group (the last group was short)."""

    row: int
    context_rows: tuple[int, ...]
    filler_rows: tuple[int, ...] = ()


def fuse_contexts(num_rows: int, num_contexts: int, seed: int | None = None) -> list[FusedQuestion]:
    """Which abstracts go in front of each question, as in the paper's PubMedQA setup (the reference code's
    `fuse_size`): the rows are cut into consecutive groups of `num_contexts`, and every question of a group is asked
    after all the group's abstracts, in row order — so the abstract that answers a question sits anywhere among
    them. With a `seed` the rows are shuffled (deterministically) before grouping. A short last group is filled
    with the first rows of the (shuffled) order that are not in it; those fillers are reported, and every row's
    question is asked exactly once.
    """
    if not isinstance(num_contexts, int) or num_contexts < 1:
        raise ValueError(f"num_contexts={num_contexts!r} must be an int >= 1 (the paper uses 2-10).")
    if num_rows < num_contexts:
        raise ValueError(
            f"num_contexts={num_contexts} needs at least {num_contexts} rows to fuse distinct abstracts; the data has "
            f"{num_rows}. Use fewer contexts or more rows (limit=None)."
        )
    order = list(range(num_rows))
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(num_rows, generator=generator).tolist()
    fused = []
    for start in range(0, num_rows, num_contexts):
        group = order[start : start + num_contexts]
        fillers = [row for row in order if row not in group][: num_contexts - len(group)]
        context_rows = tuple(group + fillers)
        fused += [FusedQuestion(row, context_rows, tuple(fillers)) for row in group]
    return sorted(fused, key=lambda question: question.row)


def pubmedqa_prompt(
    examples: Sequence[PubMedQAExample],
    question: FusedQuestion,
    template: str = PUBMEDQA_TEMPLATE,
    context_separator: str = "\n\n",
) -> str:
    """The prompt of a fused question: the abstracts of `question.context_rows` joined by `context_separator`,
    then the question (`template` fields: `{contexts}`, `{question}`)."""
    contexts = context_separator.join(examples[row].abstract for row in question.context_rows)
    return template.format(contexts=contexts, question=examples[question.row].question)


def load_pubmedqa(
    data: DataSource | None = None, *, split: str = "train", config: str = "pqa_labeled"
) -> list[PubMedQAExample]:
    """PubMedQA rows from local files / a `datasets.Dataset` (Hub or simple schema), or from the Hub
    (`qiaojin/PubMedQA`, `config`, `split`; pqa_labeled has a single "train" split of 1,000 expert-labelled rows)."""
    rows = load_task_dataset(data, hub_path="qiaojin/PubMedQA", hub_name=config, split=split, what="PubMedQA")
    return [PubMedQAExample.from_row(row, index) for index, row in enumerate(rows)]


def run_pubmedqa(
    model,
    tokenizer,
    data: DataSource | Sequence[PubMedQAExample] | None = None,
    *,
    num_contexts: int | Sequence[int] = (2,),
    seed: int | None = None,
    split: str = "train",
    config: str = "pqa_labeled",
    limit: int | None = None,
    template: str = PUBMEDQA_TEMPLATE,
    context_separator: str = "\n\n",
    batch_size: int = 8,
    max_length: int | str | None = "model",
    prepend_bos: bool | None = None,
    share_context_memory: bool = True,
    model_kwargs: Mapping | None = None,
    metric_prefix: str = "pubmedqa",
    return_predictions: bool = False,
    progress: bool = True,
) -> dict:
    """PubMedQA with fused contexts (paper Figs. 5-6): long-answer perplexity and short-answer accuracy, evaluated by
    lm-evaluation-harness.

    Every question is asked after `num_contexts` abstracts (its own and those of other rows, see
    [`fuse_contexts`]) in one long prompt. For each count, two in-memory lm-eval tasks share these prompts (lm-eval
    runs their requests together, so HMT builds each prompt's memory once for all five continuations): the long
    answer is a `loglikelihood` task over the continuation `" " + long_answer` ([`harness.ContinuationTask`]:
    perplexity over its tokens pooled over all questions, `exp(sum NLL / sum tokens)`, and bits per byte); the short
    answer a `multiple_choice` task over `" yes"`, `" no"`, `" maybe"` ([`harness.ChoiceTask`]).

    Args:
        data: local file(s), a `datasets.Dataset`, or a list of `PubMedQAExample`; None loads `qiaojin/PubMedQA`.
        num_contexts: abstracts per prompt; a list (e.g. `range(2, 11)`) evaluates each count.
        seed: shuffle rows before grouping them (None: consecutive rows, as the reference code).
        limit: use only the first `limit` rows (as questions and as the pool of abstracts).
        template, context_separator: prompt layout (`{contexts}`, `{question}`).
        Other arguments: see [`run_zero_shot`] and [`lm_for`].

    Returns:
        `{"metrics": {"pubmedqa/contexts_<n>/<long_answer_ppl|long_answer_bits_per_byte|short_answer_acc|
        short_answer_acc_norm|prompt_tokens_mean>": {"value", "unit"}}, "records": [...] (as in [`run_zero_shot`]),
        "contexts": {<n>: details}, "settings"}`.
    """
    if data is not None and isinstance(data, Sequence) and data and isinstance(data[0], PubMedQAExample):
        examples = list(data)
    else:
        examples = load_pubmedqa(data, split=split, config=config)
    available = len(examples)
    if limit is not None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit={limit!r} must be None or an int >= 1.")
        examples = examples[:limit]
    counts = [num_contexts] if isinstance(num_contexts, int) else list(num_contexts)
    if not counts:
        raise ValueError("num_contexts is empty; give a count such as 2 or a list such as range(2, 11).")
    fused = {count: fuse_contexts(len(examples), count, seed) for count in counts}

    from ..lm_eval_backend import encode_request, lm_for
    from .harness import (
        ChoiceTask,
        ContinuationTask,
        evaluate_tasks,
        lm_settings,
        training_mode_kept,
        truncated_requests,
    )

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
        prompts, harness_tasks = {}, []
        for count, questions in fused.items():
            prompts[count] = [pubmedqa_prompt(examples, q, template, context_separator) for q in questions]
            long_docs = [
                {"context": prompt, "continuation": " " + examples[question.row].long_answer}
                for prompt, question in zip(prompts[count], questions)
            ]
            short_docs = [
                {
                    "context": prompt,
                    "choices": list(PUBMEDQA_DECISIONS),
                    "label": PUBMEDQA_DECISIONS.index(examples[question.row].final_decision),
                }
                for prompt, question in zip(prompts[count], questions)
            ]
            harness_tasks += [
                ContinuationTask(f"{metric_prefix}_contexts_{count}_long_answer", long_docs, lm),
                ChoiceTask(f"{metric_prefix}_contexts_{count}_short_answer", short_docs, lm),
            ]
        outcomes = evaluate_tasks(lm, harness_tasks)
    settings = lm_settings(lm)
    settings.update(
        rows_available=available, rows_used=len(examples), seed=seed, template=template, fusion="groups (fuse_size)"
    )
    results = {"metrics": {}, "records": [], "contexts": {}, "settings": settings}
    units = {
        "long_answer_ppl": "perplexity",
        "long_answer_bits_per_byte": "bits/byte",
        "short_answer_acc": "fraction",
        "short_answer_acc_norm": "fraction",
        "prompt_tokens_mean": "tokens",
    }
    for count, questions in fused.items():
        long_answer = outcomes[f"{metric_prefix}_contexts_{count}_long_answer"]
        short_answer = outcomes[f"{metric_prefix}_contexts_{count}_short_answer"]
        prompt_tokens = [len(encode_request(lm, prompt, " yes")[0]) for prompt in prompts[count]]
        results["contexts"][count] = outcome = _pubmedqa_outcome(
            examples, questions, long_answer, short_answer, prompt_tokens, return_predictions
        )
        outcome["truncated_requests"] = truncated_requests(
            lm,
            [
                (prompt, " " + answer)
                for prompt, question in zip(prompts[count], questions)
                for answer in (examples[question.row].long_answer, *PUBMEDQA_DECISIONS)
            ],
        )
        for metric, unit in units.items():
            add_metric(
                results,
                f"{metric_prefix}/contexts_{count}",
                metric,
                outcome[metric],
                unit,
                paper_item="Figs. 5-6",
                retrieval_mode=settings.get("retrieval_mode"),
                num_samples=outcome["num_questions"],
                num_tokens=outcome["long_answer_tokens"] if metric.startswith("long_answer") else None,
                note=f"{count} fused abstracts per prompt; "
                + ("consecutive row groups" if seed is None else f"rows shuffled with seed {seed}"),
            )
    return results


def _pubmedqa_outcome(examples, questions, long_answer, short_answer, prompt_tokens, return_predictions) -> dict:
    """One count's numbers from its two lm-eval tasks' `(metrics, samples)`."""
    (long_metrics, long_samples), (short_metrics, short_samples) = long_answer, short_answer
    total = len(questions)
    outcome = {
        "long_answer_ppl": long_metrics["token_perplexity"],
        "long_answer_nll_per_token": math.log(long_metrics["token_perplexity"]),
        "long_answer_bits_per_byte": long_metrics["bits_per_byte"],
        "long_answer_tokens": int(long_metrics["tokens"]),
        **{f"short_answer_{metric}": short_metrics[name] for metric, name in LM_EVAL_METRICS.items()},
        "num_questions": total,
        "questions_with_filler_contexts": sum(bool(question.filler_rows) for question in questions),
        "prompt_tokens_mean": sum(prompt_tokens) / total,
        "prompt_tokens_max": max(prompt_tokens),
        "label_counts": {d: sum(examples[q.row].final_decision == d for q in questions) for d in PUBMEDQA_DECISIONS},
    }
    if return_predictions:
        outcome["predictions"] = [
            {
                "row": question.row,
                "context_rows": list(question.context_rows),
                "filler_rows": list(question.filler_rows),
                "long_answer_logprob": long_sample["filtered_resps"][0][0],
                "long_answer_tokens": long_sample["tokens"],
                "label": short_sample["doc"]["label"],
                **{metric: short_sample[name] for metric, name in LM_EVAL_METRICS.items()},
                "choice_logprobs": [logprob for logprob, _ in short_sample["filtered_resps"]],
            }
            for question, long_sample, short_sample in zip(questions, long_samples, short_samples)
        ]
    return outcome
