"""Bad input gets a ValueError/TypeError that names the problem and the fix."""

import pytest
import torch
from conftest import SMALL_HMT, make_hmt
from tiny_backbones import tiny_config
from transformers import AutoModelForCausalLM, BertConfig, LlamaModel, T5Config, T5ForConditionalGeneration

from hmt_hf import HMTConfig, HMTForCausalLM


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"segment_length": 0}, r"segment_length=0 is invalid: it must be >= 1"),
        ({"segment_length": 8, "sensory_memory_size": 9}, r"sensory_memory_size=9 is invalid: it must be in \[0, 8\]"),
        ({"segment_length": 8, "representation_length": 0}, r"representation_length=0 .* in \[1, 8\]"),
        ({"segment_length": 8, "representation_length": 9}, r"representation_length=9 .* in \[1, 8\]"),
        ({"num_memory_embeddings": 0}, r"num_memory_embeddings=0 is invalid: it must be >= 1"),
        ({"retrieval_mode": "future"}, r"retrieval_mode='future' is invalid: use one of \('paper', 'causal'\)"),
        ({"segment_length": 2.5}, r"segment_length=2.5 must be an integer"),
        ({"segment_length": 120, "sensory_memory_size": 32}, r"exceed the backbone's max_position_embeddings=128"),
        ({"hidden_dim": 99}, r"hidden_dim=99 does not match the backbone's embedding width 32"),
    ],
)
def test_invalid_config_values_name_the_field_value_and_allowed_range(fields, message):
    with pytest.raises(ValueError, match=message):
        HMTConfig(text_config=tiny_config("llama"), **{"segment_length": 16, "sensory_memory_size": 4, **fields})


def test_non_causal_backbones_are_refused():
    with pytest.raises(ValueError, match="encoder-decoder"):
        HMTConfig(text_config=T5Config())
    with pytest.raises(ValueError, match="bidirectional encoder"):
        HMTConfig(text_config=BertConfig())


def test_from_backbone_refuses_unsupported_backbones(tmp_path):
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))
    t5.save_pretrained(tmp_path / "t5")
    with pytest.raises(ValueError, match="encoder-decoder"):
        HMTForCausalLM.from_backbone(str(tmp_path / "t5"), **SMALL_HMT)
    with pytest.raises(ValueError, match="has no LM head; load the backbone with AutoModelForCausalLM"):
        HMTForCausalLM.from_backbone(LlamaModel(tiny_config("llama")), **SMALL_HMT)
    with pytest.raises(TypeError, match="backbone must be a model name, a folder or a PreTrainedModel"):
        HMTForCausalLM.from_backbone(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, r"The input is empty"),
        ({"input_ids": torch.zeros(0, 5, dtype=torch.long)}, r"The input is empty"),
        ({"input_ids": torch.ones(5, dtype=torch.long)}, r"add a batch dimension"),
        ({"input_ids": torch.ones(1, 5, dtype=torch.long), "attention_mask": torch.ones(1, 4)}, r"must match"),
        ({"input_ids": torch.ones(1, 5, dtype=torch.long), "attention_mask": torch.full((1, 5), 2)}, r"only 0"),
        ({"input_ids": torch.ones(1, 5, dtype=torch.long), "attention_mask": torch.zeros(1, 5)}, r"every position"),
        ({"input_ids": torch.full((1, 5), 128)}, r"outside \[0, 128\) .* tokenizer does not match"),
        ({"input_ids": torch.full((1, 5), -1)}, r"outside \[0, 128\)"),
        ({"input_ids": torch.ones(1, 5, dtype=torch.long), "labels": torch.ones(1, 4, dtype=torch.long)}, r"labels"),
        ({"input_ids": torch.ones(1, 5, dtype=torch.long), "logits_to_keep": -1}, r"logits_to_keep=-1"),
        ({"input_ids": None}, r"exactly one of input_ids or inputs_embeds"),
        (
            {"inputs_embeds": torch.zeros(1, 5, 7)},
            r"inputs_embeds must have shape \(batch_size, sequence_length, 32\)",
        ),
    ],
)
def test_bad_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_hmt("llama")(**kwargs)


def test_memory_from_another_batch_or_model_is_refused():
    model = make_hmt("llama")
    memory = model(torch.ones(2, 8, dtype=torch.long)).memory
    with pytest.raises(ValueError, match="memory holds 2 sequences but the input has 1"):
        model(torch.ones(1, 8, dtype=torch.long), memory=memory)
    with pytest.raises(TypeError, match="HMTMemoryState of a previous output"):
        model(torch.ones(2, 8, dtype=torch.long), memory=torch.zeros(2, 3))
    other = make_hmt("llama", sensory_memory_size=5)
    with pytest.raises(ValueError, match="different configuration"):
        other(torch.ones(2, 8, dtype=torch.long), memory=memory)


def test_corrupt_checkpoint_is_reported(tmp_path):
    make_hmt("llama").save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(Exception, match=r"(?i)safetensors|header|corrupt|deserializ|incomplete"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
