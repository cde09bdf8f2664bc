"""Whole documents from the Hub or local files: a `DatasetDict` with column "text", one row per document.

HMT is trained and evaluated on long documents, so nothing here splits or truncates a document:
- WikiText comes one *line* per row; `reassemble_wikitext_articles` rebuilds whole articles from its line format.
- PG-19 (`emozilla/pg19`) and the Pile-ArXiv subset (`timaeus/pile-arxiv`) have one document per row.
- Local `.txt` (and other plain-text) files are one document each; `.json`/`.jsonl`/`.csv`/`.parquet` files have one
  document per record; a folder holds one document per file (or is a dataset saved with `save_to_disk`, such as
  the corpora `hmt-hf prepare-data` builds).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

# Extensions read as one plain-text document per file; anything else in a folder is skipped only if hidden.
TEXT_EXTENSIONS = (".txt", ".text", ".md", ".rst", ".tex")
RECORD_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
SPLIT_FOLDER_NAMES = {"train": "train", "validation": "validation", "valid": "validation", "dev": "validation",
                      "test": "test"}  # fmt: skip

# " = Title = " starts a WikiText article; " = = Section = = " (two or more '=') is a heading inside one.
WIKITEXT_TITLE = re.compile(r"^ = (?!=)(.*?)(?<!=) = ?\n?$")


@dataclass(frozen=True)
class HubCorpus:
    """How to read one known Hub dataset as whole documents."""

    repo_id: str
    default_config: str | None
    text_column: str
    wikitext_lines: bool = False


# Names users pass (the paper's datasets) -> how to load them. Any other Hub id is loaded as-is.
KNOWN_HUB_CORPORA = {
    "wikitext": HubCorpus("Salesforce/wikitext", "wikitext-103-raw-v1", "text", wikitext_lines=True),
    "Salesforce/wikitext": HubCorpus("Salesforce/wikitext", "wikitext-103-raw-v1", "text", wikitext_lines=True),
    "emozilla/pg19": HubCorpus("emozilla/pg19", None, "text"),
    "deepmind/pg19": HubCorpus("deepmind/pg19", None, "text"),
    "pg19": HubCorpus("emozilla/pg19", None, "text"),
    "pile-arxiv": HubCorpus("timaeus/pile-arxiv", None, "text"),
    "timaeus/pile-arxiv": HubCorpus("timaeus/pile-arxiv", None, "text"),
}


def load_documents(
    name_or_path: str | os.PathLike | Mapping[str, str | os.PathLike | list],
    config_name: str | None = None,
    split: str | None = None,
    text_column: str | None = None,
    cache_dir: str | None = None,
    **load_kwargs,
) -> DatasetDict:
    """Whole documents as a `DatasetDict` of `Dataset`s with column "text" (one row per document).

    Args:
        name_or_path: one of
            - a Hub dataset: "wikitext" (config "wikitext-103-raw-v1" by default; articles re-assembled from lines),
              "emozilla/pg19", "pile-arxiv" (= "timaeus/pile-arxiv"), or any Hub id with a text column;
            - a local file: `.txt`/`.md`/`.rst`/`.tex` (the whole file is one document), `.json`/`.jsonl`/
              `.csv`/`.parquet` (one document per record, in `text_column`);
            - a local folder: a dataset saved with `save_to_disk`; or folders named train/validation/test with
              documents inside; or files, one document each;
            - a mapping split name -> path(s) (like run_clm's --train_file / --validation_file).
        config_name: the Hub dataset's configuration (e.g. "wikitext-2-raw-v1").
        split: keep only this split (the result still is a `DatasetDict`, with that one key).
        text_column: the column holding the text ("text" by default); it is renamed to "text".
        cache_dir: where `datasets` caches downloads and Arrow files.
        load_kwargs: passed to `datasets.load_dataset` (e.g. `revision`, `num_proc`).

    Local files become split "train" unless they sit in split-named folders or come as a mapping. To hold out
    documents from a single split, use `split_by_document`.
    """
    from datasets import DatasetDict

    if isinstance(name_or_path, Mapping):
        splits = {
            name: _load_local(paths, text_column, cache_dir, load_kwargs) for name, paths in name_or_path.items()
        }
        documents = DatasetDict(splits)
    elif os.path.exists(name_or_path):
        documents = _load_local_path(Path(name_or_path), text_column, cache_dir, load_kwargs)
    elif looks_like_local_path(str(name_or_path)):
        raise FileNotFoundError(
            f"load_documents: {name_or_path!r} does not exist; pass an existing file or folder, or a Hub dataset id."
        )
    else:
        documents = _load_hub(str(name_or_path), config_name, text_column, cache_dir, load_kwargs)
    if split is not None:
        if split not in documents:
            raise ValueError(f"load_documents: no split {split!r} in {name_or_path!r} (splits: {list(documents)}).")
        documents = DatasetDict({split: documents[split]})
    return documents


def looks_like_local_path(name: str) -> bool:
    """A Hub id is "name" or "owner/name"; a path starts with . / ~, has two slashes or a document file extension."""
    return (
        name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or Path(name).suffix.lower() in TEXT_EXTENSIONS + tuple(RECORD_BUILDERS)
    )


# ---------------------------------------------------------------------------------------------------- Hub
def _load_hub(name: str, config_name, text_column, cache_dir, load_kwargs) -> DatasetDict:
    from datasets import DatasetDict, load_dataset

    known = KNOWN_HUB_CORPORA.get(name)
    repo_id = known.repo_id if known else name
    config_name = config_name or (known.default_config if known else None)
    try:
        raw = load_dataset(repo_id, config_name, cache_dir=cache_dir, **load_kwargs)
    except (ConnectionError, OSError) as error:
        raise ConnectionError(
            f"load_documents: could not load {repo_id!r} from the Hugging Face Hub ({error}). Offline "
            "(HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1) only datasets already in the `datasets` cache load. "
            "Without the Hub, build a local long-document corpus with `hmt-hf prepare-data books|wiki|arxiv "
            "--output_dir DIR` and pass DIR, or pass local files."
        ) from error
    if not isinstance(raw, DatasetDict):
        raw = DatasetDict({"train": raw})
    if known and known.wikitext_lines:
        return DatasetDict({split: reassemble_wikitext_articles(lines) for split, lines in raw.items()})
    column = text_column or (known.text_column if known else "text")
    return DatasetDict({split: _as_text_column(dataset, column, name) for split, dataset in raw.items()})


def reassemble_wikitext_articles(lines: Dataset | Iterable[str], text_column: str = "text") -> Dataset:
    """Whole WikiText articles from WikiText's one-line-per-row format: a `Dataset` with columns "title", "text".

    In WikiText an article starts at a title line " = Title = \\n" (exactly one '=' on each side); lines like
    " = = Section = = \\n" are headings inside the article, and empty rows separate paragraphs. An article's text is
    its lines joined as they are, title line included (as in WikiText's own token stream). Lines before the first
    title (there are none in WikiText itself) become one untitled document rather than being dropped.
    """
    from datasets import Dataset, Features, Value

    def articles(lines, text_column) -> Iterator[dict[str, str]]:
        title, parts = None, []
        for line in _iter_lines(lines, text_column):
            match = WIKITEXT_TITLE.match(line)
            if match:
                if parts and "".join(parts).strip():
                    yield {"title": title or "", "text": "".join(parts)}
                title, parts = match.group(1).strip(), []
            parts.append(line)
        if parts and "".join(parts).strip():
            yield {"title": title or "", "text": "".join(parts)}

    features = Features({"title": Value("string"), "text": Value("string")})
    if isinstance(lines, Dataset) and lines.cache_files:
        # File-backed lines: written to the `datasets` cache, keyed by the line dataset's own fingerprint: re-assembling the same split again is a cache hit.
        return Dataset.from_generator(
            articles,
            gen_kwargs={"lines": lines, "text_column": text_column},
            features=features,
            fingerprint=f"{lines._fingerprint}-wikitext-articles",
        )
    return Dataset.from_list(list(articles(lines, text_column)), features=features)


def _iter_lines(lines, text_column: str) -> Iterator[str]:
    from datasets import Dataset

    if isinstance(lines, Dataset):
        if text_column not in lines.column_names:
            raise ValueError(f"no column {text_column!r} in the WikiText lines (columns: {lines.column_names}).")
        for batch in lines.select_columns([text_column]).iter(batch_size=10_000):
            yield from batch[text_column]
    else:
        yield from lines


# ---------------------------------------------------------------------------------------------------- local files
def _load_local_path(path: Path, text_column, cache_dir, load_kwargs) -> DatasetDict:
    from datasets import DatasetDict, load_from_disk

    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
            saved = load_from_disk(str(path))
            saved = saved if isinstance(saved, DatasetDict) else DatasetDict({"train": saved})
            return DatasetDict(
                {split: _as_text_column(ds, text_column or "text", path) for split, ds in saved.items()}
            )
        split_folders = {
            SPLIT_FOLDER_NAMES[child.name.lower()]: child
            for child in sorted(path.iterdir())
            if child.is_dir() and child.name.lower() in SPLIT_FOLDER_NAMES
        }
        if split_folders:
            return DatasetDict(
                {
                    split: _load_local(folder, text_column, cache_dir, load_kwargs)
                    for split, folder in split_folders.items()
                }
            )
    return DatasetDict({"train": _load_local(path, text_column, cache_dir, load_kwargs)})


def _document_files(path: Path) -> list[Path]:
    """The files under `path` (recursively, sorted, hidden ones skipped); `path` itself if it is a file."""
    if not path.exists():
        raise FileNotFoundError(f"load_documents: {str(path)!r} does not exist.")
    if path.is_file():
        return [path]
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if not files:
        raise FileNotFoundError(f"load_documents: folder {str(path)!r} holds no files (one document per file).")
    return files


def _load_local(paths, text_column, cache_dir, load_kwargs) -> Dataset:
    """One split from a file, a folder, or a list of them."""
    from datasets import load_dataset

    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = [file for path in paths for file in _document_files(Path(path))]
    suffixes = {file.suffix.lower() for file in files}
    record_suffixes = suffixes & set(RECORD_BUILDERS)
    if record_suffixes:
        builders = {RECORD_BUILDERS[s] for s in record_suffixes}
        if len(builders) > 1 or record_suffixes != suffixes:
            raise ValueError(
                f"load_documents: mixed file types {sorted(suffixes)} in {[str(p) for p in paths]}; pass one kind: "
                "plain-text files (one document each) or records (.json/.jsonl, .csv or .parquet)."
            )
        dataset = load_dataset(
            builders.pop(), data_files=[str(f) for f in files], split="train", cache_dir=cache_dir, **load_kwargs
        )
        return _as_text_column(dataset, text_column or "text", files[0])
    # Plain text: the `text` builder with sample_by="document" gives one row per file, whole.
    dataset = load_dataset(
        "text", data_files=[str(f) for f in files], sample_by="document", split="train", cache_dir=cache_dir,
        **load_kwargs,
    )  # fmt: skip
    if len(dataset) != len(files):  # the "source" column below relies on one row per file, in order
        raise RuntimeError(
            f"load_documents: expected one document per file, got {len(dataset)} for {len(files)} files."
        )
    return dataset.add_column("source", [str(f) for f in files])


def _as_text_column(dataset: Dataset, column: str, source) -> Dataset:
    """`dataset` with its document text in column "text" (other columns kept, a clashing "text" replaced)."""
    if column not in dataset.column_names:
        raise ValueError(
            f"load_documents: no text column {column!r} in {str(source)!r} (columns: {dataset.column_names}); "
            "pass text_column=<the column holding the document text>."
        )
    if column != "text":
        if "text" in dataset.column_names:
            dataset = dataset.remove_columns("text")
        dataset = dataset.rename_column(column, "text")
    return dataset


# ---------------------------------------------------------------------------------------------------- splitting
def split_by_document(
    dataset: Dataset, validation_fraction: float = 0.05, test_fraction: float = 0.05, seed: int = 0
) -> DatasetDict:
    """Split documents (rows) into train/validation/test, deterministically for a given `seed`.

    Whole documents go to exactly one split, so no text of a test document is seen in training. Each held-out
    split gets `round(fraction * n)` documents, at least one when its fraction is > 0 and there are enough
    documents; the order of documents inside each split follows the original order.
    """
    import numpy as np
    from datasets import DatasetDict

    if not 0 <= validation_fraction < 1 or not 0 <= test_fraction < 1 or validation_fraction + test_fraction >= 1:
        raise ValueError(
            f"validation_fraction ({validation_fraction}) and test_fraction ({test_fraction}) must be in [0, 1) "
            "and leave documents for training."
        )
    n = len(dataset)
    counts = [max(1, round(f * n)) if f > 0 else 0 for f in (validation_fraction, test_fraction)]
    if sum(counts) >= n:
        raise ValueError(
            f"split_by_document: {n} documents are too few for validation={counts[0]} and test={counts[1]} documents "
            "plus at least one training document; use more documents or smaller fractions."
        )
    order = np.random.default_rng(seed).permutation(n)
    validation = np.sort(order[: counts[0]])
    test = np.sort(order[counts[0] : counts[0] + counts[1]])
    train = np.sort(order[counts[0] + counts[1] :])
    splits = {"train": train, "validation": validation, "test": test}
    return DatasetDict({name: dataset.select(rows.tolist()) for name, rows in splits.items()})
