"""Tiny randomly initialised configs of decoder-only architectures of transformers 5.x, and a tiny tokenizer, for fast
tests."""

import glob
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, PreTrainedTokenizerFast

VOCAB = 128
COMMON = {"vocab_size": VOCAB, "max_position_embeddings": 128}
LLAMA_LIKE = {
    **COMMON,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

TINY_BACKBONES = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": VOCAB},
    # OPT-350m-style: embeddings (16) narrower than the hidden size (32), with project_in / project_out.
    "opt": {
        **COMMON,
        "hidden_size": 32,
        "word_embed_proj_dim": 16,
        "ffn_dim": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    },
    "llama": LLAMA_LIKE,
    "mistral": {**LLAMA_LIKE, "sliding_window": 64},
    "qwen2": LLAMA_LIKE,
    "qwen3": {**LLAMA_LIKE, "head_dim": 8},
    # Gemma scales embeddings by sqrt(hidden_size) inside the model.
    "gemma": {**LLAMA_LIKE, "head_dim": 8},
    "gemma2": {**LLAMA_LIKE, "head_dim": 8, "sliding_window": 16, "final_logit_softcapping": 30.0},
    "phi3": {**LLAMA_LIKE, "pad_token_id": 0},
    "phi": {**COMMON, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
    "gpt_neox": {
        **COMMON,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    },
    # ALiBi: no position ids at all.
    "bloom": {"vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2, "n_head": 4},
    "falcon": {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4},
    "starcoder2": {**LLAMA_LIKE, "sliding_window": 64},
    # Granite's four multipliers (embeddings, residuals, attention scale, logits), set away from 1 as in its releases.
    "granite": {
        **LLAMA_LIKE,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125,
        "logits_scaling": 8.0,
    },
}


def tiny_config(model_type: str, **overrides):
    """A tiny config of `model_type` (tests put models in eval mode so dropout is off); `overrides` replace fields
    (e.g. `vocab_size=512` for `fixture_tokenizer()`)."""
    return AutoConfig.for_model(
        model_type, **{"bos_token_id": 1, "eos_token_id": 2, **TINY_BACKBONES[model_type], **overrides}
    )


def fixture_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style: spaces attach to the next word) trained on tests/fixtures/zero_shot/, with
    `<s>` (id 0) and `</s>` (id 1); it adds no special tokens by itself."""
    folder = os.path.join(os.path.dirname(__file__), "fixtures", "zero_shot")
    texts = [open(path, encoding="utf-8").read() for path in sorted(glob.glob(os.path.join(folder, "*")))]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
