"""From whole documents to HMT training samples: tokenisation, paper-style windows, document windows, padding.

The pipeline, in `datasets` terms (every step is a `Dataset -> Dataset` function, cached by fingerprint when the
input is file-backed):

    documents (column "text", one row per whole document)
      -> tokenize_documents   (column "input_ids", one row per document, never truncated, EOS between documents)
      -> group_into_windows   (the paper's training samples: depth x L tokens over the concatenated documents,
                               stride one segment L)
         or document_windows  (document-level samples: each document whole, or in consecutive pieces)
      -> HMTDataCollator      (pads a list of samples into `input_ids` / `attention_mask` / `labels` tensors)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from datasets import Dataset

TAIL_MODES = ("align", "short", "drop")


def _token_features():
    """int32 token ids: half the disk/RAM of the int64 a tokenizer returns; every known vocabulary fits."""
    from datasets import Features, List, Value

    return Features({"input_ids": List(Value("int32"))})


def _window_features():
    from datasets import Features, List, Value

    return Features({"input_ids": List(Value("int32")), "labels": List(Value("int32"))})


def tokenize_documents(
    dataset: Dataset,
    tokenizer,
    text_column: str = "text",
    add_eos: bool = True,
    add_special_tokens: bool = True,
    num_proc: int | None = None,
    batch_size: int = 64,
    desc: str | None = "Tokenizing documents",
) -> Dataset:
    """Tokenize every document whole: one row per document with column `input_ids` (int32), nothing truncated.

    Args:
        dataset: a `datasets.Dataset` with one document per row in `text_column`.
        tokenizer: any Hugging Face tokenizer.
        add_eos: append `tokenizer.eos_token_id` to each document (unless it already ends with it), so that
            documents stay separated once `group_into_windows` concatenates them.
        add_special_tokens: passed to the tokenizer (e.g. a BOS at the start of each document where the
            tokenizer adds one).
        num_proc: worker processes for `Dataset.map`.

    The tokenizer's "sequence length is longer than the specified maximum sequence length" warning is not
    raised: long documents are the point here, and the windows built from them are what the model sees.
    `Dataset.map(batched=True)` caches the result by fingerprint when `dataset` is file-backed.
    """
    if text_column not in dataset.column_names:
        raise ValueError(
            f"tokenize_documents: no column {text_column!r} in the dataset (columns: {dataset.column_names}); "
            "pass text_column=<the column holding the document text>."
        )
    eos_token_id = tokenizer.eos_token_id
    if add_eos and eos_token_id is None:
        raise ValueError(
            f"tokenize_documents: {type(tokenizer).__name__} has no eos_token, which separates documents once they "
            "are concatenated; set tokenizer.eos_token, or pass add_eos=False."
        )

    def tokenize(batch: dict[str, list]) -> dict[str, list[list[int]]]:
        # verbose=False is the tokenizer's own switch for the too-long-sequence warning.
        encoded = tokenizer(
            batch[text_column],
            add_special_tokens=add_special_tokens,
            truncation=False,
            return_attention_mask=False,
            verbose=False,
        )["input_ids"]
        if add_eos:
            encoded = [ids if ids and ids[-1] == eos_token_id else ids + [eos_token_id] for ids in encoded]
        return {"input_ids": encoded}

    return dataset.map(
        tokenize,
        batched=True,
        batch_size=batch_size,
        num_proc=num_proc,
        remove_columns=dataset.column_names,
        features=_token_features(),
        desc=desc,
    )


def _token_stream(tokenized: Dataset) -> np.ndarray:
    """All documents' `input_ids` concatenated in row order, as one int32 array (4 bytes per token)."""
    if "input_ids" not in tokenized.column_names:
        raise ValueError(
            f"expected a tokenized dataset with column 'input_ids' (columns: {tokenized.column_names}); "
            "run tokenize_documents(dataset, tokenizer) first."
        )
    # The arrow view follows the visible row order (after select/shuffle/train_test_split); zero-copy otherwise.
    column = tokenized.with_format("arrow")[:]["input_ids"]
    pieces = [chunk.flatten().to_numpy(zero_copy_only=False) for chunk in column.chunks]
    return np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.zeros(0, dtype=np.int32)


def window_starts(num_tokens: int, window_length: int, stride: int, tail: str = "align") -> list[tuple[int, int]]:
    """`(start, end)` of the windows `group_into_windows` cuts from a stream of `num_tokens` tokens.

    Full windows start at 0, stride, 2*stride, ... while they fit. The tail (tokens after the last full window):
    - "align": one more full window ending exactly at the last token (it overlaps its predecessor by more
      than usual); a stream shorter than one window becomes a single shorter window.
    - "short": one more window starting one stride after the last full one and ending at the last token
      (shorter than `window_length`; the collator pads it).
    - "drop": the tail (fewer than `stride` tokens, or the whole stream when it is shorter than one window) is
      dropped, like run_clm's `group_texts`; only when asked for.
    With "align" and "short" every token of the stream is in at least one window.
    """
    if window_length <= 0 or stride <= 0:
        raise ValueError(f"window_length ({window_length}) and stride ({stride}) must be positive.")
    if stride > window_length:
        raise ValueError(
            f"stride ({stride}) > window_length ({window_length}) would skip tokens between windows; "
            "use stride <= window_length (the paper: stride = one segment, window = bptt_depth segments)."
        )
    if tail not in TAIL_MODES:
        raise ValueError(f"tail must be one of {TAIL_MODES}, got {tail!r}.")
    if num_tokens == 0:
        return []
    if num_tokens < window_length:
        return [] if tail == "drop" else [(0, num_tokens)]
    last_full_start = (num_tokens - window_length) // stride * stride
    spans = [(start, start + window_length) for start in range(0, last_full_start + 1, stride)]
    if last_full_start + window_length < num_tokens:
        if tail == "align":
            spans.append((num_tokens - window_length, num_tokens))
        elif tail == "short":
            spans.append((last_full_start + stride, num_tokens))
    return spans


def group_into_windows(
    tokenized: Dataset,
    window_length: int,
    stride: int,
    tail: str = "align",
    batch_size: int = 256,
    desc: str | None = "Grouping into windows",
) -> Dataset:
    """The paper's training samples: windows of `window_length` tokens over the concatenated documents.

    Args:
        tokenized: output of `tokenize_documents` (column `input_ids`, one document per row, in order).
        window_length: tokens per sample, `bptt_depth * segment_length` in the paper (Section 4: e.g. 15 x 256).
        stride: distance between window starts, one segment (`segment_length`) in the paper.
        tail: what happens to the tokens after the last full window, see `window_starts`: "align" (default: a
            final full window aligned to the end of the stream, so no token is lost and every sample has the
            same length), "short" (a final shorter window), or "drop".

    Returns:
        A `Dataset` with columns `input_ids` and `labels` (an identical copy: the model shifts labels inside),
        one row per window, each `window_length` tokens long (only the "short" tail or a stream shorter than one
        window gives a shorter row).

    Memory: the concatenated stream is held once as int32 (4 bytes per token); windows are written by a batched
    `Dataset.map`, to a cache file next to `tokenized`'s when that is file-backed, so they are not all in RAM.
    """
    window_starts(0, window_length, stride, tail)  # validate the arguments before reading the tokens
    stream = _token_stream(tokenized)
    spans = window_starts(len(stream), window_length, stride, tail)
    return _slice_stream(tokenized, stream, spans, f"windows-{window_length}-{stride}-{tail}", batch_size, desc)


def document_windows(
    tokenized: Dataset,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 256,
    desc: str | None = "Document windows",
) -> Dataset:
    """Document-level samples: each document whole, or cut into consecutive pieces with nothing lost.

    Args:
        tokenized: output of `tokenize_documents`.
        max_length: None keeps each document whole (one row each; HMT takes any length). Otherwise each document
            is cut into pieces of at most `max_length` tokens starting at 0, stride, 2*stride, ... until the
            document's end is covered; the last piece may be shorter. Pieces never cross documents.
        stride: distance between piece starts, `max_length` by default (consecutive, non-overlapping pieces);
            smaller values give overlapping pieces.

    Returns:
        A `Dataset` with columns `input_ids` and `labels` (a copy).
    """
    if max_length is not None and max_length <= 0:
        raise ValueError(f"max_length must be positive or None, got {max_length}.")
    stride = max_length if stride is None else stride
    if max_length is not None and (stride <= 0 or stride > max_length):
        raise ValueError(
            f"stride ({stride}) must be in 1..max_length ({max_length}); a larger stride would skip tokens."
        )
    if "input_ids" not in tokenized.column_names:
        _token_stream(tokenized)  # raises the explanatory error

    def split(batch: dict[str, list]) -> dict[str, list]:
        pieces = []
        for ids in batch["input_ids"]:
            if max_length is None or len(ids) <= max_length:
                pieces.append(ids)
                continue
            start = 0
            while True:
                pieces.append(ids[start : start + max_length])
                if start + max_length >= len(ids):
                    break
                start += stride
        return {"input_ids": pieces, "labels": pieces}

    return tokenized.map(
        split,
        batched=True,
        batch_size=batch_size,
        remove_columns=tokenized.column_names,
        features=_window_features(),
        desc=desc,
    )


def _slice_stream(
    tokenized: Dataset, stream: np.ndarray, spans: list[tuple[int, int]], tag: str, batch_size: int, desc
) -> Dataset:
    """A `Dataset` of `stream[start:end]` for every span, written by a batched map (cached next to `tokenized`)."""
    import os

    from datasets import Dataset

    spans_dataset = Dataset.from_dict(
        {"start": [s for s, _ in spans], "end": [e for _, e in spans]},
    )

    def cut(batch: dict[str, list]) -> dict[str, list]:
        pieces = [stream[start:end] for start, end in zip(batch["start"], batch["end"])]
        return {"input_ids": pieces, "labels": pieces}

    # The map function closes over the whole stream; fingerprint it by its source instead of hashing the array.
    fingerprint = f"{tokenized._fingerprint}-{tag}"
    cache_file_name = None
    if tokenized.cache_files:
        cache_dir = os.path.dirname(tokenized.cache_files[0]["filename"])
        cache_file_name = os.path.join(cache_dir, f"cache-hmt-{fingerprint}.arrow")
    return spans_dataset.map(
        cut,
        batched=True,
        batch_size=batch_size,
        remove_columns=["start", "end"],
        features=_window_features(),
        new_fingerprint=fingerprint,
        cache_file_name=cache_file_name,
        desc=desc,
    )


@dataclass
class HMTDataCollator:
    """Pads a list of samples of different lengths into a batch for `HMTForCausalLM`.

    Each feature is a mapping with `input_ids` (list or 1-D tensor of ints) and optionally `labels` (same length;
    -100 = not scored) and `attention_mask`. Returns `input_ids` `(B, T)` long, `attention_mask` `(B, T)` long
    (1 = real token), `labels` `(B, T)` long (-100 at padding; a copy of `input_ids` where a feature has no
    labels), with T = the longest sample, rounded up to `pad_to_multiple_of`. Other features that hold one number
    per sample (e.g. a document index) are stacked into a `(B,)` tensor.

    Args:
        pad_token_id: id written at padded positions (masked out, never scored). Many causal LM tokenizers have
            none: set `tokenizer.pad_token = tokenizer.eos_token` and pass `tokenizer.pad_token_id`.
        padding_side: "right" (default; HMT's segments then start at the first real token of every row) or "left".
        label_pad_token_id: label at padded positions, -100 (ignored by the loss).
        pad_to_multiple_of: round the padded length up to a multiple of this (e.g. the segment length).

    Why not transformers' collators: `DataCollatorForLanguageModeling(mlm=False)` sets every label equal to the pad
    id to -100, and tokenizers without a pad token pad with EOS (SmolLM2's GGUF tokenizer: pad = EOS = 2), so the
    EOS targets between documents would silently leave the loss (`[5, 6, EOS, 7]` → labels `[5, 6, -100, 7]`);
    `DataCollatorForSeq2Seq` needs a tokenizer object and returns no labels for features without them, while HMT
    windows are often token ids alone and unlabeled features are scored on every token.
    """

    pad_token_id: int
    padding_side: str = "right"
    label_pad_token_id: int = -100
    pad_to_multiple_of: int | None = None

    def __post_init__(self):
        if self.pad_token_id is None:
            raise ValueError(
                "HMTDataCollator needs a pad_token_id; causal LM tokenizers often have no pad token: set "
                "`tokenizer.pad_token = tokenizer.eos_token` and pass `pad_token_id=tokenizer.pad_token_id` "
                "(padded positions are masked and get label -100, so the choice of id does not matter)."
            )
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}.")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of <= 0:
            raise ValueError(f"pad_to_multiple_of must be positive or None, got {self.pad_to_multiple_of}.")

    @classmethod
    def from_tokenizer(cls, tokenizer, **kwargs) -> HMTDataCollator:
        """A collator padding with `tokenizer.pad_token_id` (falling back to its EOS id when it has no pad token)."""
        pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(pad_token_id=pad_token_id, **kwargs)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("HMTDataCollator got an empty list of features.")
        rows = [torch.as_tensor(feature["input_ids"], dtype=torch.long).reshape(-1) for feature in features]
        length = max(len(row) for row in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch_size = len(rows)
        input_ids = torch.full((batch_size, length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch_size, length), dtype=torch.long)
        labels = torch.full((batch_size, length), self.label_pad_token_id, dtype=torch.long)
        for i, (feature, row) in enumerate(zip(features, rows)):
            n = len(row)
            where = slice(0, n) if self.padding_side == "right" else slice(length - n, length)
            input_ids[i, where] = row
            mask = feature.get("attention_mask")
            attention_mask[i, where] = 1 if mask is None else torch.as_tensor(mask, dtype=torch.long).reshape(-1)
            row_labels = feature.get("labels")
            if row_labels is None:
                labels[i, where] = row
            else:
                row_labels = torch.as_tensor(row_labels, dtype=torch.long).reshape(-1)
                if len(row_labels) != n:
                    raise ValueError(f"feature {i}: {len(row_labels)} labels for {n} input_ids.")
                labels[i, where] = row_labels
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        for key, value in features[0].items():
            scalar = isinstance(value, (int, float, bool, np.integer, np.floating))
            if key not in batch and scalar and all(key in feature for feature in features):
                batch[key] = torch.tensor([feature[key] for feature in features])
        return batch
