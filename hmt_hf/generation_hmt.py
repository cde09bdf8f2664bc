"""Decoding with rolling memory: the cache `generate()` carries, and the segment rules applied token by token.

Shipped beside the weights of every saved HMT checkpoint (``trust_remote_code``): imports only torch, transformers
and its sibling files.

While decoding, each sequence has an open segment whose backbone context is `[sink ‖ P_n ‖ sensory ‖ tokens so far]`
(no sink with `attention_sink=False`); the backbone's KV cache holds exactly that context (left-padded across the
batch), so each new token costs one cached step. When a sequence's open segment holds `L` tokens and another token
arrives, the segment is closed as in the forward pass — `P_n` is fed after its tokens and the final hidden state there
is `M_n`, pushed into the memory cache — and a new segment is opened with a freshly retrieved `P_{n+1}` and the last `k` tokens as sensory memory.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache

from .memory_hmt import HMTMemoryState


class HMTCache(DynamicCache):
    """A `DynamicCache` of the backbone's keys/values for the open segments' contexts, plus the HMT state.

    Attributes (`B` sequences, `C` context width, `L` segment length, `d` embedding width):
        memory: the [`HMTMemoryState`] of the closed segments.
        retrieved: `(B, d)` the memory `P_n` read by each open segment.
        segment_embeds: `(B, L, d)` the open segment's token embeddings, valid prefix of `segment_length`.
        segment_length: `(B,)`.
        context_mask: `(B, C)` which key/value positions of the backbone cache are real (left padding is not).
        context_embeds: `(B, C, d)` the inputs behind those positions, to rebuild the cache when segments roll over.
    """

    def __init__(
        self,
        backbone_config,
        memory: HMTMemoryState,
        retrieved,
        segment_embeds,
        segment_length,
        context_embeds,
        context_mask,
    ):
        super().__init__(config=backbone_config)
        self.memory = memory
        self.retrieved = retrieved
        self.segment_embeds = segment_embeds
        self.segment_length = segment_length
        self.context_embeds = context_embeds
        self.context_mask = context_mask

    def _per_sequence(self):
        return ("retrieved", "segment_embeds", "segment_length", "context_embeds", "context_mask")

    def _select(self, rows: torch.Tensor):
        self.memory = self.memory.index_select(rows)
        for name in self._per_sequence():
            setattr(self, name, getattr(self, name).index_select(0, rows.to(getattr(self, name).device)))

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        self._select(beam_idx)

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        self._select(torch.arange(self.segment_length.shape[0]).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        self._select(indices)

    def crop(self, max_length: int):
        raise NotImplementedError("HMTCache cannot be cropped: HMT's memory cannot forget tokens it has read.")


def left_pad(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's valid positions to its end, keeping their order: `(B, n, d)`, `(B, n)` → the same, trimmed
    to the longest row. New tokens are appended at the right, so every row's newest position is the last column."""
    width = int(mask.sum(1).max())
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)[:, mask.shape[1] - width :]
    return embeds.gather(1, order.unsqueeze(-1).expand(-1, -1, embeds.shape[-1])), mask.gather(1, order)


@functools.cache
def _takes_position_ids(backbone_class: type) -> bool:
    return "position_ids" in inspect.signature(backbone_class.forward).parameters


def backbone_step(
    backbone,
    cache: HMTCache,
    embeds: torch.Tensor,
    new_mask: torch.Tensor,
    logits_to_keep: int = 1,
    output_hidden_states: bool = False,
):
    """Run `embeds` `(B, n, d)` after the cached context. `new_mask` `(B, n)` marks real new positions; positions
    restart at each segment (each row counts its own real context positions). Returns the backbone output."""
    mask = torch.cat([cache.context_mask, new_mask], 1)
    kwargs = {}
    if _takes_position_ids(type(backbone)):
        kwargs["position_ids"] = (mask.long().cumsum(1) - 1).clamp(min=0)[:, -embeds.shape[1] :]
    out = backbone(
        inputs_embeds=embeds,
        attention_mask=mask.long(),
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=output_hidden_states,
        logits_to_keep=logits_to_keep,
        **kwargs,
    )
    cache.context_embeds = torch.cat([cache.context_embeds, embeds], 1)
    cache.context_mask = mask
    return out
