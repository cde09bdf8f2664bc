"""HMTForCausalLM against a direct, unbatched reading of Eq. 1-5, and its features."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import SMALL_HMT, make_hmt
from tiny_backbones import tiny_config
from transformers import AutoModelForCausalLM

from hmt_hf import HMTConfig, HMTForCausalLM
from hmt_hf.evaluation.baselines import hmt_overrides


def reference_hmt_logits(model, ids):
    """HMT for one sequence `ids` `(T,)`, written as plainly as the paper: one backbone call per step, no batching,
    no packing, Python lists for the cache."""
    config, backbone, memory = model.config, model.backbone, model.memory
    embed = model.get_input_embeddings()
    length, j, k, capacity = (
        config.segment_length,
        config.representation_length,
        config.sensory_memory_size if config.use_sensory_memory else 0,
        config.num_memory_embeddings,
    )
    prompt = memory.representation_encoder.summary_prompt[None]
    # The attention sink (default) starts every pass with the embedding of the sink token; none in the paper layout.
    sink = embed(torch.tensor([config.resolved_sink_token_id]))[: int(config.attention_sink)]
    initial = memory.memory_search.initial_memory
    cache, logits = [], []
    for start in range(0, len(ids), length):
        segment = ids[start : start + length]
        if not config.use_memory_search:
            retrieved = cache[-1] if cache else initial
        elif not cache:
            retrieved = initial
        else:
            read = segment[:j] if config.retrieval_mode == "paper" else ids[start - j : start]
            encoded = backbone(
                inputs_embeds=torch.cat([sink, prompt, embed(read), prompt])[None], output_hidden_states=True
            )
            query = encoded.hidden_states[-1][0, -1]  # Eq. 1
            stored = torch.stack(cache)
            q, keys = memory.memory_search.query_proj(query), memory.memory_search.key_proj(stored)
            if config.normalize_memory:  # τ · cos(Q, K)
                scores = F.cosine_similarity(q[None], keys, dim=-1) * memory.memory_search.log_temperature.exp()
            else:
                scores = q @ keys.T / math.sqrt(config.search_dim)
            retrieved = torch.softmax(scores, -1) @ stored  # Eq. 2-3
        sensory = embed(ids[max(0, start - k) : start])  # Eq. 4
        augmented = torch.cat([sink, retrieved[None], sensory, embed(segment), retrieved[None]])
        out = backbone(inputs_embeds=augmented[None], output_hidden_states=True)
        first = len(sink) + 1 + len(sensory)
        logits.append(out.logits[0, first : first + len(segment)])
        new = out.hidden_states[-1][0, -1]  # Eq. 5
        if config.memory_readout == "segment_mean":  # the mean final state over the segment's tokens
            new = out.hidden_states[-1][0, first : first + len(segment)].mean(0)
        if config.normalize_memory:  # g ⊙ h / rms(h)
            new = memory.memory_embedding_generator.memory_gain * new / new.pow(2).mean().add(1e-6).sqrt()
        cache = (cache + [new])[-capacity:]  # FIFO of N
    return torch.cat(logits)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"attention_sink": False, "normalize_memory": False},  # Eq. 1-5 exactly: the memory slot at position 0
        {"attention_sink": False, "normalize_memory": False, "use_memory_search": False},
        {"normalize_memory": False},
        {"sink_token_id": 7},
        {"retrieval_mode": "causal"},
        {"use_memory_search": False},
        {"use_sensory_memory": False},
        {"use_memory_search": False, "use_sensory_memory": False},  # RMT
        {"sensory_memory_size": 0, "representation_length": 8, "num_memory_embeddings": 1},
        {"memory_readout": "segment_mean"},
        {"memory_readout": "segment_mean", "use_memory_search": False, "attention_sink": False},
    ],
)
@pytest.mark.parametrize("model_type", ["llama", "opt"])
@torch.no_grad()
def test_matches_a_direct_reading_of_the_equations(model_type, fields):
    model = make_hmt(model_type, **fields)
    ids = torch.randint(3, 128, (37,), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(model(ids[None]).logits[0], reference_hmt_logits(model, ids), atol=1e-5, rtol=0)


def test_backbone_weights_are_bit_identical_and_memory_is_fresh(tmp_path):
    torch.manual_seed(0)
    backbone = AutoModelForCausalLM.from_config(tiny_config("gpt2"))
    backbone.save_pretrained(tmp_path)
    expected = {k: v.clone() for k, v in backbone.state_dict().items()}
    for source in (backbone, str(tmp_path)):
        model = HMTForCausalLM.from_backbone(source, **SMALL_HMT)
        for key, value in model.backbone.state_dict().items():
            assert torch.equal(value, expected[key]), key
        prompt = model.memory.representation_encoder.summary_prompt
        assert prompt.abs().sum() > 0 and torch.isfinite(prompt).all()
    bf16 = HMTForCausalLM.from_backbone(str(tmp_path), dtype=torch.bfloat16, attn_implementation="eager", **SMALL_HMT)
    assert bf16.dtype == torch.bfloat16 and bf16.memory.memory_search.initial_memory.dtype == torch.bfloat16
    assert bf16.config.text_config._attn_implementation == "eager"


@torch.no_grad()
def test_normalized_memory_enters_at_token_scale_and_its_search_scores_are_bounded():
    model = make_hmt("llama", num_memory_embeddings=8)
    embed_std = model.get_input_embeddings().weight.std().item()
    generator, search = model.memory.memory_embedding_generator, model.memory.memory_search
    # Fresh: the gain starts at the token embeddings' scale, the temperature at 10.
    assert torch.allclose(generator.memory_gain, torch.full_like(generator.memory_gain, embed_std))
    assert search.log_temperature.exp().item() == pytest.approx(10.0)
    ids = torch.randint(3, 128, (1, 64), generator=torch.Generator().manual_seed(1))
    memories = model(ids).memory.memories[0]
    assert torch.allclose(memories.pow(2).mean(-1).sqrt(), torch.full((len(memories),), embed_std), rtol=1e-3)
    with hmt_overrides(model, normalize_memory=False):  # the raw final hidden states (Eq. 5), same weights
        raw = model(ids).memory.memories[0]
    assert not torch.allclose(raw.pow(2).mean(-1).sqrt(), memories.pow(2).mean(-1).sqrt(), rtol=0.1)
    # However large the projections grow, τ · cos keeps the scores in [-τ, τ]: no one-hot softmax by scale alone.
    search.query_proj.weight.mul_(1e3)
    search.key_proj.weight.mul_(1e3)
    _, weights = search(
        torch.randn(1, memories.shape[1]), memories[None], torch.ones(1, len(memories), dtype=bool), True
    )
    assert weights.min() >= math.exp(-2 * 10.0) * weights.max() > 0
    _, raw_weights = search(
        torch.randn(1, memories.shape[1]), memories[None], torch.ones(1, len(memories), dtype=bool)
    )
    assert raw_weights.min() == 0  # Eq. 3's scaled dot product: one-hot


def test_parameter_overhead_is_two_projections_three_vectors_and_a_temperature():
    model = make_hmt("llama", memory_search_dim=48)
    overhead = model.memory_parameter_overhead()
    d = model.config.hidden_dim
    # W_q, W_k; T, the initial memory, the memory gain g; the search temperature τ
    assert overhead["memory_parameters"] == 2 * d * 48 + 3 * d + 1
    assert overhead["backbone_parameters"] == sum(p.numel() for p in model.backbone.parameters())
    assert overhead["overhead_percent"] == pytest.approx(
        100 * (2 * d * 48 + 3 * d + 1) / overhead["backbone_parameters"]
    )


@torch.no_grad()
def test_fifo_cache_keeps_the_newest_n_memories_and_stats_follow_chunk_by_chunk_use():
    model = make_hmt("llama", num_memory_embeddings=3)
    ids = torch.randint(3, 128, (1, 48))
    newest, sizes = [], []
    model.clear_memory()
    assert model.get_memory_stats()["cache_size"] == 0
    with model.carry_memory():
        for start in range(0, 48, 8):
            out = model(ids[:, start : start + 8])
            newest.append(out.memory.memories[0, -1])
            sizes.append(model.get_memory_stats()["cache_size"])
    assert sizes == [1, 2, 3, 3, 3, 3]
    torch.testing.assert_close(out.memory.memories[0], torch.stack(newest[-3:]))
    torch.testing.assert_close(torch.cat([model(ids).logits[:, -8:]]), out.logits, atol=1e-5, rtol=0)
    stats = model.get_memory_stats()
    assert stats == {
        "cache_size": 3,
        "max_cache_size": 3,
        "sensory_memory_active": True,
        "sensory_memory_size": 3,
        "num_segments_processed": 6,
    }
    model(ids[:, :8])  # outside carry_memory(): a fresh document
    assert model.get_memory_stats()["cache_size"] == 1
    model.clear_memory()
    assert model.get_memory_stats()["num_segments_processed"] == 0


@torch.no_grad()
def test_retrieval_weights_are_a_distribution_over_the_cache():
    out = make_hmt("llama")(torch.randint(3, 128, (2, 40)), output_retrieval_weights=True)
    assert [tuple(w.shape) for w in out.retrieval_weights] == [(2, 0), (2, 1), (2, 2), (2, 3), (2, 3)]
    for weights in out.retrieval_weights[1:]:
        torch.testing.assert_close(weights.sum(-1), torch.ones(2))


def test_loss_is_the_mean_next_token_loss_over_all_real_tokens():
    model = make_hmt("llama")
    ids = torch.randint(3, 128, (2, 29))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, 128), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    # Trainer passes num_items_in_batch for exact gradient accumulation: the loss is then sum / num_items.
    summed = model(ids, attention_mask=mask, labels=labels, num_items_in_batch=torch.tensor(100)).loss
    torch.testing.assert_close(summed, expected * (28 + 19) / 100)


def test_loss_on_last_segment_only_matches_the_reference_training_code():
    model = make_hmt("llama", loss_on_last_segment_only=True)
    ids = torch.randint(3, 128, (1, 29))
    out = model(ids, labels=ids)
    last = 24  # the last segment of 29 tokens with L=8 starts at 24
    expected = F.cross_entropy(out.logits[0, last:-1], ids[0, last + 1 :])
    torch.testing.assert_close(out.loss, expected)


@torch.no_grad()
def test_logits_to_keep_and_inputs_embeds():
    model = make_hmt("llama")
    ids = torch.randint(3, 128, (2, 29))
    full = model(ids, labels=ids)
    kept = model(ids, labels=ids, logits_to_keep=5)
    assert kept.logits.shape == (2, 5, 128)
    torch.testing.assert_close(kept.logits, full.logits[:, -5:])
    torch.testing.assert_close(kept.loss, full.loss)
    embedded = model(inputs_embeds=model.get_input_embeddings()(ids))
    torch.testing.assert_close(embedded.logits, full.logits)
    assert model(ids, return_dict=False)[0].shape == (2, 29, 128)


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    ids = torch.randint(3, 128, (2, 29))
    results = []
    for checkpointing in (False, True):
        model = make_hmt("llama").train()
        if checkpointing:
            model.gradient_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.backbone.model.layers)
        loss = model(ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(results[0][0], results[1][0])
    assert results[0][1].keys() == results[1][1].keys()
    for name in results[0][1]:
        torch.testing.assert_close(results[0][1][name], results[1][1][name], atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_eager_and_sdpa_attention_agree_and_bfloat16_runs():
    ids = torch.randint(3, 128, (2, 29))
    sdpa = make_hmt("llama")
    eager = make_hmt("llama")
    eager.set_attn_implementation("eager")
    assert eager.backbone.config._attn_implementation == "eager"
    torch.testing.assert_close(eager(ids).logits, sdpa(ids).logits, atol=1e-5, rtol=0)
    bf16 = make_hmt("llama").to(torch.bfloat16)
    out = bf16(ids, labels=ids)
    assert out.logits.dtype == torch.bfloat16 and out.memory.memories.dtype == torch.bfloat16
    assert abs(out.loss.item() - sdpa(ids, labels=ids).loss.item()) < 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_forward_backward_and_memory_stays_on_device():
    model = make_hmt("llama").cuda().train()
    ids = torch.randint(3, 128, (2, 29), device="cuda")
    out = model(ids, labels=ids)
    out.loss.backward()
    assert out.memory.memories.is_cuda and out.memory.recent_embeds.is_cuda
    cpu = make_hmt("llama")
    torch.testing.assert_close(out.logits.detach().cpu(), cpu(ids.cpu()).logits.detach(), atol=1e-4, rtol=1e-4)


def test_config_round_trip_and_defaults():
    config = HMTConfig(text_config=tiny_config("llama"), segment_length=64)
    assert config.representation_length == 32 and config.sensory_memory_size == 32
    assert config.num_memory_embeddings == 300 and config.retrieval_mode == "paper"
    restored = HMTConfig.from_dict(config.to_dict())
    assert restored.to_dict() == config.to_dict()
    assert restored.get_text_config(decoder=True).model_type == "llama"


def test_inference_caps_the_batched_representation_pass_at_one_segment_pass():
    """Without gradients the representation passes run in groups of (L+k+2)//(j+2) segments (here 2), so no pass holds
    more positions than a segment pass; with gradients one group of up to representation_batch_size. Same logits."""
    model = make_hmt(representation_batch_size=16)
    calls = []
    model.memory.representation_encoder.register_forward_hook(lambda module, args, out: calls.append(args[1].shape))
    ids = torch.randint(0, 100, (1, 29), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        inference = model(ids).logits
    inference_calls, calls[:] = list(calls), []
    training = model(ids).logits
    assert [shape[0] for shape in inference_calls] == [1, 2]  # groups [0, 1] and [2, 3]; segment 0 needs no query
    assert [shape[0] for shape in calls] == [3]
    torch.testing.assert_close(inference, training.detach(), atol=1e-5, rtol=1e-5)


def test_hmt_field_lists_derive_from_hmt_config():
    """One source of truth for the HMT hyperparameters: the CLI's arguments and the live-switchable fields are
    `HMTConfig` arguments, and a new HMTConfig argument is noticed here."""
    from dataclasses import fields

    from hmt_hf.configuration_hmt import HMT_FIELDS
    from hmt_hf.evaluation.baselines import OVERRIDABLE_FIELDS
    from hmt_hf.training.arguments import HMTModelArguments

    assert "segment_length" in HMT_FIELDS and set(HMT_FIELDS) <= set(HMTConfig().to_dict())
    cli = {f.name for f in fields(HMTModelArguments)}
    # Not on the command line: ablation switches (set by --method / stages), batching, the sink token id.
    assert cli == set(HMT_FIELDS) - {
        "use_memory_search",
        "use_sensory_memory",
        "representation_batch_size",
        "sink_token_id",
    }
    assert set(OVERRIDABLE_FIELDS) <= set(HMT_FIELDS)


@torch.no_grad()
def test_segment_mean_readout_is_padding_invariant_and_generate_refuses_it():
    model = make_hmt("llama", memory_readout="segment_mean")
    ids = torch.randint(3, 128, (2, 45), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0  # left padding: row 1 is its last 36 tokens
    batched, alone = model(ids, attention_mask=mask), model(ids[1:, 9:])
    torch.testing.assert_close(batched.logits[1, 9:], alone.logits[0], atol=1e-5, rtol=0)
    cached = int(alone.memory.memory_mask[0].sum())
    torch.testing.assert_close(batched.memory.memories[1, -cached:], alone.memory.memories[0, -cached:])
    with pytest.raises(ValueError, match="memory_readout='segment_mean' is not supported by generate"):
        model.generate(ids[:1, :5], max_new_tokens=2)
    with pytest.raises(ValueError, match="memory_readout='last' is invalid"):
        HMTConfig(memory_readout="last").validate_hmt()
