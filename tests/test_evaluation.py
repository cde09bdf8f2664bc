"""The scoring interface, the baselines and the metric modules against hand-computed values on tiny models."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_hmt

from hmt_hf.evaluation import (
    ChunkedTransformer,
    FullContextTransformer,
    HMTScorer,
    RMTScorer,
    SlidingWindowTransformer,
    VanillaTransformer,
    hmt_overrides,
    make_samples,
)
from hmt_hf.evaluation.corpus import (
    EvalCorpus,
    byte_level_tokenizer,
    offsets_to_byte_lengths,
    token_byte_lengths,
)
from hmt_hf.evaluation.evaluator import HMTEvaluator, aggregate_records, load_metric

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return make_hmt()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 128, (2, 45), generator=torch.Generator().manual_seed(0))


def token_nll(backbone, window: torch.Tensor, position: int) -> torch.Tensor:
    """-log p(window[position] | window[:position]) from one plain forward pass of the backbone on `window` (B, n)."""
    with torch.no_grad():
        logits = backbone(window).logits
    return F.cross_entropy(logits[:, position - 1], window[:, position], reduction="none")


# ---------------------------------------------------------------------------------------------------- baselines
@pytest.mark.parametrize(("window", "stride", "pieces"), [(12, 5, 1024), (12, 11, 1024), (16, 4, 5)])
def test_sliding_window_equals_hand_computed_sum(model, ids, window, stride, pieces):
    """Every target scored exactly once, by the first window reaching past what earlier windows scored, with at
    least W - S tokens of context; values from full forward passes of the backbone on each window."""
    scorer = SlidingWindowTransformer(model, window, stride, max_logit_positions=pieces)
    scores = scorer.score(ids)
    total = ids.shape[1]
    expected = torch.zeros(ids.shape[0], total)
    scored_until, start = 1, 0
    while scored_until < total:
        end = min(start + window, total)
        for target in range(scored_until, end):
            if start > 0:
                assert target - start >= window - stride
            expected[:, target] = token_nll(model.backbone, ids[:, start:end], target - start)
        scored_until, start = end, start + stride
    assert scores.scored[:, 1:].all() and not scores.scored[:, 0].any()
    torch.testing.assert_close(scores.nll, expected, atol=2e-5, rtol=0)
    torch.testing.assert_close(scores.nll_sum(), expected.double().sum(1), atol=1e-4, rtol=0)


def test_sliding_window_first_target_skips_windows(model, ids):
    scorer = SlidingWindowTransformer(model, 12, 5)
    full, tail = scorer.score(ids), scorer.score(ids, first_target=37)
    assert tail.scored.sum().item() == 2 * 8
    torch.testing.assert_close(tail.nll[:, 37:], full.nll[:, 37:])
    assert tail.workload.passes < full.workload.passes


def test_chunked_equals_hand_sum_and_hmt_without_memory(model, ids):
    chunk = model.config.segment_length
    scores = ChunkedTransformer(model, chunk).score(ids)
    expected = torch.zeros(ids.shape[0], ids.shape[1])
    for target in range(1, ids.shape[1]):
        start = (target - 1) // chunk * chunk  # the chunk of the predicting position
        window = ids[:, start : start + chunk]
        with torch.no_grad():
            logits = model.backbone(window).logits[:, target - 1 - start]
        expected[:, target] = F.cross_entropy(logits, ids[:, target], reduction="none")
    torch.testing.assert_close(scores.nll, expected, atol=2e-5, rtol=0)
    with torch.no_grad():
        loss = model(ids, labels=ids, use_memory=False).loss
    assert abs(scores.nll_sum().sum().item() / scores.num_scored().sum().item() - loss.item()) < 1e-5


@pytest.mark.parametrize("fields", [{}, {"retrieval_mode": "causal"}])
@pytest.mark.parametrize("max_logit_positions", [8, 16, 4096])
def test_hmt_scorer_equals_one_forward_call(fields, max_logit_positions, ids):
    model = make_hmt(**fields)
    scorer = HMTScorer(model, max_logit_positions=max_logit_positions)
    scores = scorer.score(ids)
    with torch.no_grad():
        out = model(ids, labels=ids)
    expected = F.cross_entropy(out.logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    torch.testing.assert_close(scores.nll[:, 1:], expected, atol=1e-5, rtol=0)
    assert abs(scores.nll_sum().sum().item() / scores.num_scored().sum().item() - out.loss.item()) < 1e-5
    tail = scorer.score(ids, first_target=33)  # the paper protocol's last segment: prefix without LM head
    assert tail.num_scored().tolist() == [12, 12]
    torch.testing.assert_close(tail.nll[:, 33:], scores.nll[:, 33:], atol=1e-6, rtol=0)
    assert tail.workload.logit_positions < scores.workload.logit_positions


def test_rmt_is_a_config_switch_on_the_same_weights(model, ids):
    rmt_model = make_hmt(use_memory_search=False, use_sensory_memory=False)
    expected = HMTScorer(rmt_model).score(ids)
    scores = RMTScorer(model).score(ids)
    torch.testing.assert_close(scores.nll, expected.nll, atol=1e-5, rtol=0)
    # The switch is undone afterwards, and HMT differs from RMT.
    assert model.config.use_memory_search and model.config.use_sensory_memory
    assert model.memory.sensory_memory.size == model.config.sensory_memory_size
    assert (HMTScorer(model).score(ids).nll - scores.nll).abs().max() > 1e-3


def test_overrides_validate_and_restore(model):
    with pytest.raises(ValueError, match="sensory_memory_size"):
        with hmt_overrides(model, sensory_memory_size=10_000):
            pass
    assert model.config.sensory_memory_size == 3
    with pytest.raises(ValueError, match="segment_length"):
        HMTScorer(model, overrides={"segment_length": 4})


def test_vanilla_scores_only_kept_tokens_and_counts_the_rest(model, ids):
    length = 20
    for strategy, kept in (("head", slice(0, length)), ("tail", slice(ids.shape[1] - length, None))):
        scores = VanillaTransformer(model, max_length=length, truncation_strategy=strategy).score(ids)
        assert scores.num_scored().tolist() == [length - 1] * 2
        assert scores.num_unscored().tolist() == [ids.shape[1] - 1 - (length - 1)] * 2
        alone = FullContextTransformer(model).score(ids[:, kept])
        torch.testing.assert_close(scores.nll[:, kept][:, 1:], alone.nll[:, 1:], atol=1e-5, rtol=0)


def test_full_context_matches_backbone_and_refuses_long_inputs(model, ids):
    scores = FullContextTransformer(model, max_logit_positions=7).score(ids)  # KV-cache pieces of 7 positions
    with torch.no_grad():
        logits = model.backbone(ids).logits
    expected = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    torch.testing.assert_close(scores.nll[:, 1:], expected, atol=2e-5, rtol=0)
    too_long = torch.randint(3, 128, (1, model.backbone.config.max_position_embeddings + 1))
    with pytest.raises(ValueError, match="exceeds this model's maximum.*SlidingWindowTransformer"):
        FullContextTransformer(model).score(too_long)


def test_padded_rows_score_like_alone(model, ids):
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    for scorer in (HMTScorer(model), SlidingWindowTransformer(model, 12, 5), ChunkedTransformer(model, 8)):
        padded = scorer.score(ids, attention_mask=mask)
        alone = scorer.score(ids[:1, 7:])
        torch.testing.assert_close(padded.nll[0, 7:], alone.nll[0], atol=1e-5, rtol=0)
        assert padded.num_scored().tolist() == [ids.shape[1] - 8, ids.shape[1] - 1]


def test_bad_arguments_are_refused(model, ids):
    with pytest.raises(ValueError, match="stride=12 must be smaller than window_size=12"):
        SlidingWindowTransformer(model, 12, 12)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        SlidingWindowTransformer(model, 1000, 10)
    with pytest.raises(ValueError, match="truncation_strategy"):
        VanillaTransformer(model, 16, "middle")
    with pytest.raises(ValueError, match="first_target"):
        ChunkedTransformer(model, 8).score(ids, first_target=0)
    with pytest.raises(TypeError, match="HMTForCausalLM"):
        HMTScorer(model.backbone)


# ---------------------------------------------------------------------------------------------------- protocol
def test_paper_protocol_samples():
    stream = torch.arange(200)
    samples = make_samples(stream, test_length=32, segment_length=16, protocol="last_segment", num_samples=3)
    assert [s.start for s in samples] == [0, 16, 32]  # stride L
    assert all(s.input_ids.numel() == 48 and s.first_target == 33 and s.num_targets == 15 for s in samples)
    assert torch.equal(samples[2].input_ids, stream[32:80])
    every = make_samples(stream, 32, 16, protocol="all_tokens")
    assert [s.start for s in every] == [0, 48, 96, 144] and every[0].first_target == 1
    with pytest.raises(ValueError, match="needs a token stream at least that long; this one has 200"):
        make_samples(stream, 300, 16)
    with pytest.raises(ValueError, match="protocol"):
        make_samples(stream, 32, 16, protocol="last_token")


# ---------------------------------------------------------------------------------------------------- metrics
def test_metric_modules_against_hand_values():
    perplexity = load_metric("perplexity").compute(nll_sum=[2.0, 3.0, 0.0], num_tokens=[1, 2, 0])
    assert perplexity["perplexity"] == pytest.approx(math.exp(5 / 3))
    assert perplexity["mean_nll"] == pytest.approx(5 / 3)
    assert perplexity["mean_sample_perplexity"] == pytest.approx((math.exp(2) + math.exp(1.5)) / 2)
    assert perplexity["num_tokens"] == 3 and perplexity["num_rows"] == 2

    # 3 tokens covering 4 UTF-8 bytes ("é" is 2 bytes): BPB = NLL / (ln 2 * bytes), not loss / ln 2.
    nll = [0.5, 1.25, 2.0]
    bits = load_metric("bits_per_byte").compute(nll_sum=nll, num_bytes=[1, 2, 1])
    assert bits["bits_per_byte"] == pytest.approx(sum(nll) / (math.log(2) * 4))
    assert bits["bits_per_byte"] != pytest.approx(sum(nll) / 3 / math.log(2))

    top_k = load_metric("top_k_accuracy").compute(target_rank=[0, 3, 1, 7, 0], k=[1, 2, 5])
    assert top_k == {"top_1_accuracy": 0.4, "top_2_accuracy": 0.6, "top_5_accuracy": 0.8, "num_tokens": 5}

    with pytest.raises(ValueError, match="no scored tokens"):
        load_metric("perplexity").compute(nll_sum=[0.0], num_tokens=[0])
    with pytest.raises(ValueError, match="0 bytes"):
        load_metric("bits_per_byte").compute(nll_sum=[1.0], num_bytes=[0])
    with pytest.raises(ValueError, match="k="):
        load_metric("top_k_accuracy").compute(target_rank=[0], k=0)
    with pytest.raises(ValueError, match="Unknown metric"):
        load_metric("bleu")


def test_metric_modules_load_with_evaluate_by_path():
    import evaluate

    from hmt_hf.evaluation.evaluator import METRICS_DIR

    for name in ("perplexity", "bits_per_byte", "top_k_accuracy"):
        module = evaluate.load(str(METRICS_DIR / name))
        assert module.name == name


def test_ranks_and_top_k_from_logits(model, ids):
    scores = FullContextTransformer(model).score(ids)
    with torch.no_grad():
        logits = model.backbone(ids).logits[:, :-1]
    top5 = logits.topk(5, dim=-1).indices
    hits = (top5 == ids[:, 1:, None]).any(-1)
    result = aggregate_records(
        [
            {
                "nll_sum": 1.0,
                "num_tokens": int(scores.num_scored()[r]),
                "num_unscored": 0,
                "num_bytes": None,
                "rank_counts": scores.rank_counts()[r].tolist(),
            }
            for r in range(2)
        ],
        top_k=(1, 5),
    )
    assert result["top_5_accuracy"] == pytest.approx(hits.float().mean().item())
    assert result["top_1_accuracy"] == pytest.approx((logits.argmax(-1) == ids[:, 1:]).float().mean().item())


# ---------------------------------------------------------------------------------------------------- bytes
def test_byte_lengths_of_text():
    tokenizer = byte_level_tokenizer()
    text = "Héllo wörld — 😀 naïve"
    encoding = tokenizer(text, return_offsets_mapping=True)
    lengths = offsets_to_byte_lengths(text, encoding["offset_mapping"])
    assert lengths.sum() == len(text.encode("utf-8"))
    exact, method = token_byte_lengths(tokenizer, encoding["input_ids"])
    assert method == "byte_level" and exact.tolist() == [1] * len(encoding["input_ids"])
    corpus = EvalCorpus.from_texts([text, "abc"], tokenizer)
    assert corpus.num_documents == 2
    assert int(corpus.byte_lengths.sum()) == len(text.encode("utf-8")) + 3  # the EOS separators count 0 bytes
    assert corpus.token_ids[len(encoding["input_ids"])] == tokenizer.eos_token_id


def test_bits_per_byte_end_to_end(model):
    """Byte-level tokens are one byte each, so BPB = loss / ln 2 here exactly; the evaluator computes it from the
    bytes of the scored tokens, with and without memory."""
    tokenizer = byte_level_tokenizer()
    corpus = EvalCorpus.from_texts(["The quick brown fox jumps over the lazy dog. " * 3], tokenizer)
    ids = corpus.token_ids[:40].remainder(128)[None]  # the tiny model has 128 tokens
    evaluator = HMTEvaluator(model, tokenizer=tokenizer, progress=False)
    batch = [{"input_ids": ids, "byte_lengths": torch.ones_like(ids)}]
    for use_memory in (True, False):
        result = evaluator.evaluate_bits_per_byte(batch, use_memory=use_memory)
        assert result["num_scored_tokens"] == 39
        assert result["bits_per_byte"] == pytest.approx(result["loss"] / math.log(2))
        assert result["retrieval_mode"] == ("paper" if use_memory else None)
    base = evaluator.evaluate_bits_per_byte(batch)
    doubled = evaluator.evaluate_bits_per_byte([{"input_ids": ids, "byte_lengths": 2 * torch.ones_like(ids)}])
    assert doubled["bits_per_byte"] == pytest.approx(base["bits_per_byte"] / 2)
    with pytest.raises(ValueError, match="byte_lengths"):
        HMTEvaluator(model, progress=False).evaluate_bits_per_byte([{"input_ids": ids}])


def test_scoring_restores_training_mode(ids):
    model = make_hmt("gpt2")  # GPT-2 has dropout 0.1: scores in training mode would be random
    reference = HMTScorer(model).score(ids)
    model.train()
    scores = HMTScorer(model).score(ids)
    assert model.training and model.backbone.training  # put back as it was
    torch.testing.assert_close(scores.nll, reference.nll)  # scored in eval mode (no dropout)


@torch.no_grad()
def test_memory_diagnostics_describe_the_retrieval_and_the_memory_slot():
    """The numbers the memory reports explain a result with: retrieval weights (entropy, largest weight, how often the
    oldest memory wins), memory norms at the token scale (normalize_memory), attention on the first positions."""
    from hmt_hf.evaluation import comparison

    model = make_hmt("llama", num_memory_embeddings=6)
    sample = torch.randint(3, 128, (48,), generator=torch.Generator().manual_seed(2))
    nll = comparison.token_nll(ChunkedTransformer(model.backbone, 8), sample)
    found = comparison.memory_diagnostics(model, sample, {"chunked": [nll]})
    assert 0 < found["retrieval_weight_entropy_normalized_mean"] <= 1
    assert 1 / 6 <= found["retrieval_max_weight_mean"] <= 1
    assert 0 <= found["retrieval_oldest_is_max_fraction"] <= 1
    assert 0 < found["memory_spread"] < 2 and 0 < found["segment_last_token_spread"] < 2
    assert -1 <= found["memory_key_cosine_consecutive_mean"] < 1 and -1 <= found["memory_cosine_to_first_mean"] < 1
    same = torch.stack([model.memory.memory_search.initial_memory.detach()] * 4)
    assert comparison.memory_similarity(model, sample, same)["memory_spread"] == 0
    assert comparison.memory_similarity(model, sample, same[:2]) == {}  # too few memories to compare
    assert found["search_temperature"] == pytest.approx(10.0)
    token_norm = model.get_input_embeddings().weight.norm(dim=-1).mean().item()
    assert found["memory_embedding_norm_mean"] == pytest.approx(token_norm, rel=0.2)
    attention = found["attention_to_first_positions"]
    assert 0 < attention["hmt"]["position_1"] < 1 and len(found["per_segment_perplexity"]["chunked"]) == 6
    assert 0 < attention["hmt"]["sensory_token_mean"] < 1
    # the strongest head reads position 1 at least as much as the mean
    layer, head = attention["hmt"]["position_1_top_head_index"]
    assert attention["hmt"]["position_1"] <= attention["hmt"]["position_1_top_head"] <= 1
    config = model.backbone.config
    assert 0 <= layer < config.num_hidden_layers and 0 <= head < config.num_attention_heads
    ablated = found["perplexity_ablations"]  # each ablation changes the prediction; the model is left as it was
    assert len({ablated["as_trained"], ablated["memory_slot_zeroed"], ablated["no_sensory_memory"]}) == 3
    assert comparison.ablations(model, sample)["as_trained"] == ablated["as_trained"]
