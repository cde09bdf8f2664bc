"""PubMedQA with fused contexts (Figs. 5-6): prompts of 2-10 abstracts, yes/no/maybe accuracy and long-answer
perplexity."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .multiple_choice import NORMALISATIONS, add_metric, choose, scorer_settings
from .scorer import ContinuationScorer
from .tasks import DataSource, MultipleChoiceExample, load_task_dataset

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
    """PubMedQA with fused contexts (paper Figs. 5-6): long-answer perplexity and short-answer accuracy.

    Every question is asked after `num_contexts` abstracts (its own and those of other rows, see
    [`fuse_contexts`]) in one long prompt. The long answer is scored as the continuation `" " + long_answer`
    (perplexity over its tokens, pooled over all questions: `exp(sum NLL / sum tokens)`); the short answer is a
    multiple choice over `" yes"`, `" no"`, `" maybe"` after the same prompt.

    Args:
        data: local file(s), a `datasets.Dataset`, or a list of `PubMedQAExample`; None loads `qiaojin/PubMedQA`.
        num_contexts: abstracts per prompt; a list (e.g. `range(2, 11)`) evaluates each count.
        seed: shuffle rows before grouping them (None: consecutive rows, as the reference code).
        limit: use only the first `limit` rows (as questions and as the pool of abstracts).
        template, context_separator: prompt layout (`{contexts}`, `{question}`).
        Other arguments: see [`run_zero_shot`] and [`ContinuationScorer`].

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
    results = {"metrics": {}, "records": [], "contexts": {}, "settings": settings}
    settings.update(
        rows_available=available, rows_used=len(examples), seed=seed, template=template, fusion="groups (fuse_size)"
    )
    for count in counts:
        questions = fuse_contexts(len(examples), count, seed)
        prompts = [pubmedqa_prompt(examples, question, template, context_separator) for question in questions]
        requests = []
        for prompt, question in zip(prompts, questions):
            example = examples[question.row]
            requests.append((prompt, " " + example.long_answer))
            requests += [(prompt, " " + decision) for decision in PUBMEDQA_DECISIONS]
        scores = scorer.score(requests, desc=f"pubmedqa {count} contexts")
        results["contexts"][count] = outcome = _pubmedqa_outcome(
            examples, questions, prompts, scores, scorer, return_predictions
        )
        units = {
            "long_answer_ppl": "perplexity",
            "long_answer_bits_per_byte": "bits/byte",
            "short_answer_acc": "fraction",
            "short_answer_acc_norm": "fraction",
            "prompt_tokens_mean": "tokens",
        }
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


def _pubmedqa_outcome(examples, questions, prompts, scores, scorer, return_predictions) -> dict:
    stride = 1 + len(PUBMEDQA_DECISIONS)
    nll = tokens = answer_bytes = 0.0
    correct = {metric: 0 for metric in NORMALISATIONS}
    predictions = []
    for number, question in enumerate(questions):
        example = examples[question.row]
        long_score, *choice_scores = scores[number * stride : (number + 1) * stride]
        nll -= long_score.logprob
        tokens += long_score.num_tokens
        answer_bytes += len((" " + example.long_answer).encode("utf-8"))
        label = PUBMEDQA_DECISIONS.index(example.final_decision)
        chosen = choose(MultipleChoiceExample(prompts[number], list(PUBMEDQA_DECISIONS), label), choice_scores)
        for metric, index in chosen.items():
            correct[metric] += index == label
        if return_predictions:
            predictions.append(
                {
                    "row": question.row,
                    "context_rows": list(question.context_rows),
                    "filler_rows": list(question.filler_rows),
                    "long_answer_logprob": long_score.logprob,
                    "long_answer_tokens": long_score.num_tokens,
                    "label": label,
                    "prediction_acc": chosen["acc"],
                    "choice_logprobs": [score.logprob for score in choice_scores],
                }
            )
    prompt_tokens = [len(scorer.encode_pair(prompt, " yes")[0]) for prompt in prompts]
    total = len(questions)
    outcome = {
        "long_answer_ppl": math.exp(nll / tokens),
        "long_answer_nll_per_token": nll / tokens,
        "long_answer_bits_per_byte": nll / math.log(2) / answer_bytes,
        "long_answer_tokens": int(tokens),
        "short_answer_acc": correct["acc"] / total,
        "short_answer_acc_norm": correct["acc_norm"] / total,
        "short_answer_acc_per_token": correct["acc_per_token"] / total,
        "short_answer_acc_per_byte": correct["acc_per_byte"] / total,
        "num_questions": total,
        "questions_with_filler_contexts": sum(bool(question.filler_rows) for question in questions),
        "prompt_tokens_mean": sum(prompt_tokens) / total,
        "prompt_tokens_max": max(prompt_tokens),
        "label_counts": {d: sum(examples[q.row].final_decision == d for q in questions) for d in PUBMEDQA_DECISIONS},
        "truncated_requests": sum(score.truncated_tokens > 0 for score in scores),
    }
    if return_predictions:
        outcome["predictions"] = predictions
    return outcome
