"""Causal mode has no future dependence; paper mode's documented leak is measured and confined where predicted."""

import dataclasses

import pytest
import torch
from conftest import make_hmt

LENGTH = 32  # 4 segments of L=8; j=4


def future_dependence(model, length=LENGTH, memory=None):
    """`leak[t]` = max |Δ logits[≤ t]| when every token after t is replaced, computed for all t in one batch.
    `memory` (batch 1) continues a document."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (1, length), generator=generator)
    batch = ids.repeat(length, 1)
    for t in range(length - 1):
        batch[t, t + 1 :] = torch.randint(3, 128, (length - t - 1,), generator=generator)
    with torch.no_grad():
        reference = model(ids, memory=memory).logits[0]
        repeated = None if memory is None else memory.index_select(torch.zeros(length, dtype=torch.long))
        perturbed = model(batch, memory=repeated).logits
    return torch.stack([(perturbed[t, : t + 1] - reference[: t + 1]).abs().max() for t in range(length - 1)])


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bloom", "gemma"])
def test_causal_mode_no_prediction_depends_on_a_later_token(model_type):
    leak = future_dependence(make_hmt(model_type, retrieval_mode="causal"))
    assert leak.max() <= 1e-6, leak


def distinct_memories(model, count=4):
    """A continued document whose cache holds `count` clearly different memory embeddings. (In a tiny random model
    every memory embedding the model writes is nearly the same vector, so retrieval could not matter.)"""
    state = model.empty_memory(1)
    generator = torch.Generator().manual_seed(1)
    return dataclasses.replace(
        state,
        memories=torch.randn(1, count, model.config.hidden_dim, generator=generator) * 5,
        memory_mask=torch.ones(1, count, dtype=torch.bool),
        recent_embeds=torch.randn(state.recent_embeds.shape, generator=generator) * 0.02,
        recent_mask=torch.ones_like(state.recent_mask),
        num_segments=torch.tensor([count]),
    )


def test_paper_mode_leak_is_measured_and_confined_to_the_first_j_tokens_of_each_segment():
    """Paper mode (Eq. 1): P_n depends on H_n[0, j) through retrieval, so the logits at offsets < j-1 of a segment
    with a non-empty cache see later tokens of their own segment. Offsets >= j-1 do not: every token the query reads
    is then already in the past."""
    model = make_hmt("llama", retrieval_mode="paper", num_memory_embeddings=16)
    memory = distinct_memories(model)
    length, j = model.config.segment_length, model.config.representation_length
    leak = future_dependence(model, memory=memory)
    expected = torch.tensor([t % length < j - 1 for t in range(LENGTH - 1)])
    assert leak[expected].min() > 1e-4, leak
    assert leak[~expected].max() <= 1e-5, leak
    print(f"paper-mode leak: max |Δlogit| {leak.max():.3e} at {int(expected.sum())} of {LENGTH - 1} positions")
    causal = make_hmt("llama", retrieval_mode="causal", num_memory_embeddings=16)
    assert future_dependence(causal, memory=memory).max() <= 1e-5


def test_without_memory_search_paper_mode_is_causal():
    leak = future_dependence(make_hmt("llama", retrieval_mode="paper", use_memory_search=False))
    assert leak.max() <= 1e-6
