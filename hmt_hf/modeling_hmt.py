"""Hierarchical Memory Transformer (He et al., 2024, arXiv 2405.06067) over any decoder-only causal LM.

Shipped beside the weights of every saved HMT checkpoint (``trust_remote_code``): imports only torch, transformers
and its sibling files.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_hmt import HMTConfig, check_backbone_config
from .generation_hmt import HMTCache, backbone_step, left_pad
from .memory_hmt import HMTMemory, HMTMemoryState, decode_plain_segment, with_sink

# `τ` of the normalized memory search at initialisation (`normalize_memory=True`): the first retrievals are nearly
# uniform averages of the cache (normalized entropy 0.995 untrained on SmolLM2, reports/untrained_memory).
INITIAL_SEARCH_TEMPERATURE = 10.0

try:  # transformers >= 5: init functions that leave already-loaded weights alone
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    from torch.nn import init


@dataclass
class HMTCausalLMOutput(CausalLMOutputWithPast):
    r"""
    Output of [`HMTForCausalLM`].

    Args:
        loss (`torch.FloatTensor` of shape `(1,)`, *optional*): next-token loss, when `labels` are given.
        logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, vocab_size)`):
            logits aligned with the input positions (zeros at padded positions); only the last `logits_to_keep`
            positions when that is set.
        memory (`HMTMemoryState`): the memory after the last segment. Pass it back as `memory=` to continue the
            same documents in the next call. With gradients enabled it carries the autograd graph of this call, so
            one backward through both calls' losses trains across them (BPTT over calls); after `loss.backward()`
            pass `out.memory.detach()` instead (truncated BPTT), since the first call's graph has been freed.
        retrieval_weights (`tuple(torch.FloatTensor)`, *optional*): one `(batch_size, cached_memories)` tensor per
            segment — the memory-search attention over the cache (Eq. 3), when `output_retrieval_weights=True`.
    """

    memory: HMTMemoryState | None = None
    retrieval_weights: tuple[torch.FloatTensor, ...] | None = None


class HMTPreTrainedModel(PreTrainedModel):
    config_class = HMTConfig
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def _init_weights(self, module):
        # The backbone initialises its own modules; these are the memory parameters. T and the initial memory are
        # read as input embeddings, so they start at the scale of the token embeddings (as the reference code).
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, std=module.in_features**-0.5)
        elif hasattr(module, "summary_prompt"):
            init.normal_(module.summary_prompt, std=self._token_embedding_std())
        elif hasattr(module, "initial_memory"):
            init.normal_(module.initial_memory, std=self._token_embedding_std())
            init.constant_(module.log_temperature, math.log(INITIAL_SEARCH_TEMPERATURE))
        elif hasattr(module, "memory_gain"):
            init.constant_(module.memory_gain, self._token_embedding_std())

    def _token_embedding_std(self) -> float:
        weight = self.backbone.get_input_embeddings().weight
        if weight.is_meta or not torch.isfinite(weight).all():
            return getattr(self.config.text_config, "initializer_range", 0.02)
        return weight.float().std().item()


class HMTForCausalLM(HMTPreTrainedModel, GenerationMixin):
    """An HMT: the backbone causal LM (`self.backbone`) plus the memory hierarchy (`self.memory`).

    Build one from any decoder-only checkpoint with [`HMTForCausalLM.from_backbone`], or load a saved HMT with
    `AutoModelForCausalLM.from_pretrained`.
    """

    def __init__(self, config: HMTConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        if backbone is None:
            backbone = AutoModelForCausalLM.from_config(config.text_config)
        self.backbone = backbone
        config.text_config = backbone.config  # one config object, so later changes (attention, dtype) reach both
        width = backbone.get_input_embeddings().embedding_dim
        if width != config.hidden_dim:
            raise ValueError(
                f"The backbone embeds tokens in {width} dimensions but its config says {config.hidden_dim}."
            )
        sensory = config.sensory_memory_size if config.use_sensory_memory else 0
        self.memory = HMTMemory(width, config.search_dim, sensory)
        parameter = next(backbone.parameters(), None)
        if parameter is not None and not parameter.is_meta:
            self.memory.to(device=parameter.device, dtype=backbone.get_input_embeddings().weight.dtype)
        self._memory_state: HMTMemoryState | None = None
        self._carry_memory = False
        self.post_init()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_backbone(
        cls,
        backbone: str | os.PathLike | PreTrainedModel,
        *,
        dtype: torch.dtype | str | None = None,
        gguf_file: str | None = None,
        attn_implementation: str | None = None,
        backbone_kwargs: dict | None = None,
        **hmt_fields,
    ) -> HMTForCausalLM:
        """Turn a decoder-only causal LM into an HMT. Backbone weights are kept bit for bit; the memory parameters
        are freshly initialised.

        Args:
            backbone: a Hub id, a local folder, or an already-loaded `PreTrainedModel` with an LM head.
            dtype, gguf_file, attn_implementation: passed to `AutoModelForCausalLM.from_pretrained` (for a loaded
                model, `dtype` casts it and `attn_implementation` switches it).
            backbone_kwargs: any other `from_pretrained` arguments (`revision`, `device_map`, ...).
            **hmt_fields: [`HMTConfig`] fields (`segment_length`, `sensory_memory_size`, ...).
        """
        if isinstance(backbone, (str, os.PathLike)):
            load_kwargs = {"dtype": dtype, "gguf_file": gguf_file, "attn_implementation": attn_implementation}
            load_kwargs = {k: v for k, v in load_kwargs.items() if v is not None} | dict(backbone_kwargs or {})
            config_kwargs = {
                k: load_kwargs[k] for k in ("gguf_file", "revision", "trust_remote_code") if k in load_kwargs
            }
            check_backbone_config(AutoConfig.from_pretrained(backbone, **config_kwargs))
            backbone = AutoModelForCausalLM.from_pretrained(backbone, **load_kwargs)
        elif isinstance(backbone, PreTrainedModel):
            if dtype is not None:
                backbone = backbone.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
            if attn_implementation is not None:
                backbone.set_attn_implementation(attn_implementation)
        else:
            raise TypeError(
                f"backbone must be a model name, a folder or a PreTrainedModel, not {type(backbone).__name__}."
            )
        check_backbone_config(backbone.config)
        if backbone.get_output_embeddings() is None:
            raise ValueError(
                f"{type(backbone).__name__} has no LM head; load the backbone with AutoModelForCausalLM "
                "(e.g. LlamaForCausalLM, not LlamaModel)."
            )
        if "inputs_embeds" not in inspect.signature(backbone.forward).parameters:
            raise ValueError(f"{type(backbone).__name__}.forward takes no `inputs_embeds`, which HMT needs.")
        quantization = getattr(backbone.config, "quantization_config", None)
        if getattr(quantization, "quant_method", None) == "gguf" or (
            isinstance(quantization, dict) and quantization.get("quant_method") == "gguf"
        ):
            # GGUF weights are de-quantised on load; dropping the marker lets the HMT be saved as safetensors.
            backbone.hf_quantizer = None
            del backbone.config.quantization_config
        return cls(HMTConfig(text_config=backbone.config, **hmt_fields), backbone=backbone)

    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.backbone.set_input_embeddings(value)

    def get_output_embeddings(self):
        return self.backbone.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings):
        self.backbone.set_output_embeddings(new_embeddings)

    def sink_embedding(self) -> torch.Tensor | None:
        """The attention-sink embedding `(d,)` that starts every backbone pass, or None (`attention_sink=False`)."""
        if not self.config.attention_sink:
            return None
        embed_tokens = self.get_input_embeddings()
        token = torch.tensor([self.config.resolved_sink_token_id], device=embed_tokens.weight.device)
        return embed_tokens(token)[0]

    def memory_parameter_overhead(self) -> dict:
        """Parameters HMT adds to the backbone: `{"memory_parameters", "backbone_parameters", "overhead_percent"}`."""
        added = sum(p.numel() for p in self.memory.parameters())
        backbone = sum(p.numel() for p in self.backbone.parameters())
        return {
            "memory_parameters": added,
            "backbone_parameters": backbone,
            "overhead_percent": 100 * added / backbone,
        }

    # Decoding carries memory in the cache: assisted decoding cannot rewind it.
    _is_stateful = True

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """`GenerationMixin.generate` with rolling memory: prompts of any length, greedy, sampling, beam search.
        Features HMT cannot honour are refused with a message instead of silently changing the result."""
        if self.config.memory_readout != "memory_slot":
            raise ValueError(
                f"memory_readout={self.config.memory_readout!r} is not supported by generate() (its segments close one "
                "token at a time, without the segment's states); use memory_readout='memory_slot'."
            )
        for feature in ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit"):
            if kwargs.get(feature) is not None:
                raise ValueError(f"{feature} (assisted decoding) is not supported by HMT: memory cannot be rewound.")
        cache_implementation = kwargs.get("cache_implementation") or getattr(
            generation_config, "cache_implementation", None
        )
        if cache_implementation not in (None, "dynamic"):
            raise ValueError(
                f"cache_implementation={cache_implementation!r} is not supported by HMT; its cache (HMTCache) is a "
                "DynamicCache that also carries the memory. Leave cache_implementation unset."
            )
        max_new_tokens = kwargs.get("max_new_tokens", getattr(generation_config, "max_new_tokens", None))
        if max_new_tokens is not None and max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0.")
        prompt = inputs if inputs is not None else kwargs.get("input_ids")
        if prompt is not None and (prompt.numel() == 0 or prompt.shape[-1] == 0):
            raise ValueError("The prompt is empty; generate() needs at least one token per sequence.")
        return super().generate(inputs, generation_config=generation_config, **kwargs)

    # ------------------------------------------------------------------ chunk-by-chunk conveniences
    @contextlib.contextmanager
    def carry_memory(self):
        """Within this context, a call without `memory=` continues from the previous call's memory, so a document
        can be fed chunk by chunk: `with model.carry_memory(): for chunk in chunks: model(chunk)`.
        Outside it every call starts from empty memory (Trainer batches are independent documents)."""
        previous, self._carry_memory = self._carry_memory, True
        try:
            yield self
        finally:
            self._carry_memory = previous

    def clear_memory(self):
        """Forget the memory of the last call (what `carry_memory()` continues from and `get_memory_stats()` reads)."""
        self._memory_state = None

    def get_memory_stats(self, memory: HMTMemoryState | None = None) -> dict:
        """Memory after the last call (or of `memory`): cached memory embeddings (max over the batch), cache capacity
        `N`, whether sensory memory is active for the next segment and how many tokens it holds, and segments
        processed."""
        state = memory if memory is not None else self._memory_state
        sensory = self.memory.sensory_memory.size
        if state is None:
            cache_size = sensory_tokens = segments = 0
        else:
            cache_size = int(state.cache_size.max())
            sensory_tokens = (
                int(state.recent_mask[:, state.recent_mask.shape[1] - sensory :].sum(1).max()) if sensory else 0
            )
            segments = int(state.num_segments.max())
        return {
            "cache_size": cache_size,
            "max_cache_size": self.config.num_memory_embeddings,
            "sensory_memory_active": sensory_tokens > 0,
            "sensory_memory_size": sensory_tokens,
            "num_segments_processed": segments,
        }

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        memory: HMTMemoryState | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_memory: bool = True,
        logits_to_keep: int = 0,
        output_retrieval_weights: bool = False,
        return_dict: bool | None = None,
        past_key_values: HMTCache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> HMTCausalLMOutput | tuple:
        r"""
        Process input of any length segment by segment (Eq. 1-5).

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`): token ids (or `inputs_embeds`).
            attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*): 1 for real
                tokens, 0 for padding (left, right or anywhere). Padding never enters memory; each sequence gives
                the logits it would give alone.
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): targets aligned with
                the input (shifted inside); `-100` is ignored. The loss averages over all scored tokens, or divides
                by `num_items_in_batch` when Trainer passes it.
            memory ([`HMTMemoryState`], *optional*): memory from a previous call (`out.memory`) to continue those
                documents. Calls whose lengths are multiples of `segment_length` then give the logits of one call.
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_dim)`, *optional*).
            use_memory (`bool`, defaults to `True`): `False` runs the plain chunked backbone (independent segments,
                no memory tokens, no sensory memory) — the ablation.
            logits_to_keep (`int`, defaults to 0): if > 0, return logits for the last `logits_to_keep` positions
                only (the loss still covers every token). Without labels, the LM head then runs only on the segments
                holding those positions, so memory stays flat however long the input.
            output_retrieval_weights (`bool`): also return the memory-search weights of every segment.
            past_key_values ([`HMTCache`]) / use_cache: decoding mode (what `generate()` uses): the first call
                closes the prompt's full segments into memory and opens the last one in the backbone's KV cache;
                later calls append tokens, closing and opening segments as they fill. Returns `past_key_values`.
        """
        if use_cache or past_key_values is not None:
            if past_key_values is not None and not isinstance(past_key_values, DynamicCache):
                raise ValueError(
                    f"{type(past_key_values).__name__} is not supported: HMT decodes with HMTCache (a DynamicCache);"
                    " leave cache_implementation unset."
                )
            if isinstance(past_key_values, HMTCache):
                output = self._decode_tokens(input_ids, past_key_values)
            else:
                output = self._prefill_prompt(input_ids, attention_mask, memory, logits_to_keep)
            return output if return_dict is not False else output.to_tuple()
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        config = self.config
        embed_tokens = self.get_input_embeddings()
        token_source = input_ids if input_ids is not None else inputs_embeds
        mask = self._check_inputs(input_ids, inputs_embeds, attention_mask, labels, logits_to_keep)
        batch_size, total = mask.shape
        device = token_source.device
        if memory is None and self._carry_memory and self._memory_state is not None:
            memory = self._memory_state
        state = self._initial_state(memory, batch_size, device, embed_tokens.weight.dtype)

        # Work on "compact" rows: each row's real tokens moved to its front, in order. `order` maps back.
        lengths = mask.sum(1)
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
        positions = torch.arange(total, device=device)
        compact_mask = positions < lengths[:, None]
        max_len = int(lengths.max())

        def take(start: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
            """Embeddings `(B, width, d)` and mask of compact positions `[start, start + width)`."""
            span = torch.arange(start, start + width, device=device).clamp(max=total - 1)
            valid = compact_mask[:, span] & (torch.arange(start, start + width, device=device) < total)
            index = order[:, span]
            if input_ids is not None:
                return embed_tokens(input_ids.gather(1, index).masked_fill(~valid, 0)), valid
            return inputs_embeds.gather(1, index.unsqueeze(-1).expand(-1, -1, inputs_embeds.shape[-1])), valid

        shift_labels = None if labels is None else self._scored_targets(labels, mask, order)

        keep = total if logits_to_keep == 0 else min(logits_to_keep, total)
        logits_out = None
        loss_sum = None
        weights_per_segment = []
        queries = {}
        length = config.segment_length
        for segment in range(-(-max_len // length)):
            start = segment * length
            width = min(length, max_len - start)
            segment_embeds, segment_mask = take(start, width)
            original = order[:, start : start + width]
            kept = segment_mask & (original >= total - keep)
            with_logits = shift_labels is not None or bool(kept.any())
            if not use_memory:
                logits = decode_plain_segment(self.backbone, segment_embeds, segment_mask, with_logits)
            else:
                if config.use_memory_search and segment not in queries:
                    queries = self._encode_queries(state, segment, max_len, take)
                retrieved, weights = self._read_memory(state, queries.get(segment))
                if output_retrieval_weights:
                    weights_per_segment.append(weights)
                sensory_embeds, sensory_mask = self.memory.sensory_memory(state)
                logits, new_memory = self.memory.memory_embedding_generator(
                    self.backbone,
                    retrieved,
                    sensory_embeds,
                    sensory_mask,
                    segment_embeds,
                    segment_mask,
                    with_logits,
                    sink=self.sink_embedding(),
                    normalized=config.normalize_memory,
                    readout=config.memory_readout,
                )
                segment_lengths = segment_mask.sum(1)
                state = state.push(new_memory, segment_lengths > 0, config.num_memory_embeddings)
                state = state.remember_tokens(segment_embeds, segment_lengths)
            if not with_logits:
                continue
            if shift_labels is not None:
                # num_items_in_batch=1 makes the loss function return the summed loss of this segment.
                segment_loss = self.loss_function(
                    logits=logits.contiguous(),
                    labels=None,
                    shift_labels=shift_labels[:, start : start + width].contiguous(),
                    vocab_size=logits.shape[-1],
                    num_items_in_batch=1,
                )
                loss_sum = segment_loss if loss_sum is None else loss_sum + segment_loss
            if logits_out is None:
                logits_out = logits.new_zeros(batch_size, keep, logits.shape[-1])
            if kept.any():
                rows = torch.arange(batch_size, device=device)[:, None].expand_as(kept)[kept]
                logits_out.index_put_((rows, original[kept] - (total - keep)), logits[kept])
            del logits  # so two segments' logits never coexist

        loss = None
        if loss_sum is not None:
            denominator = num_items_in_batch if num_items_in_batch is not None else (shift_labels != -100).sum()
            loss = loss_sum / torch.as_tensor(denominator, device=loss_sum.device).clamp(min=1)
        self._memory_state = state.detach()
        output = HMTCausalLMOutput(
            loss=loss,
            logits=logits_out,
            memory=state,
            retrieval_weights=tuple(weights_per_segment) if output_retrieval_weights else None,
        )
        return output if return_dict is not False else output.to_tuple()

    def scored_targets(self, labels: torch.LongTensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The targets the loss scores for `labels` `(B, T)`: `(B, T)` with position `p` of each row's real tokens
        holding the label of its token `p + 1`, and -100 where nothing is scored (the last token, padding, and with
        `loss_on_last_segment_only` every target before the row's last segment). `(out != -100).sum()` is the loss's
        token count, which `HMTTrainer` passes as `num_items_in_batch` so that a last-segment loss is a mean."""
        mask = torch.ones_like(labels, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        return self._scored_targets(labels, mask, torch.argsort((~mask).to(torch.int8), dim=1, stable=True))

    def _scored_targets(self, labels, mask, order) -> torch.Tensor:
        lengths = mask.sum(1)
        positions = torch.arange(mask.shape[1], device=mask.device)
        compact_labels = labels.gather(1, order).masked_fill(positions >= lengths[:, None], -100)
        shift_labels = F.pad(compact_labels[:, 1:], (0, 1), value=-100)
        if self.config.loss_on_last_segment_only:
            length = self.config.segment_length
            last_segment_start = (lengths - 1).clamp(min=0) // length * length
            shift_labels = shift_labels.masked_fill(positions < last_segment_start[:, None], -100)
        return shift_labels

    def _encode_queries(self, state: HMTMemoryState, first: int, max_len: int, take) -> dict[int, torch.Tensor]:
        """Segment representations `S` (Eq. 1) for segments `first, first+1, ...` (up to `representation_batch_size`
        of them) in one batched backbone pass. Returns `{segment: (B, d) queries}`."""
        config = self.config
        length, j = config.segment_length, config.representation_length
        num_segments = -(-max_len // length)
        group = config.representation_batch_size or num_segments
        if not torch.is_grad_enabled():
            # Without gradients nothing of a segment outlives its pass, so a large batched representation pass would
            # set the peak memory: cap it at the positions of one segment pass, keeping inference memory flat.
            sink = config.sink_positions
            group = min(group, max(1, (length + config.sensory_memory_size + 2 + sink) // (j + 2 + sink)))
        last = first + group
        segments = range(first, min(last, num_segments))
        has_cache = state.cache_size > 0
        tokens, token_masks, needed = [], [], []
        for segment in segments:
            active = take(segment * length, 1)[1][:, 0]
            if config.retrieval_mode == "paper":
                embeds, token_mask = take(segment * length, min(j, max_len - segment * length))
                embeds, token_mask = (
                    F.pad(embeds, (0, 0, 0, j - embeds.shape[1])),
                    F.pad(token_mask, (0, j - token_mask.shape[1])),
                )
            elif segment == first:
                embeds, token_mask = state.recent_embeds[:, -j:], state.recent_mask[:, -j:]
            else:
                embeds, token_mask = take(segment * length - j, j)
            tokens.append(embeds)
            token_masks.append(token_mask)
            # Queries are only read where the cache is non-empty: from the second segment on, or on a continued call.
            needed.append(active & (has_cache | (segment > first)))
        tokens = torch.stack(tokens, 1).flatten(0, 1)
        token_masks = torch.stack(token_masks, 1).flatten(0, 1)
        needed = torch.stack(needed, 1).flatten(0, 1)
        queries = tokens.new_zeros(tokens.shape[0], tokens.shape[-1])
        if needed.any():
            queries[needed] = self.memory.representation_encoder(
                self.backbone, tokens[needed], token_masks[needed], sink=self.sink_embedding()
            )
        queries = queries.view(-1, len(segments), tokens.shape[-1])
        return {segment: queries[:, i] for i, segment in enumerate(segments)}

    def _read_memory(self, state: HMTMemoryState, query: torch.Tensor | None):
        """`P_n` `(B, d)` and the retrieval weights `(B, c)` (None when search is off)."""
        if not self.config.use_memory_search:
            newest, exists = state.newest_memory()
            initial = self.memory.memory_search.initial_memory.to(newest.dtype).expand_as(newest)
            return torch.where(exists[:, None], newest, initial), None
        return self.memory.memory_search(
            query, state.memories, state.memory_mask, normalized=self.config.normalize_memory
        )

    # ------------------------------------------------------------------ decoding
    def _prefill_prompt(self, input_ids, attention_mask, memory, logits_to_keep) -> HMTCausalLMOutput:
        """Close every full segment of the prompt but the last into memory (the ordinary forward pass), then open
        the last segment (1 to L tokens) in the backbone's KV cache. Returns the logits of the open segment's last
        `logits_to_keep` positions (all prompt positions when 0) and the `HMTCache`."""
        mask = self._check_inputs(input_ids, None, attention_mask, None, logits_to_keep)
        length = self.config.segment_length
        lengths = mask.sum(1)
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
        closed = (lengths - 1).clamp(min=0) // length * length  # tokens of each row in closed segments
        embed_tokens = self.get_input_embeddings()
        state = self._initial_state(memory, input_ids.shape[0], input_ids.device, embed_tokens.weight.dtype)
        history_logits = None
        if int(closed.max()) > 0:
            span = torch.arange(int(closed.max()), device=input_ids.device)
            history_mask = span < closed[:, None]
            history = self.forward(
                input_ids.gather(1, order[:, : span.numel()]).masked_fill(~history_mask, 0),
                attention_mask=history_mask.long(),
                memory=state,
                logits_to_keep=0 if logits_to_keep == 0 else 1,
            )
            state, history_logits = history.memory, history.logits

        open_length = lengths - closed
        span = torch.arange(int(open_length.max()), device=input_ids.device)
        open_mask = span < open_length[:, None]
        open_ids = input_ids.gather(1, order.gather(1, (closed[:, None] + span).clamp(max=input_ids.shape[1] - 1)))
        open_embeds = embed_tokens(open_ids.masked_fill(~open_mask, 0))
        cache, out = self._open_segments(state, open_embeds, open_mask, logits_to_keep=open_mask.shape[1])
        logits = out.logits  # (B, max open length, V): every row's open tokens end at the last column
        if logits_to_keep == 0:
            logits = self._prompt_logits(mask, order, closed, open_length, history_logits, logits)
        else:
            logits = logits[:, -logits_to_keep:]
        return HMTCausalLMOutput(logits=logits, past_key_values=cache, memory=cache.memory)

    def _prompt_logits(self, mask, order, closed, open_length, history_logits, open_logits):
        """Assemble `(B, T, V)` logits aligned with the prompt from the closed-segment and open-segment logits."""
        batch_size, total = mask.shape
        logits = open_logits.new_zeros(batch_size, total, open_logits.shape[-1])
        rows = torch.arange(batch_size, device=mask.device)[:, None]
        if history_logits is not None:
            span = torch.arange(history_logits.shape[1], device=mask.device)
            valid = span < closed[:, None]
            positions = order[:, : span.numel()]
            logits[rows.expand_as(valid)[valid], positions[valid]] = history_logits[valid]
        span = torch.arange(open_logits.shape[1], device=mask.device)
        valid = span >= open_logits.shape[1] - open_length[:, None]
        source = (closed[:, None] + span - (open_logits.shape[1] - open_length[:, None])).clamp(0, total - 1)
        positions = order.gather(1, source)
        logits[rows.expand_as(valid)[valid], positions[valid]] = open_logits[valid]
        return logits

    def _open_segments(self, state: HMTMemoryState, token_embeds, token_mask, logits_to_keep: int = 1):
        """Open a segment per row holding `token_embeds` `(B, n, d)` (valid prefix `token_mask`): read `P_n`, run
        `[P_n ‖ sensory ‖ tokens]` into a fresh `HMTCache`. Returns the cache and the backbone output."""
        retrieved = self._read_memory_for_open_segment(state, token_embeds, token_mask)
        sensory_embeds, sensory_mask = self.memory.sensory_memory(state)
        ones = token_mask.new_ones(token_mask.shape[0], 1)
        context, context_mask = left_pad(
            *with_sink(
                self.sink_embedding(),
                torch.cat([retrieved.unsqueeze(1), sensory_embeds, token_embeds], 1),
                torch.cat([ones, sensory_mask, token_mask], 1),
            )
        )
        length = self.config.segment_length
        segment_embeds = F.pad(token_embeds * token_mask.unsqueeze(-1), (0, 0, 0, length - token_embeds.shape[1]))
        cache = HMTCache(
            self.backbone.config,
            memory=state,
            retrieved=retrieved,
            segment_embeds=segment_embeds,
            segment_length=token_mask.sum(1),
            context_embeds=context[:, :0],
            context_mask=context_mask[:, :0],
        )
        out = backbone_step(self.backbone, cache, context, context_mask, logits_to_keep)
        return cache, out

    def _read_memory_for_open_segment(self, state: HMTMemoryState, token_embeds=None, token_mask=None) -> torch.Tensor:
        """`P_n` `(B, d)` for segments opened while decoding. A row whose first `j` tokens are known (a prompt
        segment) in paper mode uses Eq. 1 on them, as the forward pass does; otherwise the query reads the `j` tokens
        before the segment (the causal rule), because the segment's own first `j` tokens do not exist yet."""
        config = self.config
        if not config.use_memory_search:
            return self._read_memory(state, None)[0]
        j = config.representation_length
        query_tokens, query_mask = state.recent_embeds[:, -j:], state.recent_mask[:, -j:]
        known = None if token_mask is None else token_mask.sum(1) >= j
        if config.retrieval_mode == "paper" and known is not None and bool(known.any()):
            query_tokens = torch.where(known[:, None, None], token_embeds[:, :j], query_tokens)
            query_mask = torch.where(known[:, None], token_mask[:, :j], query_mask)
        needed = state.cache_size > 0
        queries = query_tokens.new_zeros(query_tokens.shape[0], query_tokens.shape[-1])
        if bool(needed.any()):
            queries[needed] = self.memory.representation_encoder(
                self.backbone, query_tokens[needed], query_mask[needed], sink=self.sink_embedding()
            )
        return self._read_memory(state, queries)[0]

    def _decode_tokens(self, input_ids, cache: HMTCache) -> HMTCausalLMOutput:
        """Append `input_ids` `(B, n)` to the open segments one token at a time, rolling segments over when full."""
        embed_tokens = self.get_input_embeddings()
        for column in range(input_ids.shape[1]):
            token = embed_tokens(input_ids[:, column : column + 1])
            closing = cache.segment_length >= self.config.segment_length
            if bool(closing.any()):
                cache, out = self._roll_over(cache, closing, token)
            else:
                out = backbone_step(self.backbone, cache, token, closing.new_ones(closing.shape[0], 1))
                self._append_token(cache, token)
        return HMTCausalLMOutput(logits=out.logits[:, -1:], past_key_values=cache, memory=cache.memory)

    def _append_token(self, cache: HMTCache, token: torch.Tensor):
        index = cache.segment_length.clamp(max=self.config.segment_length - 1)[:, None, None]
        cache.segment_embeds = cache.segment_embeds.scatter(1, index.expand(-1, 1, token.shape[-1]), token)
        cache.segment_length = cache.segment_length + 1

    def _roll_over(self, cache: HMTCache, closing: torch.Tensor, token: torch.Tensor):
        """Close the full segments of the `closing` rows (Eq. 5: feed `P_n` after their tokens; the final hidden
        state there is `M_n`), open new ones holding `token`, and rebuild the KV cache of every row's context."""
        config = self.config
        closed = backbone_step(
            self.backbone, cache, cache.retrieved.unsqueeze(1), closing.unsqueeze(1), output_hidden_states=True
        )
        new_memory = self.memory.memory_embedding_generator.memory_embedding(
            closed.hidden_states[-1][:, -1], config.normalize_memory
        )
        state = cache.memory.push(new_memory, closing, config.num_memory_embeddings)
        state = state.remember_tokens(cache.segment_embeds, cache.segment_length * closing)

        retrieved = torch.where(closing[:, None], self._read_memory_for_open_segment(state), cache.retrieved)
        sensory_embeds, sensory_mask = self.memory.sensory_memory(state)
        ones = closing.new_ones(closing.shape[0], 1)
        opened, opened_mask = with_sink(
            self.sink_embedding(),
            torch.cat([retrieved.unsqueeze(1), sensory_embeds, token], 1),
            torch.cat([ones, sensory_mask, ones], 1),
        )
        kept = torch.cat([cache.context_embeds[:, :-1], token], 1)  # without the P_n fed above
        kept_mask = torch.cat([cache.context_mask[:, :-1], ones], 1)
        # Each row keeps either its old context plus the token or the new segment's context: one packing picks it.
        context, context_mask = left_pad(
            torch.cat([kept, opened], 1),
            torch.cat([kept_mask & ~closing[:, None], opened_mask & closing[:, None]], 1),
        )
        appended = HMTCache(
            self.backbone.config,
            state,
            retrieved,
            cache.segment_embeds,
            cache.segment_length,
            context[:, :0],
            context_mask[:, :0],
        )
        self._append_token(appended, token)
        first_token = F.pad(token, (0, 0, 0, config.segment_length - 1))
        appended.segment_embeds = torch.where(closing[:, None, None], first_token, appended.segment_embeds)
        appended.segment_length = torch.where(
            closing, torch.ones_like(appended.segment_length), appended.segment_length
        )
        out = backbone_step(self.backbone, appended, context, context_mask)
        return appended, out

    def empty_memory(self, batch_size: int = 1) -> HMTMemoryState:
        """The memory of `batch_size` documents that have not started, on the model's device."""
        config = self.config
        # Recent tokens feed sensory memory and causal queries (which decoding uses in both retrieval modes).
        recent = max(
            config.sensory_memory_size if config.use_sensory_memory else 0,
            config.representation_length if config.use_memory_search else 0,
        )
        weight = self.get_input_embeddings().weight
        return HMTMemoryState.empty(batch_size, config.hidden_dim, recent, weight.device, weight.dtype)

    def _initial_state(self, memory, batch_size, device, dtype) -> HMTMemoryState:
        config = self.config
        if memory is None:
            return self.empty_memory(batch_size).to(device)
        if not isinstance(memory, HMTMemoryState):
            raise TypeError(
                f"memory must be the HMTMemoryState of a previous output (out.memory), not {type(memory)}."
            )
        if memory.batch_size != batch_size:
            raise ValueError(
                f"memory holds {memory.batch_size} sequences but the input has {batch_size}; pass the memory of the "
                "same batch of documents (or memory.index_select(rows) to pick sequences)."
            )
        recent = self.empty_memory(0).recent_embeds.shape[1]
        if memory.memories.shape[-1] != config.hidden_dim or memory.recent_embeds.shape[1] != recent:
            raise ValueError("memory was produced by an HMT with a different configuration than this model.")
        return memory.to(device)

    def _check_inputs(self, input_ids, inputs_embeds, attention_mask, labels, logits_to_keep) -> torch.Tensor:
        """Validate the inputs; return the attention mask as bool `(B, T)`."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if input_ids is not None:
            if input_ids.dim() != 2:
                raise ValueError(
                    f"input_ids must have shape (batch_size, sequence_length), got {tuple(input_ids.shape)}; "
                    "add a batch dimension with input_ids[None]."
                )
            shape = tuple(input_ids.shape)
        else:
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.hidden_dim:
                raise ValueError(
                    f"inputs_embeds must have shape (batch_size, sequence_length, {self.config.hidden_dim}), "
                    f"got {tuple(inputs_embeds.shape)}."
                )
            shape = tuple(inputs_embeds.shape[:2])
        if 0 in shape:
            raise ValueError(f"The input is empty (shape {shape}); pass at least one token.")
        if attention_mask is None:
            mask = torch.ones(
                shape, dtype=torch.bool, device=(input_ids if input_ids is not None else inputs_embeds).device
            )
        else:
            if tuple(attention_mask.shape) != shape:
                raise ValueError(
                    f"attention_mask has shape {tuple(attention_mask.shape)} but the input has shape {shape}; "
                    "they must match (one 0/1 entry per token)."
                )
            if ((attention_mask != 0) & (attention_mask != 1)).any():
                raise ValueError("attention_mask must contain only 0 (padding) and 1 (real token).")
            mask = attention_mask.bool()
        if not mask.any():
            raise ValueError("attention_mask marks every position as padding; there is no token to process.")
        if input_ids is not None:
            real = input_ids[mask]
            vocab_size = self.get_input_embeddings().num_embeddings
            if int(real.min()) < 0 or int(real.max()) >= vocab_size:
                raise ValueError(
                    f"input_ids contain ids outside [0, {vocab_size}) (min {int(real.min())}, max {int(real.max())});"
                    " the tokenizer does not match this model's vocabulary."
                )
        if labels is not None and tuple(labels.shape) != shape:
            raise ValueError(f"labels have shape {tuple(labels.shape)} but the input has shape {shape}.")
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep={logits_to_keep!r} must be an int >= 0 (0 keeps all positions).")
        return mask
