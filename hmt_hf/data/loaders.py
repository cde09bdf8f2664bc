"""PyTorch-side entry points: `LongDocumentDataset` (alias `WikiTextDataset`), `LongContextDataLoader`, `create_dataloaders`.

They are thin layers over `load_documents` -> `tokenize_documents` -> `group_into_windows` / `document_windows` ->
`HMTDataCollator`; nothing here truncates a document. Use the `datasets` functions directly with `Trainer`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from .documents import load_documents, split_by_document
from .windows import HMTDataCollator, document_windows, group_into_windows, tokenize_documents

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

logger = logging.getLogger(__name__)


class LongDocumentDataset(torch.utils.data.Dataset):
    """Long-context samples of one split, tokenized without truncation: a `torch.utils.data.Dataset`.

    By default each sample is one whole article (or document) of WikiText-103, articles re-assembled from
    WikiText's lines. Any source `load_documents` accepts works (a Hub id, local files, a `prepare-data` folder), or
    pass already loaded `documents`.

    Args:
        tokenizer: the backbone's tokenizer.
        split: "train", "validation" or "test".
        dataset_name_or_path, dataset_config_name, text_column, cache_dir: see `load_documents`.
        documents: a `Dataset` (used as is) or `DatasetDict` (its `split`) of documents instead of loading.
        min_length: documents with fewer tokens are left out (their number is in `num_excluded_documents`).
        max_length: None keeps documents whole; otherwise documents are cut into consecutive pieces of at most
            `max_length` tokens (every token kept), see `document_windows`.
        window_length, window_stride: instead of document samples, the paper's training windows of `window_length`
            tokens (bptt_depth x segment_length) with stride `window_stride` (one segment) over the concatenated
            documents, see `group_into_windows`.

    Items are dicts with `input_ids` and `labels` (lists of ints); `.dataset` is the underlying `datasets.Dataset`.
    `WikiTextDataset` is the same class under the name the user's design notes use (its default source is WikiText).
    """

    def __init__(
        self,
        tokenizer,
        split: str = "train",
        dataset_name_or_path: str | Any = "wikitext",
        dataset_config_name: str | None = None,
        documents: Dataset | DatasetDict | None = None,
        min_length: int = 0,
        max_length: int | None = None,
        stride: int | None = None,
        window_length: int | None = None,
        window_stride: int | None = None,
        text_column: str | None = None,
        cache_dir: str | None = None,
        add_eos: bool = True,
        num_proc: int | None = None,
    ):
        from datasets import DatasetDict

        if documents is None:
            documents = load_documents(dataset_name_or_path, dataset_config_name, text_column=text_column,
                                       cache_dir=cache_dir)  # fmt: skip
        if isinstance(documents, (DatasetDict, Mapping)):
            if split not in documents:
                raise ValueError(
                    f"{type(self).__name__}: no split {split!r} (splits: {list(documents)}); hold out documents with "
                    "hmt_hf.data.split_by_document, or use create_dataloaders, which does so."
                )
            documents = documents[split]
        self.split = split
        tokenized = tokenize_documents(documents, tokenizer, add_eos=add_eos, num_proc=num_proc)
        self.num_documents = len(tokenized)
        if min_length > 0:
            tokenized = tokenized.filter(lambda row: len(row["input_ids"]) >= min_length, desc="min_length")
            if len(tokenized) < self.num_documents:
                logger.info("%s: %d of %d documents have fewer than %d tokens and are left out", split,
                            self.num_documents - len(tokenized), self.num_documents, min_length)  # fmt: skip
        self.num_excluded_documents = self.num_documents - len(tokenized)
        if window_length is not None:
            self.dataset = group_into_windows(tokenized, window_length, window_stride or window_length)
        else:
            self.dataset = document_windows(tokenized, max_length=max_length, stride=stride)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.dataset[int(index)]

    @property
    def lengths(self) -> list[int]:
        """Tokens per sample."""
        return [len(ids) for ids in self.dataset["input_ids"]]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(split={self.split!r}, samples={len(self)}, tokens={self.num_tokens})"


WikiTextDataset = LongDocumentDataset


class LongContextDataLoader(DataLoader):
    """A `DataLoader` of padded long-context batches (`input_ids`, `attention_mask`, `labels`, all `(B, T)`).

    Args:
        dataset: a `LongDocumentDataset`, a `datasets.Dataset` with `input_ids`, or any indexable of such dicts.
        batch_size: samples per batch (default 1: long documents are memory-bound).
        shuffle: shuffle samples each epoch (default False).
        tokenizer / pad_token_id: where the padding id comes from (the tokenizer's pad token, else its EOS);
            one of them, or `collate_fn`, is required.
        padding_side, pad_to_multiple_of: see `HMTDataCollator`.
        Other keyword arguments go to `torch.utils.data.DataLoader` (`num_workers`, `drop_last`, `sampler`...).
    """

    def __init__(
        self,
        dataset,
        batch_size: int = 1,
        shuffle: bool = False,
        tokenizer=None,
        pad_token_id: int | None = None,
        padding_side: str = "right",
        pad_to_multiple_of: int | None = None,
        collate_fn=None,
        **kwargs,
    ):
        if collate_fn is None:
            if pad_token_id is None and tokenizer is not None:
                pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            collate_fn = HMTDataCollator(
                pad_token_id, padding_side=padding_side, pad_to_multiple_of=pad_to_multiple_of
            )
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=collate_fn, **kwargs)


def create_dataloaders(
    tokenizer,
    dataset_name_or_path: str | Any = "wikitext",
    dataset_config_name: str | None = None,
    split: str | list[str] | None = None,
    batch_size: int = 1,
    eval_batch_size: int | None = None,
    segment_length: int | None = None,
    bptt_depth: int | None = None,
    min_length: int = 0,
    max_length: int | None = None,
    validation_fraction: float = 0.05,
    test_fraction: float = 0.05,
    seed: int = 0,
    text_column: str | None = None,
    cache_dir: str | None = None,
    shuffle_train: bool = True,
    num_workers: int = 0,
    **dataloader_kwargs,
) -> dict[str, LongContextDataLoader]:
    """Train/validation/test `LongContextDataLoader`s from a document source, in one call.

    Args:
        tokenizer: the backbone's tokenizer (padding uses its pad token, else its EOS; padded positions are masked).
        dataset_name_or_path, dataset_config_name, text_column, cache_dir: see `load_documents` (default: WikiText-103
            from the Hub; offline, pass a `hmt-hf prepare-data` folder or local files).
        split: only these split(s) (e.g. "test"); default all three.
        batch_size: training batch size; eval_batch_size: validation/test batch size (default `batch_size`).
        segment_length, bptt_depth: when both are given, training samples are the paper's windows of
            `bptt_depth * segment_length` tokens, stride `segment_length`, over the concatenated training documents.
            Otherwise (and always for validation/test) samples are whole documents, see `max_length`.
        min_length: leave out documents with fewer tokens.
        max_length: cut document samples into consecutive pieces of at most this many tokens (nothing is dropped).
        validation_fraction, test_fraction, seed: when the source has only a train split (local files, PG-19 style
            single-split Hub datasets), these shares of its *documents* are held out, deterministically.
        shuffle_train: shuffle training samples each epoch.
        dataloader_kwargs: passed to every `DataLoader` (e.g. `pin_memory`, `persistent_workers`).

    Returns:
        `{"train": ..., "validation": ..., "test": ...}` (only the requested splits): unpack with
        `train, validation, test = create_dataloaders(...).values()`.
    """
    if (segment_length is None) != (bptt_depth is None):
        raise ValueError(
            "create_dataloaders: give both segment_length and bptt_depth for training windows, or neither."
        )
    documents = load_documents(dataset_name_or_path, dataset_config_name, text_column=text_column, cache_dir=cache_dir)
    if set(documents) == {"train"} and (validation_fraction > 0 or test_fraction > 0):
        documents = split_by_document(documents["train"], validation_fraction, test_fraction, seed=seed)
    wanted = ["train", "validation", "test"] if split is None else [split] if isinstance(split, str) else list(split)
    missing = [name for name in wanted if name not in documents]
    if missing:
        raise ValueError(
            f"create_dataloaders: no split(s) {missing} in {dataset_name_or_path!r} (has {list(documents)})."
        )
    loaders = {}
    for name in wanted:
        training = name == "train"
        windows = {"window_length": bptt_depth * segment_length, "window_stride": segment_length} if (
            training and segment_length is not None
        ) else {}  # fmt: skip
        dataset = LongDocumentDataset(tokenizer, split=name, documents=documents, min_length=min_length,
                                  max_length=max_length, **windows)  # fmt: skip
        loaders[name] = LongContextDataLoader(
            dataset,
            batch_size=batch_size if training else (eval_batch_size or batch_size),
            shuffle=shuffle_train and training,
            tokenizer=tokenizer,
            num_workers=num_workers,
            **dataloader_kwargs,
        )
    return loaders
