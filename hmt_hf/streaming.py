"""Unbounded input: feed an HMT a token stream or a text file of any size, chunk by chunk, with bounded memory.

`HMTStream` keeps only what the next chunk needs: at most one chunk of pending token ids, the model's memory state
(N memory embeddings and the last few token embeddings) and the previous chunk's last logits (to score the target
that crosses a chunk boundary). Chunks are whole multiples of the segment length, so scoring a stream gives exactly
the per-token losses of one forward call over the whole text, however it arrives.

    stream = HMTStream(model)
    for piece in pieces:                    # ids from anywhere: a socket, a generator, a tokenised file
        stream.feed(piece)
    result = stream.finish()                # StreamScore: perplexity, bits per token (and per byte for text)
    stream.get_memory_stats()

    HMTStream(model).score_text_file("book.txt", tokenizer)   # tokenised piece by piece, never read whole

Only torch and transformers are imported, like the model files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .memory_hmt import HMTMemoryState


@dataclass
class StreamScore:
    """Summed negative log-likelihood over the scored targets of a stream.

    Every token but the first of the stream is a target (the first has no context), so `num_targets` is the number
    of tokens fed minus one. `num_bytes` is the UTF-8 size of the scored text when the stream came from text.
    """

    nll_sum: float = 0.0
    num_targets: int = 0
    num_tokens: int = 0
    num_bytes: int | None = None

    @property
    def loss(self) -> float:
        """Mean NLL per target token, in nats."""
        return self.nll_sum / self.num_targets if self.num_targets else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.num_targets else float("nan")

    @property
    def bits_per_token(self) -> float:
        return self.loss / math.log(2)

    @property
    def bits_per_byte(self) -> float | None:
        """Total NLL in bits over the UTF-8 bytes of the text (not loss / ln 2, which is bits per token)."""
        if not self.num_bytes:
            return None
        return self.nll_sum / (math.log(2) * self.num_bytes)

    def to_dict(self) -> dict:
        return {
            "nll_sum": self.nll_sum,
            "num_targets": self.num_targets,
            "num_tokens": self.num_tokens,
            "num_bytes": self.num_bytes,
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_token": self.bits_per_token,
            "bits_per_byte": self.bits_per_byte,
        }


class HMTStream:
    """Score or consume one unbounded token stream with an [`HMTForCausalLM`], chunk by chunk.

    Args:
        model: the HMT. Its weights are not changed; calls run under `torch.inference_mode()`.
        chunk_segments: segments per forward call (default: the config's `representation_batch_size`, else 16).
            A call's peak memory grows with its chunk, not with the stream.
        score: if False the stream is only read into memory (no loss, no LM head except the last position).
        memory: an `HMTMemoryState` of batch size 1 to continue from (default: empty memory).
    """

    def __init__(self, model, chunk_segments: int | None = None, score: bool = True, memory=None):
        if chunk_segments is None:
            chunk_segments = model.config.representation_batch_size or 16
        if chunk_segments < 1:
            raise ValueError(f"chunk_segments={chunk_segments} must be >= 1.")
        self.model = model
        self.chunk_size = chunk_segments * model.config.segment_length
        self.scoring = score
        self._initial_memory = memory
        self.clear_memory()

    # ------------------------------------------------------------------ state
    def clear_memory(self):
        """Start a new stream: forget memory, pending tokens and the running score."""
        self.memory: HMTMemoryState = (
            self._initial_memory if self._initial_memory is not None else self.model.empty_memory(1)
        )
        if self.memory.batch_size != 1:
            raise ValueError(f"HMTStream reads one stream; memory holds {self.memory.batch_size} sequences.")
        self.score = StreamScore()
        self._pending: list[int] = []
        self._last_logits: torch.Tensor | None = None
        self._finished = False

    def get_memory_stats(self) -> dict:
        """The model's memory statistics for this stream, plus tokens read, pending and scored."""
        return {
            **self.model.get_memory_stats(self.memory),
            "tokens_processed": self.score.num_tokens,
            "tokens_pending": len(self._pending),
            "targets_scored": self.score.num_targets,
        }

    # ------------------------------------------------------------------ feeding
    def feed(self, token_ids: Sequence[int] | torch.Tensor, num_bytes: int | None = None) -> StreamScore:
        """Append token ids (a list or a 1-D tensor) and process every full chunk now available.

        Returns the running [`StreamScore`]. `num_bytes`: UTF-8 bytes of the text these ids encode, for
        bits-per-byte.
        """
        if self._finished:
            raise RuntimeError("This stream was finished; call clear_memory() to start a new one.")
        if isinstance(token_ids, torch.Tensor):
            if token_ids.dim() != 1:
                raise ValueError(f"feed() takes a 1-D sequence of token ids, got shape {tuple(token_ids.shape)}.")
            token_ids = token_ids.tolist()
        self._pending.extend(int(token) for token in token_ids)
        if num_bytes is not None:
            self.score.num_bytes = (self.score.num_bytes or 0) + num_bytes
        while len(self._pending) >= self.chunk_size:
            chunk, self._pending = self._pending[: self.chunk_size], self._pending[self.chunk_size :]
            self._process(chunk)
        return self.score

    def finish(self) -> StreamScore:
        """Process the pending tail (a partial chunk) and return the final score. No token is left unread."""
        if self._pending:
            self._process(self._pending)
            self._pending = []
        self._finished = True
        return self.score

    def score_tokens(self, tokens: Iterable[int] | Iterable[Sequence[int]], progress: bool = False) -> StreamScore:
        """Score a whole stream of ids: an iterable of ints or of id sequences (read lazily, never held whole)."""
        self.clear_memory()
        with tqdm(desc="tokens", unit="tok", disable=not progress) as bar:
            for piece in _pieces(tokens, self.chunk_size):
                self.feed(piece)
                bar.update(len(piece))
        return self.finish()

    def score_text_file(
        self, path: str | os.PathLike, tokenizer, chunk_chars: int = 1 << 20, progress: bool = True
    ) -> StreamScore:
        """Score a UTF-8 text file of any size: read and tokenised `chunk_chars` characters at a time.

        Pieces are cut only where tokenisation cannot change (see [`iter_text_file_ids`]), so the ids equal those of
        the whole file tokenised at once. The score includes `bits_per_byte` over the file's UTF-8 bytes.
        """
        self.clear_memory()
        with tqdm(total=os.path.getsize(path), desc=os.path.basename(path), unit="B", unit_scale=True,
                  disable=not progress) as bar:  # fmt: skip
            for ids, num_bytes in iter_text_file_ids(path, tokenizer, chunk_chars):
                self.feed(ids, num_bytes=num_bytes)
                bar.update(num_bytes)
        return self.finish()

    @torch.inference_mode()
    def _process(self, chunk: list[int]):
        """One forward call over `chunk`: its summed in-chunk NLL, plus the target that crossed from the last chunk."""
        device = self.model.get_input_embeddings().weight.device
        ids = torch.tensor([chunk], device=device)
        if not self.scoring:
            self.memory = self.model(ids, memory=self.memory, logits_to_keep=1).memory
            self.score.num_tokens += len(chunk)
            return
        # num_items_in_batch=1 makes the loss the sum over the chunk's targets (positions 1..len-1); every target is
        # scored, whatever the training loss of the model is (loss_on_last_segment_only).
        config = self.model.config
        training_rule, config.loss_on_last_segment_only = config.loss_on_last_segment_only, False
        try:
            out = self.model(ids, labels=ids, memory=self.memory, logits_to_keep=1, num_items_in_batch=1)
        finally:
            config.loss_on_last_segment_only = training_rule
        nll = out.loss.double()
        targets = len(chunk) - 1
        if self._last_logits is not None:
            nll = nll - F.log_softmax(self._last_logits.double(), dim=-1)[chunk[0]]
            targets += 1
        self.score.nll_sum += float(nll)
        self.score.num_targets += targets
        self.score.num_tokens += len(chunk)
        self.memory, self._last_logits = out.memory, out.logits[0, -1]


def _pieces(tokens: Iterable, size: int) -> Iterator[list[int]]:
    """Group a stream of ints, or pass through a stream of id sequences, as lists of ids."""
    buffer: list[int] = []
    for item in tokens:
        if isinstance(item, (int, torch.Tensor)) and (not isinstance(item, torch.Tensor) or item.dim() == 0):
            buffer.append(int(item))
            if len(buffer) >= size:
                yield buffer
                buffer = []
        else:
            if buffer:
                yield buffer
                buffer = []
            yield [int(token) for token in item]
    if buffer:
        yield buffer


def iter_text_file_ids(path: str | os.PathLike, tokenizer, chunk_chars: int = 1 << 20) -> Iterator[tuple[list, int]]:
    """Token ids of a UTF-8 text file, `chunk_chars` characters at a time: yields `(ids, utf8_bytes_of_piece)`.

    A piece ends just before a single whitespace character that sits between two non-whitespace characters
    (`"word| word"`, `"word|\\nword"`). Byte-level BPE tokenizers (GPT-2, Llama-3, Qwen, SmolLM2) attach such a
    whitespace to the following word and never merge across it, so the concatenated ids equal the whole file's.
    A piece with no such place is extended until one appears: nothing is ever cut inside a word. The tokenizer's
    special tokens (e.g. BOS) are added once, at the start of the file, if it adds them to ordinary calls.
    """
    prefix = _leading_special_ids(tokenizer)
    carry = ""
    with open(path, encoding="utf-8") as handle:
        while True:
            block = handle.read(chunk_chars)
            text = carry + block
            cut = len(text) if not block else _safe_cut(text)
            if cut <= 0 and block:
                carry = text
                continue
            piece, carry = text[:cut], text[cut:]
            if piece:
                ids = prefix + tokenizer(piece, add_special_tokens=False)["input_ids"]
                prefix = []
                yield ids, len(piece.encode("utf-8"))
            if not block:
                return


def _safe_cut(text: str) -> int:
    """Largest index `i` with `text[i]` a lone whitespace between non-whitespace characters, or 0 if none."""
    for i in range(len(text) - 2, 0, -1):
        if text[i].isspace() and not text[i - 1].isspace() and not text[i + 1].isspace():
            return i
    return 0


def _leading_special_ids(tokenizer) -> list[int]:
    """The ids the tokenizer puts before the text of an ordinary call (e.g. `[bos]`), or []."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    return full[: len(full) - len(plain)] if full[len(full) - len(plain) :] == plain else []
