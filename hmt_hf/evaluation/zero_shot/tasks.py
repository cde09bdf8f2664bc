"""Multiple-choice task specs (`MultipleChoiceTask`, the GLUE/ARC/SmallBench built-ins) and loading their data
from local files or the Hub."""

from __future__ import annotations

import dataclasses
import logging
import os
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def expand_tasks(tasks) -> list[MultipleChoiceTask]:
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
