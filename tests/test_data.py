"""hmt_hf.data: tokenisation, training windows, document windows, the collator, document loading, offline corpora.

Real files in tmp_path and a real (tiny, word-level) tokenizer whose ids are known, so expected windows can be
written by hand.
"""

import logging

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hmt_hf.data import HMTDataCollator, document_windows, group_into_windows, tokenize_documents, window_starts

EOS, PAD = 1, 2


def word_tokenizer(model_max_length: int = 1_000_000) -> PreTrainedTokenizerFast:
    """Whitespace word-level tokenizer: "w{i}" -> id i + 3; [UNK]=0, <eos>=1, <pad>=2."""
    vocab = {"[UNK]": 0, "<eos>": EOS, "<pad>": PAD} | {f"w{i}": i + 3 for i in range(200)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="[UNK]",
        model_max_length=model_max_length,
    )  # fmt: skip


def words(first: int, count: int) -> str:
    return " ".join(f"w{i}" for i in range(first, first + count))


def ids(first: int, count: int) -> list[int]:
    return [i + 3 for i in range(first, first + count)]


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


@pytest.fixture
def three_docs(tokenizer):
    """Documents of 6, 3 and 1 words: stream = doc0 EOS doc1 EOS doc2 EOS (13 tokens)."""
    dataset = Dataset.from_dict({"text": [words(0, 6), words(10, 3), words(20, 1)]})
    return tokenize_documents(dataset, tokenizer)


# ---------------------------------------------------------------------------------------------------- tokenisation
def test_tokenize_documents_whole_with_eos_and_no_length_warning(caplog):
    tokenizer = word_tokenizer(model_max_length=4)  # every document below is "too long" for it
    dataset = Dataset.from_dict({"text": [words(0, 50), words(60, 7)], "title": ["a", "b"]})
    with caplog.at_level(logging.WARNING):
        tokenized = tokenize_documents(dataset, tokenizer)
    assert tokenized.column_names == ["input_ids"]
    assert tokenized[0]["input_ids"] == ids(0, 50) + [EOS]
    assert tokenized[1]["input_ids"] == ids(60, 7) + [EOS]
    assert not [r for r in caplog.records if "longer than the specified maximum" in r.getMessage()]
    without_eos = tokenize_documents(dataset, tokenizer, add_eos=False)
    assert without_eos[0]["input_ids"] == ids(0, 50)


def test_tokenize_documents_errors(tokenizer):
    with pytest.raises(ValueError, match=r"no column 'body'.*text_column="):
        tokenize_documents(Dataset.from_dict({"text": ["w1"]}), tokenizer, text_column="body")
    no_eos = word_tokenizer()
    no_eos.eos_token = None
    with pytest.raises(ValueError, match="add_eos=False"):
        tokenize_documents(Dataset.from_dict({"text": ["w1"]}), no_eos)


def test_tokenization_is_cached_for_file_backed_datasets(tmp_path, tokenizer):
    from datasets import load_dataset

    (tmp_path / "a.txt").write_text(words(0, 20))
    dataset = load_dataset("text", data_files=str(tmp_path / "a.txt"), sample_by="document", split="train",
                           cache_dir=str(tmp_path / "cache"))  # fmt: skip
    first = tokenize_documents(dataset, tokenizer)
    second = tokenize_documents(dataset, tokenizer)
    assert first.cache_files and first.cache_files == second.cache_files
    assert second[0]["input_ids"] == ids(0, 20) + [EOS]


# ---------------------------------------------------------------------------------------------------- windows
def test_window_starts_by_hand():
    # 13 tokens, windows of 4, stride 2: full windows at 0,2,4,6,8 (ends 12), token 12 left over.
    full = [(0, 4), (2, 6), (4, 8), (6, 10), (8, 12)]
    assert window_starts(13, 4, 2, "align") == full + [(9, 13)]
    assert window_starts(13, 4, 2, "short") == full + [(10, 13)]
    assert window_starts(13, 4, 2, "drop") == full
    assert window_starts(12, 4, 2, "align") == full  # exact fit: no extra window
    assert window_starts(3, 4, 2, "align") == [(0, 3)] == window_starts(3, 4, 2, "short")
    assert window_starts(3, 4, 2, "drop") == [] == window_starts(0, 4, 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"window_length": 4, "stride": 5}, "would skip tokens"),
        ({"window_length": 0, "stride": 1}, "must be positive"),
        ({"window_length": 4, "stride": 2, "tail": "pad"}, "tail must be one of"),
    ],
)
def test_window_argument_errors(three_docs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_into_windows(three_docs, **kwargs)


def test_group_into_windows_over_concatenated_documents(three_docs):
    stream = ids(0, 6) + [EOS] + ids(10, 3) + [EOS] + ids(20, 1) + [EOS]
    windows = group_into_windows(three_docs, window_length=4, stride=2)
    assert windows.column_names == ["input_ids", "labels"]
    got = windows["input_ids"][:]
    assert got == [stream[s:e] for s, e in [(0, 4), (2, 6), (4, 8), (6, 10), (8, 12), (9, 13)]]
    assert windows["labels"][:] == got
    assert all(len(row) == 4 for row in got)
    covered = {s + i for s, _ in window_starts(13, 4, 2) for i in range(4)}
    assert covered == set(range(len(stream)))  # no token lost
    short = group_into_windows(three_docs, window_length=4, stride=2, tail="short")["input_ids"][:]
    assert short[-1] == stream[10:]


def test_group_into_windows_follows_row_order_after_select(three_docs):
    reordered = three_docs.select([2, 0])
    windows = group_into_windows(reordered, window_length=5, stride=5)["input_ids"][:]
    stream = ids(20, 1) + [EOS] + ids(0, 6) + [EOS]
    assert windows == [stream[0:5], stream[4:9]]  # 9 tokens: one full window, the tail aligned to the end


def test_group_into_windows_paper_shape_on_many_tokens(tokenizer):
    # 41 documents of 97 words + EOS = 4,018 tokens; depth 3 x L 16: windows of 48, stride 16.
    # Full windows start at 0..3968 (249 of them, the last ends at 4016); 2 tokens remain -> one window [3970, 4018).
    dataset = Dataset.from_dict({"text": [words(i, 97) for i in range(41)]})
    tokenized = tokenize_documents(dataset, tokenizer)
    windows = group_into_windows(tokenized, window_length=48, stride=16)
    stream = [t for row in tokenized["input_ids"] for t in row]
    assert len(stream) == 4018 and len(windows) == 250
    assert windows[100]["input_ids"] == stream[1600:1648]
    assert windows[248]["input_ids"] == stream[3968:4016]
    assert windows[249]["input_ids"] == stream[3970:4018]
    assert {len(row) for row in windows["input_ids"]} == {48}


# ---------------------------------------------------------------------------------------------------- document windows
def test_document_windows_whole_and_split(three_docs):
    whole = document_windows(three_docs)
    assert whole["input_ids"][:] == three_docs["input_ids"][:] == whole["labels"][:]
    pieces = document_windows(three_docs, max_length=3)["input_ids"][:]
    doc0, doc1, doc2 = three_docs["input_ids"][:]
    assert pieces == [doc0[0:3], doc0[3:6], doc0[6:7], doc1[0:3], doc1[3:4], doc2]
    assert [t for p in pieces for t in p] == doc0 + doc1 + doc2  # every token, in order, no piece crosses docs
    overlapping = document_windows(three_docs, max_length=4, stride=2)["input_ids"][:]
    assert overlapping[:3] == [doc0[0:4], doc0[2:6], doc0[4:7]]
    with pytest.raises(ValueError, match="skip tokens"):
        document_windows(three_docs, max_length=3, stride=4)


# ---------------------------------------------------------------------------------------------------- collator
def test_collator_right_padding():
    collate = HMTDataCollator(pad_token_id=PAD)
    batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8], "labels": [-100]}, {"input_ids": [9, 10]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, PAD, PAD], [9, 10, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [-100, -100, -100], [9, 10, -100]]
    assert all(t.dtype == torch.long for t in batch.values())


def test_collator_left_padding_multiple_and_extra_scalars():
    collate = HMTDataCollator(pad_token_id=PAD, padding_side="left", pad_to_multiple_of=4)
    batch = collate([{"input_ids": [5, 6, 7], "doc": 0}, {"input_ids": torch.tensor([8]), "doc": 3}])
    assert batch["input_ids"].tolist() == [[PAD, 5, 6, 7], [PAD, PAD, PAD, 8]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 5, 6, 7], [-100, -100, -100, 8]]
    assert batch["doc"].tolist() == [0, 3]


def test_collator_errors(tokenizer):
    with pytest.raises(ValueError, match=r"tokenizer.pad_token = tokenizer.eos_token"):
        HMTDataCollator(pad_token_id=None)
    with pytest.raises(ValueError, match="padding_side"):
        HMTDataCollator(pad_token_id=0, padding_side="middle")
    with pytest.raises(ValueError, match="2 labels for 3 input_ids"):
        HMTDataCollator(pad_token_id=0)([{"input_ids": [1, 2, 3], "labels": [1, 2]}])
    assert HMTDataCollator.from_tokenizer(tokenizer).pad_token_id == PAD


def test_windows_through_collator_feed_the_model(three_docs):
    from conftest import make_hmt

    windows = group_into_windows(three_docs, window_length=12, stride=4, tail="short")
    batch = HMTDataCollator(pad_token_id=PAD)([windows[i] for i in range(len(windows))])
    assert batch["input_ids"].shape == (2, 12) and batch["attention_mask"][1].sum() == 9
    model = make_hmt()
    out = model(**batch)
    assert torch.isfinite(out.loss)
