"""Zero-shot evaluation by log-likelihood: multiple-choice tasks and PubMedQA-style multi-context QA.

Any causal LM with the Hugging Face interface can be scored: an [`HMTForCausalLM`] (inputs of any length; the
continuation is scored with the memory built from the context), its plain backbone, or a baseline module whose
`forward(input_ids, attention_mask)` returns `.logits`.

**Scoring.** A request is a `(context, continuation)` pair of strings. Tokenisation follows lm-evaluation-harness:
trailing whitespace of the context moves to the front of the continuation, then `context` and
`context + continuation` are encoded separately and the continuation's tokens are the difference
(`whole[len(context_ids):]`), so the continuation is tokenised as it would be in running text. Its score is
`sum_t log p(continuation_t | context, continuation_<t)`, read from one forward pass over the *whole*
`context + continuation` (lm-eval drops the last token; feeding it keeps the score identical to the model's ordinary
forward pass over the text, which matters for HMT's `retrieval_mode="paper"`, where a segment's memory query reads
that segment's first `j` tokens). With `retrieval_mode="causal"` and for every plain causal LM both conventions give
the same numbers.

**Multiple choice.** The predicted choice is the argmax (first on ties) of the summed log-likelihood (`acc`), of the
log-likelihood per character of the choice (`acc_norm`, lm-eval's convention), per token (`acc_per_token`) and per
UTF-8 byte (`acc_per_byte`).

**HMT.** Contexts longer than one segment are run once per context: its full segments (a multiple of
`segment_length` tokens, at least one context token left over) build the memory, which is then copied for every
candidate continuation. Calls whose lengths are multiples of `segment_length` reproduce one-call logits exactly, so
this changes cost, not scores (`share_context_memory=False` runs every candidate from scratch).

**Batching.** Requests are grouped by context, sorted by length and left-padded into batches of `batch_size` rows
(left padding keeps every row's last positions aligned, so the LM head runs only on the continuation positions).
Plain models get `position_ids` that restart at each row's first real token. A module that does not handle padding
can be scored with `batch_size=1` (no padding is ever added then).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

DataSource = Any  # a path, a list of paths, a `datasets.Dataset` or `datasets.DatasetDict`
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}


# ---------------------------------------------------------------------------------------------------- task specs
@dataclass(frozen=True)
class MultipleChoiceTask:
    """How to turn a dataset row into a multiple-choice question scored by log-likelihood.

    The context is `context_template` formatted with the row (`{column}`; dotted names reach into nested columns,
    e.g. `{choices.text}`). Each candidate continuation is `target_delimiter + choice`. The choices are either fixed
    verbalisers (`choices`, index = label) or read from the row (`choice_columns`: one column holding a list, e.g.
    `("choices.text",)`, or one column per choice, e.g. `("sol1", "sol2")`).

    The gold answer is `row[label_column]`, mapped to a choice index by `label_map` when given, else looked up in
    the row's `label_names_column` list when given (ARC: `answerKey` "C" in `choices.label` ["A", "B", "C", "D"]),
    else used as the index itself.

    Args:
        name: task name used in result keys.
        context_template: `str.format` template over the row's columns.
        choices: fixed verbalisers, e.g. `("negative", "positive")`.
        choice_columns: columns that hold the per-row choices (instead of `choices`).
        label_column: column of the gold answer.
        label_map: raw gold value → choice index (e.g. `{False: 0, True: 1}`).
        label_names_column: column holding per-row choice names to look the gold value up in.
        target_delimiter: text between the context and every choice (lm-eval's default: one space).
        dataset_path, dataset_name, split: where `datasets.load_dataset` finds the data on the Hub.
        description: one line for reports.
    """

    name: str
    context_template: str
    choices: tuple[str, ...] = ()
    choice_columns: tuple[str, ...] = ()
    label_column: str = "label"
    label_map: Mapping[Any, int] | None = None
    label_names_column: str | None = None
    target_delimiter: str = " "
    dataset_path: str | None = None
    dataset_name: str | None = None
    split: str = "validation"
    description: str = ""

    def __post_init__(self):
        for name in ("choices", "choice_columns"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"Task {self.name!r}: {name} must be a tuple of strings, not the string {value!r}.")
            object.__setattr__(self, name, tuple(value))
        if bool(self.choices) == bool(self.choice_columns):
            raise ValueError(
                f"Task {self.name!r} needs exactly one of `choices` (fixed verbalisers, e.g. ('no', 'yes')) or "
                f"`choice_columns` (columns holding each row's choices); got choices={self.choices!r}, "
                f"choice_columns={self.choice_columns!r}."
            )
        for index, choice in enumerate(self.choices):
            if not isinstance(choice, str) or not choice:
                raise ValueError(f"Task {self.name!r}: choice {index} is {choice!r}; every choice must be non-empty.")
        try:
            list(string.Formatter().parse(self.context_template))
        except ValueError as error:
            raise ValueError(f"Task {self.name!r}: context_template is not a valid format string: {error}") from None

    def build(self, row: Mapping, index: int = 0) -> MultipleChoiceExample:
        """The context, choices and gold index of one dataset row (clear errors for missing columns, empty
        choices and labels that are out of range)."""
        context = _RowFormatter(self.name, row, index).format(self.context_template)
        if self.choices:
            choices = list(self.choices)
        elif len(self.choice_columns) == 1:
            choices = _column(row, self.choice_columns[0], self.name, index)
            if isinstance(choices, str) or not isinstance(choices, Sequence):
                raise ValueError(
                    f"Task {self.name!r}, row {index}: column {self.choice_columns[0]!r} must hold a list of choices, "
                    f"got {type(choices).__name__}."
                )
            choices = list(choices)
        else:
            choices = [_column(row, column, self.name, index) for column in self.choice_columns]
        if not choices:
            raise ValueError(f"Task {self.name!r}, row {index}: the row has no choices (empty list).")
        for position, choice in enumerate(choices):
            if not isinstance(choice, str) or not choice:
                raise ValueError(
                    f"Task {self.name!r}, row {index}: choice {position} is {choice!r}; choices must be non-empty text."
                )
        return MultipleChoiceExample(context, choices, self._label(row, index, choices), index)

    def _label(self, row: Mapping, index: int, choices: list[str]) -> int:
        raw = _column(row, self.label_column, self.name, index)
        if self.label_map is not None:
            if raw not in self.label_map:
                raise ValueError(
                    f"Task {self.name!r}, row {index}: label {raw!r} is not in label_map {dict(self.label_map)!r}."
                )
            label = self.label_map[raw]
        elif self.label_names_column is not None:
            names = list(_column(row, self.label_names_column, self.name, index))
            if raw not in names:
                raise ValueError(
                    f"Task {self.name!r}, row {index}: label {raw!r} is not one of the row's "
                    f"{self.label_names_column!r} {names!r}."
                )
            label = names.index(raw)
        else:
            label = raw
        if isinstance(label, bool) or not isinstance(label, int):
            raise ValueError(
                f"Task {self.name!r}, row {index}: label {raw!r} is not a choice index; give the task a label_map "
                "(e.g. {'no': 0, 'yes': 1})."
            )
        if not 0 <= label < len(choices):
            hint = " (GLUE test splits are unlabelled: -1; use the validation split)" if label == -1 else ""
            raise ValueError(
                f"Task {self.name!r}, row {index}: label {label} is out of range for its {len(choices)} choices "
                f"{choices!r}{hint}."
            )
        return label

    @property
    def hub_id(self) -> str | None:
        if self.dataset_path is None:
            return None
        return self.dataset_path + (f"/{self.dataset_name}" if self.dataset_name else "")


@dataclass
class MultipleChoiceExample:
    """One built question: `context`, `choices` (without the delimiter) and the gold `label` index."""

    context: str
    choices: list[str]
    label: int
    index: int = 0


class _RowFormatter(string.Formatter):
    """`str.format` whose fields are (dotted) column names of a dataset row."""

    def __init__(self, task: str, row: Mapping, index: int):
        super().__init__()
        self.task, self.row, self.index = task, row, index

    def get_field(self, field_name, args, kwargs):
        return _column(self.row, field_name, self.task, self.index), field_name


def _column(row: Mapping, path: str, task: str, index: int):
    value = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            available = ", ".join(map(str, value)) if isinstance(value, Mapping) else type(value).__name__
            raise ValueError(
                f"Task {task!r}, row {index}: no column {path!r} (available: {available}). Rename the column "
                f"(dataset.rename_column(old, {part!r})) or build a MultipleChoiceTask with your own column names."
            )
        value = value[part]
    return value


def _glue(config: str, template: str, choices: tuple[str, ...], split: str = "validation", **fields):
    return {
        "context_template": template,
        "choices": choices,
        "dataset_path": "nyu-mll/glue",
        "dataset_name": config,
        "split": split,
        **fields,
    }


# The seed's "SmallBench" kinds (sentiment, NLI, QA, paraphrase) and their usual Hub datasets. Templates follow the
# seed's prompts ("Sentence: ...\nSentiment:"); verbalisers are listed in label order.
ZERO_SHOT_TASKS: dict[str, MultipleChoiceTask] = {
    task.name: task
    for task in (
        MultipleChoiceTask(
            "sst2",
            **_glue("sst2", "Sentence: {sentence}\nSentiment:", ("negative", "positive")),
            description="SST-2 sentiment (GLUE): sentence, label 0 negative / 1 positive",
        ),
        MultipleChoiceTask(
            "mnli",
            **_glue(
                "mnli",
                "Premise: {premise}\nHypothesis: {hypothesis}\nRelation:",
                ("entailment", "neutral", "contradiction"),
                split="validation_matched",
            ),
            description="MultiNLI (GLUE): premise, hypothesis, label 0 entailment / 1 neutral / 2 contradiction",
        ),
        MultipleChoiceTask(
            "rte",
            **_glue(
                "rte", "Premise: {sentence1}\nHypothesis: {sentence2}\nRelation:", ("entailment", "not entailment")
            ),
            description="RTE (GLUE): sentence1, sentence2, label 0 entailment / 1 not entailment",
        ),
        MultipleChoiceTask(
            "mrpc",
            **_glue("mrpc", "Sentence 1: {sentence1}\nSentence 2: {sentence2}\nParaphrase:", ("no", "yes")),
            description="MRPC paraphrase (GLUE): sentence1, sentence2, label 0 not equivalent / 1 equivalent",
        ),
        MultipleChoiceTask(
            "qqp",
            **_glue("qqp", "Question 1: {question1}\nQuestion 2: {question2}\nParaphrase:", ("no", "yes")),
            description="QQP paraphrase (GLUE): question1, question2, label 0 not duplicate / 1 duplicate",
        ),
        MultipleChoiceTask(
            "boolq",
            context_template="Passage: {passage}\nQuestion: {question}?\nAnswer:",
            choices=("no", "yes"),
            label_column="answer",
            label_map={False: 0, True: 1},
            dataset_path="google/boolq",
            description="BoolQ: passage, question, answer (bool)",
        ),
        MultipleChoiceTask(
            "arc_easy",
            context_template="Question: {question}\nAnswer:",
            choice_columns=("choices.text",),
            label_column="answerKey",
            label_names_column="choices.label",
            dataset_path="allenai/ai2_arc",
            dataset_name="ARC-Easy",
            split="test",
            description="ARC-Easy: question, choices {text, label}, answerKey",
        ),
        MultipleChoiceTask(
            "arc_challenge",
            context_template="Question: {question}\nAnswer:",
            choice_columns=("choices.text",),
            label_column="answerKey",
            label_names_column="choices.label",
            dataset_path="allenai/ai2_arc",
            dataset_name="ARC-Challenge",
            split="test",
            description="ARC-Challenge: question, choices {text, label}, answerKey",
        ),
        MultipleChoiceTask(
            "piqa",
            context_template="Question: {goal}\nAnswer:",
            choice_columns=("sol1", "sol2"),
            dataset_path="baber/piqa",
            description="PIQA: goal, sol1, sol2, label",
        ),
    )
}

# The seed's task kinds, and Hub names (path or path/config) that follow a built-in task's column conventions.
TASK_ALIASES: dict[str, tuple[str, tuple[str, str | None] | None]] = {
    "sentiment": ("sst2", None),
    "nli": ("mnli", None),
    "qa": ("arc_easy", None),
    "paraphrase": ("mrpc", None),
    **{
        f"{path}/{config}": (config, (path, config))
        for path in ("glue", "nyu-mll/glue")
        for config in ("sst2", "mnli", "rte", "mrpc", "qqp")
    },
    "stanfordnlp/sst2": ("sst2", ("stanfordnlp/sst2", None)),
    "nyu-mll/multi_nli": ("mnli", ("nyu-mll/multi_nli", None)),
    "boolq": ("boolq", ("google/boolq", None)),
    "google/boolq": ("boolq", ("google/boolq", None)),
    **{
        f"{path}/ARC-{level}": (f"arc_{level.lower()}", (path, f"ARC-{level}"))
        for path in ("ai2_arc", "allenai/ai2_arc")
        for level in ("Easy", "Challenge")
    },
    **{path: ("piqa", (path, None)) for path in ("ybisk/piqa", "baber/piqa")},
}
# The seed's four-task suite, scored together by `run_zero_shot(..., ["smallbench"])`.
SMALLBENCH = ("sentiment", "nli", "qa", "paraphrase")


def get_task(task: str | tuple[str, str | None] | MultipleChoiceTask) -> MultipleChoiceTask:
    """A task spec from a built-in name ("sst2"), a seed kind ("sentiment", "nli", "qa", "paraphrase"), a Hub name
    ("glue/sst2", ("nyu-mll/glue", "mnli"), "allenai/ai2_arc/ARC-Easy", "piqa"), or a `MultipleChoiceTask`."""
    if isinstance(task, MultipleChoiceTask):
        return task
    if isinstance(task, tuple):
        task = "/".join(part for part in task if part)
    if not isinstance(task, str):
        raise TypeError(f"A task is a name or a MultipleChoiceTask, not {type(task).__name__}.")
    key = task.strip()
    if key in ZERO_SHOT_TASKS:
        return ZERO_SHOT_TASKS[key]
    folded = {name.lower(): name for name in TASK_ALIASES}
    if key.lower() in folded:
        alias = folded[key.lower()]
        name, hub = TASK_ALIASES[alias]
        spec = ZERO_SHOT_TASKS[name]
        if alias in SMALLBENCH:
            spec = dataclasses.replace(spec, name=alias)
        if hub is not None:
            spec = dataclasses.replace(spec, dataset_path=hub[0], dataset_name=hub[1])
        return spec
    raise ValueError(
        f"Unknown zero-shot task {task!r}. Built-in tasks: {', '.join(ZERO_SHOT_TASKS)}; seed kinds: "
        f"{', '.join(SMALLBENCH)} (or 'smallbench' for all four); Hub names: {', '.join(sorted(TASK_ALIASES)[:6])}, "
        "... For another dataset build a MultipleChoiceTask(name, context_template, choices=... or choice_columns=...)."
    )


def _expand_tasks(tasks) -> list[MultipleChoiceTask]:
    """A list of task specs from one task or a list of them ("smallbench" expands to the seed's four kinds)."""
    if isinstance(tasks, (str, MultipleChoiceTask)):
        tasks = [tasks]
    expanded = []
    for task in tasks:
        if isinstance(task, str) and task.strip().lower() == "smallbench":
            expanded += [get_task(kind) for kind in SMALLBENCH]
        else:
            expanded.append(get_task(task))
    if not expanded:
        raise ValueError("No tasks given; name at least one, e.g. ['sst2'] or ['smallbench'].")
    names = [task.name for task in expanded]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"Tasks {duplicates} appear twice; give each task a distinct name.")
    return expanded


# ---------------------------------------------------------------------------------------------------- data loading
def load_task_dataset(source: DataSource | None, *, hub_path: str | None, hub_name: str | None, split: str, what: str):
    """Rows of a task: a `datasets.Dataset` as given, a `DatasetDict`'s `split`, local files (json/jsonl/csv/tsv/
    parquet, loaded by `datasets.load_dataset`), or the Hub dataset `hub_path`/`hub_name` when `source` is None."""
    import datasets

    if isinstance(source, datasets.Dataset):
        return source
    if isinstance(source, datasets.DatasetDict):
        if split not in source:
            raise ValueError(f"{what}: the DatasetDict has no split {split!r} (splits: {', '.join(source)}).")
        return source[split]
    if source is not None:
        files = [os.fspath(source)] if isinstance(source, (str, os.PathLike)) else [os.fspath(f) for f in source]
        if not files:
            raise ValueError(f"{what}: the list of data files is empty.")
        extensions = {os.path.splitext(f)[1].lower() for f in files}
        builders = {FILE_BUILDERS.get(extension) for extension in extensions}
        if None in builders or len(builders) != 1:
            raise ValueError(
                f"{what}: cannot load {files}: use one kind of file among {', '.join(FILE_BUILDERS)} "
                f"(got extensions {sorted(extensions)})."
            )
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise FileNotFoundError(f"{what}: data file(s) not found: {missing}.")
        kwargs = {"delimiter": "\t"} if extensions == {".tsv"} else {}
        return datasets.load_dataset(builders.pop(), data_files=files, split="train", **kwargs)
    if hub_path is None:
        raise ValueError(f"{what}: no Hub dataset is known for this task; pass local files or a datasets.Dataset.")
    try:
        return datasets.load_dataset(hub_path, hub_name, split=split)
    except (ConnectionError, FileNotFoundError) as error:
        offline = [name for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(name, "0") != "0"]
        reason = f" ({' and '.join(offline)} set)" if offline else ""
        hub = repr(hub_path) + (f" (config {hub_name!r})" if hub_name else "")
        raise ConnectionError(
            f"{what}: could not load the Hub dataset {hub}, split {split!r}{reason}: {error}. Without the Hub, "
            f"pass local files in the same schema (json/jsonl/csv/parquet), e.g. data={{...: 'path/to/rows.jsonl'}}, "
            "or a datasets.Dataset; with the Hub, unset HF_HUB_OFFLINE/HF_DATASETS_OFFLINE."
        ) from error


# ---------------------------------------------------------------------------------------------------- scoring
@dataclass
class ContinuationScore:
    """The log-likelihood of one continuation given its context.

    Attributes:
        logprob: `sum_t log p(continuation_t | context, continuation_<t)` (natural log).
        num_tokens: number of continuation tokens scored.
        is_greedy: whether every continuation token is the model's argmax.
        truncated_tokens: context tokens dropped from the left to fit `max_length` (0 normally).
    """

    logprob: float
    num_tokens: int
    is_greedy: bool
    truncated_tokens: int = 0


@dataclass
class _Request:
    context: list[int]
    continuation: list[int]
    group: int = 0
    cut: int = 0  # context tokens run ahead of time into memory (HMT)
    truncated: int = 0


def _hmt_segment_length(model) -> int | None:
    """`segment_length` if `model` is an HMT (also behind a PEFT wrapper), else None."""
    config = getattr(model, "config", None)
    if hasattr(model, "empty_memory") and isinstance(getattr(config, "segment_length", None), int):
        return config.segment_length
    return None


def _is_token_scorer(model) -> bool:
    """A `hmt_hf.evaluation` `Scorer` (HMTScorer, VanillaTransformer, SlidingWindowTransformer, ...): an object
    whose `score(input_ids, first_target=...)` returns per-token NLLs, rather than a module returning logits."""
    return (
        not isinstance(model, torch.nn.Module)
        and callable(getattr(model, "score", None))
        and hasattr(model, "language_model")
    )


def _base_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _model_max_length(model) -> int | None:
    """The longest input a plain model takes (from its config); None for HMT or when unknown (e.g. ALiBi)."""
    if _hmt_segment_length(model) is not None or _is_token_scorer(model):
        return None  # HMT reads any length; a Scorer applies its own policy (truncation, windows, chunks)
    config = getattr(_base_model(model), "config", None)
    if config is None:
        return None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class ContinuationScorer:
    """Scores `(context, continuation)` requests with a causal LM (see the module docstring for the conventions).

    Args:
        model: an `HMTForCausalLM`, a `PreTrainedModel` with an LM head, or a module with the same call interface.
        tokenizer: the model's tokenizer.
        batch_size: rows (candidate continuations) per forward pass.
        max_length: `"model"` (default): a plain model's `max_position_embeddings` and no limit for HMT; an int:
            that limit; None: no limit. Longer inputs lose context tokens from the left, counted in
            `truncated_tokens` (and logged); a continuation that does not fit alone is an error.
        prepend_bos: put the BOS token in front of every context. None: do so if the tokenizer adds BOS itself.
        share_context_memory: HMT only: run each context's full segments once and reuse the memory for all its
            continuations (exact; see module docstring).
        model_kwargs: extra keyword arguments for every forward call (e.g. `{"use_memory": False}` for HMT's
            chunked-backbone ablation).
        progress: show tqdm progress bars.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 8,
        max_length: int | str | None = "model",
        prepend_bos: bool | None = None,
        share_context_memory: bool = True,
        model_kwargs: Mapping | None = None,
        progress: bool = True,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be an int >= 1.")
        if max_length == "model":
            max_length = _model_max_length(model)
        elif max_length is not None and (not isinstance(max_length, int) or max_length < 2):
            raise ValueError(f"max_length={max_length!r} must be 'model', None or an int >= 2.")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_length, self.progress = batch_size, max_length, progress
        self.model_kwargs = dict(model_kwargs or {})
        self.token_scorer = _is_token_scorer(model)
        self.segment_length = None if self.token_scorer else _hmt_segment_length(model)
        self.share_context_memory = (
            share_context_memory
            and self.segment_length is not None
            and self.model_kwargs.get("use_memory") is not False
        )
        if self.token_scorer:
            if self.model_kwargs:
                raise ValueError("model_kwargs cannot be passed to a Scorer; configure the Scorer itself instead.")
            self._takes_logits_to_keep = self._takes_position_ids = False
            self.device = model.device
        else:
            base = _base_model(model)
            parameters = inspect.signature(base.forward).parameters
            self._takes_logits_to_keep = "logits_to_keep" in parameters
            # HMT restarts positions inside every segment itself; plain models need positions that skip left padding.
            self._takes_position_ids = "position_ids" in parameters and self.segment_length is None
            parameter = next(iter(base.parameters()), None)
            self.device = parameter.device if parameter is not None else torch.device("cpu")
        if prepend_bos is None:
            bos = getattr(tokenizer, "bos_token_id", None)
            prepend_bos = bos is not None and tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos]
        self.prepend_bos = prepend_bos
        self._context_cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ tokenisation
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's `_encode_pair`: context ids, and the continuation ids as the difference between the encodings
        of `context + continuation` and `context` (after moving the context's trailing whitespace over). The BOS
        token (`prepend_bos`) goes in front of the context; an empty context becomes BOS (or EOS) alone."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if context not in self._context_cache:
            self._context_cache[context] = self._encode(context)
        text_ids = self._context_cache[context]
        continuation_ids = self._encode(context + continuation)[len(text_ids) :]
        if not continuation_ids:
            raise ValueError(
                f"The continuation {continuation!r} encodes to no tokens after context {context[-40:]!r}."
            )
        context_ids = ([self.tokenizer.bos_token_id] if self.prepend_bos else []) + text_ids
        if not context_ids:
            stand_in = getattr(self.tokenizer, "bos_token_id", None)
            stand_in = stand_in if stand_in is not None else getattr(self.tokenizer, "eos_token_id", None)
            if stand_in is None:
                raise ValueError(
                    "A context is empty and the tokenizer has no BOS/EOS token to stand in for it; every continuation "
                    "needs at least one token before it."
                )
            context_ids = [stand_in]
        return context_ids, continuation_ids

    # ------------------------------------------------------------------ scoring
    def score(self, requests: Sequence[tuple[str, str]], desc: str = "scoring") -> list[ContinuationScore]:
        """`ContinuationScore` of every `(context, continuation)` request, in order."""
        return self.score_encoded(
            [self.encode_pair(context, continuation) for context, continuation in requests], desc
        )

    def score_encoded(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], desc: str = "scoring"
    ) -> list[ContinuationScore]:
        """`ContinuationScore` of already tokenised `(context_ids, continuation_ids)` requests (e.g. lm-eval's
        `_encode_pair` output), in order. The context needs at least one token, the continuation too."""
        for context, continuation in requests:
            if not context or not continuation:
                raise ValueError(
                    f"A request has {len(context)} context and {len(continuation)} continuation tokens; both need at "
                    "least one (an empty context is a BOS/EOS token)."
                )
        return self.score_ids(
            [self._prepare(list(context), list(continuation)) for context, continuation in requests], desc
        )

    def _prepare(self, context: list[int], continuation: list[int]) -> _Request:
        request = _Request(context, continuation)
        if self.max_length is not None and len(context) + len(continuation) > self.max_length:
            if len(continuation) >= self.max_length:
                raise ValueError(
                    f"A continuation of {len(continuation)} tokens does not fit max_length={self.max_length} with at "
                    "least one context token; raise max_length (None: no limit) or shorten the continuation."
                )
            request.truncated = len(context) + len(continuation) - self.max_length
            request.context = context[request.truncated :]
        return request

    def score_ids(self, requests: Sequence[_Request], desc: str = "scoring") -> list[ContinuationScore]:
        from tqdm.auto import tqdm

        groups: dict[tuple[int, ...], int] = {}
        for request in requests:
            request.group = groups.setdefault(tuple(request.context), len(groups))
            if self.share_context_memory:
                request.cut = (len(request.context) - 1) // self.segment_length * self.segment_length
        truncated = sum(request.truncated > 0 for request in requests)
        if truncated:
            logger.warning(
                "%d of %d requests lost context tokens from the left to fit max_length=%d.",
                truncated,
                len(requests),
                self.max_length,
            )
        # Longest first (as lm-eval): padding stays small and an out-of-memory error shows up at once.
        group_length = {}
        for request in requests:
            tail = len(request.context) - request.cut + len(request.continuation)
            group_length[request.group] = max(group_length.get(request.group, 0), tail)
        order = sorted(range(len(requests)), key=lambda i: (-group_length[requests[i].group], requests[i].group, i))
        results: list[ContinuationScore | None] = [None] * len(requests)
        prefix_memory: dict[int, Any] = {}
        remaining = {group: 0 for group in group_length}
        for request in requests:
            remaining[request.group] += 1

        if self.token_scorer:
            return self._score_with_token_scorer(requests, desc)
        model = self.model
        was_training = getattr(model, "training", False)
        if hasattr(model, "eval"):
            model.eval()
        try:
            with torch.inference_mode():
                bar = tqdm(total=len(requests), desc=desc, disable=not self.progress, leave=False)
                for start in range(0, len(order), self.batch_size):
                    rows = order[start : start + self.batch_size]
                    batch = [requests[i] for i in rows]
                    if self.share_context_memory:
                        self._run_prefixes(batch, prefix_memory)
                    for i, score in zip(rows, self._score_batch(batch, prefix_memory)):
                        results[i] = score
                        remaining[requests[i].group] -= 1
                        if remaining[requests[i].group] == 0:
                            prefix_memory.pop(requests[i].group, None)
                    bar.update(len(rows))
                bar.close()
        finally:
            if was_training and hasattr(model, "train"):
                model.train()
        return results

    def _score_with_token_scorer(self, requests: Sequence[_Request], desc: str) -> list[ContinuationScore]:
        """Requests one at a time through a `Scorer` (no padding: its `first_target` is per call)."""
        from tqdm.auto import tqdm

        results = []
        for request in tqdm(requests, desc=desc, disable=not self.progress, leave=False):
            start = len(request.context)
            ids = torch.tensor([request.context + request.continuation])
            token_scores = self.model.score(ids, first_target=start)
            scored = token_scores.scored[0, start:]
            if not bool(scored.all()):
                raise ValueError(
                    f"{getattr(self.model, 'name', type(self.model).__name__)} left {int((~scored).sum())} of "
                    f"{scored.numel()} continuation tokens unscored (e.g. a head-truncating baseline dropped them); "
                    "use tail truncation or a longer window so every continuation token is scored."
                )
            results.append(
                ContinuationScore(
                    logprob=-float(token_scores.nll[0, start:].double().sum()),
                    num_tokens=len(request.continuation),
                    is_greedy=bool((token_scores.target_rank[0, start:] == 0).all()),
                    truncated_tokens=request.truncated,
                )
            )
        return results

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, logits_to_keep: int, memory=None):
        kwargs = dict(self.model_kwargs)
        if memory is not None:
            kwargs["memory"] = memory
        if self._takes_position_ids:
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        return self.model(input_ids=ids, attention_mask=mask, **kwargs)

    def _run_prefixes(self, batch: list[_Request], prefix_memory: dict):
        """HMT: run the shared full segments of every new context of the batch once (batched) and keep the memory."""
        new = {}
        for request in batch:
            if request.cut > 0 and request.group not in prefix_memory:
                new[request.group] = request.context[: request.cut]
        if not new:
            return
        ids, mask = _left_pad(list(new.values()), self.device)
        out = self._forward(ids, mask, logits_to_keep=1, memory=self.model.empty_memory(len(new)))
        for row, group in enumerate(new):
            prefix_memory[group] = out.memory.index_select(torch.tensor([row], device=self.device))

    def _score_batch(self, batch: list[_Request], prefix_memory: dict) -> list[ContinuationScore]:
        tails = [request.context[request.cut :] + request.continuation for request in batch]
        ids, mask = _left_pad(tails, self.device)
        keep = max(len(request.continuation) for request in batch) + 1
        memory = None
        if self.segment_length is not None and self.model_kwargs.get("use_memory") is not False:
            # An explicit memory for every row (empty where the context fits in the tail): a call inside
            # `model.carry_memory()` must not continue from an unrelated earlier call.
            empty = self.model.empty_memory(1)
            memory = _stack_states(
                [prefix_memory.get(request.group, empty) if request.cut else empty for request in batch]
            )
        logits = self._forward(ids, mask, logits_to_keep=keep, memory=memory).logits
        # Positions T-keep .. T-2 predict the last keep-1 tokens of every (left-padded) row.
        logits = logits[:, logits.shape[1] - keep : -1].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        scores = []
        for row, request in enumerate(batch):
            n = len(request.continuation)
            target = torch.tensor(request.continuation, device=log_probs.device)
            row_log_probs = log_probs[row, log_probs.shape[1] - n :]
            token_log_probs = row_log_probs.gather(-1, target[:, None]).squeeze(-1)
            scores.append(
                ContinuationScore(
                    logprob=float(token_log_probs.double().sum()),
                    num_tokens=n,
                    is_greedy=bool((row_log_probs.argmax(-1) == target).all()),
                    truncated_tokens=request.truncated,
                )
            )
        return scores


def _left_pad(sequences: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(sequence) for sequence in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, width - len(sequence) :] = torch.tensor(sequence)
            mask[row, width - len(sequence) :] = 1
    return ids.to(device), mask.to(device)


def _stack_states(states: list):
    """One batch of HMT memory states `(B, ...)` from single-row states with different cache sizes: caches are
    right-aligned, so shorter ones get empty (masked) slots in front."""
    width = max(state.memories.shape[1] for state in states)

    def grow(state):
        missing = width - state.memories.shape[1]
        if missing == 0:
            return state
        return dataclasses.replace(
            state,
            memories=torch.nn.functional.pad(state.memories, (0, 0, missing, 0)),
            memory_mask=torch.nn.functional.pad(state.memory_mask, (missing, 0), value=False),
        )

    grown = [grow(state) for state in states]
    return dataclasses.replace(
        grown[0],
        **{f.name: torch.cat([getattr(s, f.name) for s in grown]) for f in dataclasses.fields(grown[0])},
    )


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


def _settings(scorer: ContinuationScorer) -> dict:
    model = scorer.model if scorer.token_scorer else _base_model(scorer.model)
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
    specs = _expand_tasks(tasks)
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
    settings = _settings(scorer)
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
            _add_metric(
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
            _add_metric(
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


def _add_metric(results: dict, experiment: str, metric: str, value: float, unit: str, **fields):
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
    settings = _settings(scorer)
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
            _add_metric(
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


__all__ = [
    "ContinuationScore",
    "ContinuationScorer",
    "FusedQuestion",
    "MultipleChoiceExample",
    "MultipleChoiceTask",
    "PUBMEDQA_DECISIONS",
    "PubMedQAExample",
    "SMALLBENCH",
    "TASK_ALIASES",
    "ZERO_SHOT_TASKS",
    "choose",
    "evaluate_multiple_choice",
    "fuse_contexts",
    "get_task",
    "load_pubmedqa",
    "load_task_dataset",
    "pubmedqa_prompt",
    "run_pubmedqa",
    "run_zero_shot",
]
