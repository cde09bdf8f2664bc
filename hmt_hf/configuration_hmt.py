"""HMT configuration.

This file is shipped beside the weights of every saved HMT checkpoint (``trust_remote_code``): it imports only
``transformers`` and nothing from ``hmt_hf``.
"""

import inspect

from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)

RETRIEVAL_MODES = ("paper", "causal")
MEMORY_READOUTS = ("memory_slot", "segment_mean")


class HMTConfig(PretrainedConfig):
    r"""
    Configuration of a Hierarchical Memory Transformer (He et al., 2024, arXiv 2405.06067) wrapped around any
    decoder-only causal language model (the *backbone*, whose config is nested as `text_config`).

    A document is cut into segments of `segment_length` new tokens. For segment `n` the model

    1. encodes the segment's first `representation_length` tokens between two learned summary prompts `T`
       (Eq. 1): `S_n = BBM([T ‖ H_n[0, j) ‖ T])[-1]`;
    2. searches the cache of the last `num_memory_embeddings` memory embeddings with `S_n` (Eq. 2-3):
       `P_n = softmax((S_n W_q)(M W_k)ᵀ / √d_h) M`;
    3. decodes `[P_n ‖ sensory memory ‖ H_n ‖ P_n]`, where the sensory memory is the last `sensory_memory_size`
       tokens before the segment (Eq. 4), and pushes the final hidden state at the trailing `P_n` into the cache as
       the new memory embedding `M_n` (Eq. 5).

    With `attention_sink=True` (the default) every backbone pass starts with one more position, the backbone's own
    embedding of `sink_token_id`, so the memory slot never sits at position 0 (see `attention_sink`).

    Args:
        text_config (`PretrainedConfig` or `dict`, *optional*):
            Config of the decoder-only backbone. Defaults to a default `LlamaConfig`.
        segment_length (`int`, *optional*, defaults to 1024):
            `L`: number of **new** tokens per segment (memory and sensory slots not included; the reference code's
            `--segment_length` counts them, this one does not).
        representation_length (`int`, *optional*):
            `j`: number of leading segment tokens read by the representation encoder. Defaults to `L // 2`.
        sensory_memory_size (`int`, *optional*, defaults to 32):
            `k`: number of tokens before the segment that are prepended to it. `0` disables sensory memory.
        num_memory_embeddings (`int`, *optional*, defaults to 300):
            `N`: size of the FIFO cache of memory embeddings searched by memory search.
        memory_search_dim (`int`, *optional*):
            `d_h`: width of the query/key projections `W_q`, `W_k`. Defaults to the backbone's embedding width.
        use_memory_search (`bool`, *optional*, defaults to `True`):
            If `False` (the paper's training stage 1, and RMT), no search runs and segment `n` reads the previous
            memory embedding `M_{n-1}` directly (recurrent memory).
        use_sensory_memory (`bool`, *optional*, defaults to `True`):
            If `False`, no sensory tokens are prepended (RMT, ablations).
        retrieval_mode (`str`, *optional*, defaults to `"paper"`):
            `"paper"`: the query `S_n` reads the first `j` tokens of segment `n` itself (Eq. 1 exactly), so the
            predictions for those tokens can depend on later tokens of the same segment through `P_n`.
            `"causal"`: the query reads the `j` tokens *before* segment `n`, so no prediction depends on a later
            token.
        loss_on_last_segment_only (`bool`, *optional*, defaults to `False`):
            Compute the language-modelling loss over the last segment of each sequence only, as the reference
            training code does. The default scores every real token.
        representation_batch_size (`int`, *optional*, defaults to 16):
            The representation passes of a call's segments run batched, in backbone calls of at most this many
            segments, so activation memory does not grow with the input length (16 covers the paper's deepest
            BPTT unroll, 15 segments, in one call). `None` runs all of them in one call. Without gradients
            (inference) the groups are also capped at `(L + k + 2) // (j + 2)` segments, so a representation pass
            never holds more positions than a segment pass and peak memory stays flat in the input length.
        attention_sink (`bool`, *optional*, defaults to `True`):
            Start every backbone pass (Eq. 1 and Eq. 4) with the backbone's embedding of `sink_token_id`:
            `[sink ‖ P_n ‖ sensory ‖ H_n ‖ P_n]` and `[sink ‖ T ‖ H_n[0, j) ‖ T]`. Pretrained LMs park most of their
            attention on position 0 (the "attention sink"); Eq. 4 puts the memory embedding there, and an untrained
            memory embedding in that place makes a freshly converted HMT far worse than its own backbone
            (`benchmarks/untrained_memory.py`). With the sink a fresh HMT is the chunked backbone plus sensory memory
            and a memory slot it learns to read. `False` is Eq. 4 exactly (the paper's layout).
        sink_token_id (`int`, *optional*):
            The token whose embedding is the sink. Defaults to the backbone's `bos_token_id` (else `eos_token_id`,
            else 0).
        normalize_memory (`bool`, *optional*, defaults to `True`):
            Keep the memory at the scale the backbone reads and the search soft. A memory embedding is the final
            hidden state `h` at the trailing memory slot rescaled, `M_n = g ⊙ h / rms(h)`, with a learned gain `g`
            that starts at the token embeddings' scale (raw final hidden states are ~15x larger than token
            embeddings on SmolLM2, and the backbone all but ignores them); memory search scores `τ · cos(Q, K)` with
            a learned temperature `τ` (starting at 10) instead of `Q Kᵀ / √d_h`, whose scores are so large that
            training makes the softmax one-hot. `False` is Eq. 3 and Eq. 5 exactly; with `attention_sink=False` too,
            the model is the paper's.
        memory_readout (`str`, *optional*, defaults to `"memory_slot"`):
            Where the memory embedding `M_n` is read. `"memory_slot"` is Eq. 5: the final hidden state at the trailing
            memory slot, whose input is the retrieved memory `P_n` itself. `"segment_mean"`: the mean final hidden
            state over the segment's tokens, so `M_n` depends on what the segment says rather than on its nearly
            constant slot input (then normalized as `normalize_memory` says). Forward passes and training only:
            `generate()` refuses it.
    """

    model_type = "hmt"
    sub_configs = {"text_config": AutoConfig}
    # Trainer's evaluation gathers every output tensor; the memory state is not a prediction.
    keys_to_ignore_at_inference = ["memory", "retrieval_weights"]

    def __init__(
        self,
        text_config=None,
        segment_length: int = 1024,
        representation_length: int | None = None,
        sensory_memory_size: int = 32,
        num_memory_embeddings: int = 300,
        memory_search_dim: int | None = None,
        use_memory_search: bool = True,
        use_sensory_memory: bool = True,
        retrieval_mode: str = "paper",
        loss_on_last_segment_only: bool = False,
        representation_batch_size: int | None = 16,
        attention_sink: bool = True,
        sink_token_id: int | None = None,
        normalize_memory: bool = True,
        memory_readout: str = "memory_slot",
        **kwargs,
    ):
        if isinstance(text_config, dict):
            text_config = dict(text_config)
            model_type = text_config.pop("model_type", None)
            if model_type is None:
                raise ValueError("`text_config` is a dict without `model_type`; add the backbone's model_type.")
            text_config = AutoConfig.for_model(model_type, **text_config)
        elif text_config is None:
            text_config = CONFIG_MAPPING["llama"]()
        self.text_config = text_config

        hidden_dim = kwargs.pop("hidden_dim", None)
        self.segment_length = segment_length
        self.representation_length = segment_length // 2 if representation_length is None else representation_length
        self.sensory_memory_size = sensory_memory_size
        self.num_memory_embeddings = num_memory_embeddings
        self.memory_search_dim = memory_search_dim
        self.use_memory_search = use_memory_search
        self.use_sensory_memory = use_sensory_memory
        self.retrieval_mode = retrieval_mode
        self.loss_on_last_segment_only = loss_on_last_segment_only
        self.representation_batch_size = representation_batch_size
        self.attention_sink = attention_sink
        self.sink_token_id = sink_token_id
        self.normalize_memory = normalize_memory
        self.memory_readout = memory_readout
        # The base class pushes its attention implementation down to text_config: default it to the backbone's own.
        kwargs.setdefault("attn_implementation", getattr(text_config, "_attn_implementation", None))
        super().__init__(**kwargs)
        self.validate_hmt()
        if hidden_dim is not None and hidden_dim != self.hidden_dim:
            raise ValueError(
                f"hidden_dim={hidden_dim} does not match the backbone's embedding width {self.hidden_dim}; "
                "it is derived from `text_config`, so leave it out."
            )

    @property
    def hidden_dim(self) -> int:
        """`d`: width of the token embeddings, of `T`, of memory embeddings (`word_embed_proj_dim` for OPT)."""
        return getattr(self.text_config, "word_embed_proj_dim", None) or self.text_config.hidden_size

    @property
    def sink_positions(self) -> int:
        """Positions the attention sink adds in front of every backbone pass (0 or 1)."""
        return int(bool(self.attention_sink))

    @property
    def resolved_sink_token_id(self) -> int:
        """The token id whose embedding is the attention sink (`sink_token_id`, else the backbone's BOS, EOS, 0)."""
        for candidate in (
            self.sink_token_id,
            getattr(self.text_config, "bos_token_id", None),
            getattr(self.text_config, "eos_token_id", None),
        ):
            if isinstance(candidate, (list, tuple)):
                candidate = candidate[0] if candidate else None
            if candidate is not None:
                return int(candidate)
        return 0

    @property
    def search_dim(self) -> int:
        """`d_h`: width of the memory-search projections."""
        return self.memory_search_dim or self.hidden_dim

    def validate_hmt(self):
        """Raise a `ValueError` naming the field, its value and what is allowed if the HMT fields are invalid."""

        def check_int(name, low, high=None, allow_none=False):
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}={value!r} must be an integer.")
            if value < low or (high is not None and value > high):
                bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"{name}={value} is invalid: it must be {bounds}.")

        check_int("segment_length", 1)
        length = self.segment_length
        check_int("representation_length", 1, length)
        check_int("sensory_memory_size", 0, length)
        check_int("num_memory_embeddings", 1)
        check_int("memory_search_dim", 1, allow_none=True)
        check_int("representation_batch_size", 1, allow_none=True)
        vocab_size = getattr(self.text_config, "vocab_size", None)
        check_int("sink_token_id", 0, vocab_size - 1 if isinstance(vocab_size, int) else None, allow_none=True)
        for name in ("attention_sink", "normalize_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False.")
        if self.memory_readout not in MEMORY_READOUTS:
            raise ValueError(f"memory_readout={self.memory_readout!r} is invalid: use one of {MEMORY_READOUTS}.")
        if self.retrieval_mode not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval_mode={self.retrieval_mode!r} is invalid: use one of {RETRIEVAL_MODES}.")
        check_backbone_config(self.text_config)
        max_positions = getattr(self.text_config, "max_position_embeddings", None)
        longest_pass = 2 + self.sink_positions + self.sensory_memory_size + length
        if isinstance(max_positions, int) and longest_pass > max_positions:
            raise ValueError(
                f"segment_length={length} + sensory_memory_size={self.sensory_memory_size} + 2 memory slots + "
                f"{self.sink_positions} sink = {longest_pass} positions exceed the backbone's max_position_embeddings={max_positions}; "
                "lower segment_length or sensory_memory_size."
            )


def check_backbone_config(text_config):
    """Raise a `ValueError` unless `text_config` describes a decoder-only causal language model."""
    model_type = getattr(text_config, "model_type", None)
    if getattr(text_config, "is_encoder_decoder", False):
        raise ValueError(
            f"text_config is an encoder-decoder model (model_type={model_type!r}); HMT needs a decoder-only causal "
            "LM backbone such as gpt2, llama, qwen2, mistral, opt or gpt_neox."
        )
    if model_type == HMTConfig.model_type:
        raise ValueError("text_config is itself an HMT config; pass the backbone's config instead.")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(
            f"text_config has model_type={model_type!r}, which has no causal-LM class in transformers "
            "(AutoModelForCausalLM); HMT needs a decoder-only causal LM backbone."
        )
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(text_config, "is_decoder", False):
        raise ValueError(
            f"text_config (model_type={model_type!r}) is a bidirectional encoder; HMT needs a causal decoder. "
            "Use a decoder-only backbone, or set is_decoder=True if this model really is trained as a causal LM."
        )


# The HMT hyperparameters: every `HMTConfig` argument but the backbone's config. The one list the CLI, the reports
# and the model cards derive theirs from.
HMT_FIELDS = tuple(
    name for name in inspect.signature(HMTConfig.__init__).parameters if name not in ("self", "text_config", "kwargs")
)
