"""What the loss counts and what a training call keeps: last-segment losses through Trainer and HMTStream, the
logits a training step holds, memory search at shallow unrolls, and the autograd graph `out.memory` carries."""

import math

import pytest
import torch
from conftest import make_hmt
from transformers import TrainingArguments

from hmt_hf import HMTStream
from hmt_hf.training import HMTArguments, HMTTrainer, apply_stage, search_parameters


def batch(model, rows=2, segments=3, seed=0):
    length = model.config.segment_length
    ids = torch.randint(3, 128, (rows, segments * length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def trainer_for(model, tmp_path, **kwargs):
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    return HMTTrainer(model=model, args=args)


def test_last_segment_loss_is_a_mean_through_trainer(tmp_path):
    model = make_hmt(loss_on_last_segment_only=True)
    inputs = batch(model)
    inputs["attention_mask"][1, :5] = 0  # a left-padded row: its last segment is shorter
    trainer = trainer_for(model, tmp_path)
    counted = trainer._get_num_items_in_batch([inputs], torch.device("cpu"))
    scored = model.scored_targets(inputs["labels"], inputs["attention_mask"])
    # Row 0: 23 of 24 tokens before its last segment, so 7 targets; row 1 (19 real tokens): 2 full segments, 2 left.
    assert int(counted) == int((scored != -100).sum()) == 7 + 2
    all_labels = int((inputs["labels"][:, 1:] != -100).sum())
    assert int(counted) < all_labels  # what Trainer counted before: every label
    mean = model(**inputs).loss
    assert torch.allclose(model(**inputs, num_items_in_batch=counted).loss, mean)
    # Through Trainer's own loop: the logged loss of a step with LR 0 is that mean.
    dataset = [{k: v[0] for k, v in inputs.items()}]
    trainer = trainer_for(
        model, tmp_path, max_steps=1, learning_rate=0.0, logging_steps=1, per_device_train_batch_size=1
    )
    trainer.train_dataset = dataset
    trainer.train()
    logged = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    single = {k: v[:1] for k, v in inputs.items()}
    assert math.isclose(logged, model(**single).loss.item(), rel_tol=1e-4)


def test_stream_scores_every_token_whatever_the_training_loss():
    model = make_hmt()
    ids = batch(model, rows=1, segments=4)["input_ids"][0].tolist()
    expected = HMTStream(model, chunk_segments=2).score_tokens(ids)
    model.config.loss_on_last_segment_only = True
    got = HMTStream(model, chunk_segments=2).score_tokens(ids)
    assert got.num_targets == expected.num_targets == len(ids) - 1
    assert math.isclose(got.perplexity, expected.perplexity, rel_tol=1e-6)
    assert model.config.loss_on_last_segment_only  # the stream restored the model's setting


def test_training_step_keeps_one_position_of_logits(tmp_path):
    model = make_hmt().train()
    inputs = batch(model)
    trainer = trainer_for(model, tmp_path)
    loss, outputs = trainer.compute_loss(model, inputs, return_outputs=True)
    assert outputs.logits.shape[1] == 1  # not (B, T, V)
    torch.testing.assert_close(loss, model(**inputs).loss)


def test_stage2_needs_two_cached_memories_to_train_memory_search():
    model = make_hmt().train()
    apply_stage(model, 2)
    gradients = {}
    for segments in (2, 3):
        model.zero_grad()
        model(**batch(model, segments=segments)).loss.backward()
        gradients[segments] = [p.grad for p in search_parameters(model.memory)]
    # Two segments: the second searches a cache of one memory, the softmax is exactly 1, W_q, W_k and T learn nothing.
    assert all(g is None or not g.any() for g in gradients[2])
    assert all(g is not None and g.abs().sum() > 0 for g in gradients[3])
    with pytest.raises(ValueError, match="bptt_depth >= 3"):
        HMTArguments(stage="2", bptt_depth=2)
    for method in ("rmt", "chunked"):  # no memory search to train: shallow unrolls are fine
        assert HMTArguments(stage="both", bptt_depth=2, method=method).bptt_depth == 2


def test_out_memory_carries_the_graph_and_detach_truncates_it():
    model = make_hmt().train()
    first, second = batch(model, seed=1), batch(model, seed=2)
    out = model(**first)
    assert out.memory.memories.requires_grad
    out.loss.backward()
    # Backpropagating into a previous call whose graph was already freed fails...
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        model(**second, memory=out.memory).loss.backward()
    # ...the detached copy starts a new graph (truncated BPTT between calls).
    model(**second, memory=out.memory.detach()).loss.backward()
    # Without the first backward, one backward runs through both calls (BPTT across calls).
    model.zero_grad()
    out = model(**first)
    (out.loss + model(**second, memory=out.memory).loss).backward()
    assert model.memory.memory_search.initial_memory.grad.abs().sum() > 0
