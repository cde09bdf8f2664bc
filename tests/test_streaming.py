"""HMTStream: chunk-by-chunk scoring of unbounded input equals one forward call, with bounded buffering."""

import itertools
import math

import pytest
import torch
from conftest import SMALL_HMT, make_hmt
from tiny_backbones import tiny_config
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from hmt_hf import HMTForCausalLM
from hmt_hf.streaming import HMTStream, StreamScore, iter_text_file_ids


def full_nll(model, ids: torch.Tensor) -> float:
    """Summed NLL of targets 1..T-1 from one forward call with full logits (the reference)."""
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    return float(-torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).sum())


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
@pytest.mark.parametrize("pieces", [[61], [5, 1, 30, 25], [16, 16, 16, 13]])
def test_stream_score_equals_one_forward(model_type, pieces):
    model = make_hmt(model_type)
    ids = torch.randint(0, 100, (1, sum(pieces)), generator=torch.Generator().manual_seed(1))
    stream = HMTStream(model, chunk_segments=2)  # 16-token chunks: several calls and a partial tail
    start = 0
    for size in pieces:
        stream.feed(ids[0, start : start + size])
        start += size
    score = stream.finish()
    assert score.num_targets == ids.shape[1] - 1 and score.num_tokens == ids.shape[1]
    assert score.nll_sum == pytest.approx(full_nll(model, ids), rel=1e-5)
    assert score.perplexity == pytest.approx(math.exp(score.nll_sum / score.num_targets))
    # The memory after the stream equals the memory of one call over the same tokens.
    with torch.no_grad():
        one_call = model(ids).memory
    torch.testing.assert_close(stream.memory.memories, one_call.memories, atol=1e-5, rtol=1e-5)
    assert stream.get_memory_stats()["num_segments_processed"] == math.ceil(ids.shape[1] / 8)


def test_stream_reads_lazily_and_buffers_at_most_one_chunk():
    model = make_hmt()
    stream = HMTStream(model, chunk_segments=2)
    pulled = []

    def endless():
        generator = torch.Generator().manual_seed(0)
        while True:
            token = int(torch.randint(0, 100, (1,), generator=generator))
            pulled.append(token)
            assert len(pulled) - stream.score.num_tokens <= stream.chunk_size, "the stream read ahead unboundedly"
            yield token

    score = stream.score_tokens(itertools.islice(endless(), 200))
    assert score.num_tokens == 200 and score.num_targets == 199
    stats = stream.get_memory_stats()
    assert stats["cache_size"] == model.config.num_memory_embeddings  # FIFO full, not growing
    assert stats["tokens_pending"] == 0 and stats["num_segments_processed"] == 25
    assert stream.score.nll_sum == pytest.approx(full_nll(model, torch.tensor([pulled])), rel=1e-5)


def test_consume_only_then_generate_from_memory():
    """Read a long context into memory without scoring, then generate conditioned on that memory."""
    model = make_hmt(retrieval_mode="causal")
    context = torch.randint(0, 100, (1, 48), generator=torch.Generator().manual_seed(2))
    prompt = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(3))
    stream = HMTStream(model, chunk_segments=2, score=False)
    stream.feed(context[0])
    stream.finish()
    assert stream.score.num_targets == 0 and stream.score.num_tokens == 48
    with torch.no_grad():
        reference = model(torch.cat([context, prompt], 1)).logits[:, -1]
        out = model.generate(prompt, memory=stream.memory, max_new_tokens=1, do_sample=False)
    assert int(out[0, -1]) == int(reference.argmax(-1))


def test_stream_errors():
    model = make_hmt()
    with pytest.raises(ValueError, match="chunk_segments"):
        HMTStream(model, chunk_segments=0)
    with pytest.raises(ValueError, match="one stream"):
        HMTStream(model, memory=model.empty_memory(2))
    stream = HMTStream(model)
    with pytest.raises(ValueError, match="1-D"):
        stream.feed(torch.zeros(2, 3, dtype=torch.long))
    stream.feed([1, 2, 3])
    stream.finish()
    with pytest.raises(RuntimeError, match="clear_memory"):
        stream.feed([1])
    stream.clear_memory()
    assert stream.feed([1, 2]).num_tokens == 0  # pending, not yet a full chunk


def test_bits_per_byte_is_total_nll_over_bytes():
    score = StreamScore(nll_sum=100.0, num_targets=50, num_tokens=51, num_bytes=200)
    assert score.bits_per_byte == pytest.approx(100.0 / (math.log(2) * 200))
    assert score.bits_per_token == pytest.approx(2.0 / math.log(2))


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A real byte-level BPE tokenizer (GPT-2 style pre-tokenisation) trained on a few sentences."""
    from tokenizers import trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["the cat sat on the mat\n\n  indented line", "déjà vu über naïve"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_text_file_pieces_tokenise_like_the_whole_file(tmp_path):
    tokenizer = byte_level_tokenizer()
    text = ("the cat sat on the mat\n\n  indented line, déjà vu über naïve.\n" * 40) + "tail"
    path = tmp_path / "doc.txt"
    path.write_text(text, encoding="utf-8")
    pieces = list(iter_text_file_ids(path, tokenizer, chunk_chars=37))
    assert len(pieces) > 10
    assert sum((ids for ids, _ in pieces), []) == tokenizer(text)["input_ids"]
    assert sum(n for _, n in pieces) == len(text.encode("utf-8"))

    config = tiny_config("llama")
    config.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    model = HMTForCausalLM.from_backbone(AutoModelForCausalLM.from_config(config), **SMALL_HMT).eval()
    score = HMTStream(model, chunk_segments=2).score_text_file(path, tokenizer, chunk_chars=37, progress=False)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    assert score.num_bytes == len(text.encode("utf-8"))
    assert score.nll_sum == pytest.approx(full_nll(model, ids), rel=1e-5)
