"""The memory hierarchy of HMT (arXiv 2405.06067, §3): the pieces of Eq. 1-5 and the state carried between calls.

Shipped beside the weights of every saved HMT checkpoint (``trust_remote_code``): imports only torch.

Shapes: `B` batch, `d` embedding width (the width the LM head reads), `d_h` memory-search width, `c` cached
memory embeddings (at most `N`), `t` recent tokens kept for sensory memory / causal queries.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, fields

import torch
from torch import nn


def pack_right(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move the valid positions of each row to its front, keeping their order.

    Every backbone pass of HMT is built from pieces with their own padding (memory slot, sensory tokens, segment
    tokens, memory slot). Packing them turns any such mix into plain right padding, which every causal backbone
    handles exactly like the unpadded sequence: positions restart at 0 and no valid position sees a pad.

    Args:
        embeds: `(B, n, d)`.
        mask: `(B, n)` bool, True where the position is real.
    Returns:
        packed `(B, m, d)` with `m = max(mask.sum(1))`, its mask `(B, m)`, and the row lengths `(B,)`.
    """
    lengths = mask.sum(1)
    width = int(lengths.max()) if mask.numel() else 0
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :width]
    packed = embeds.gather(1, order.unsqueeze(-1).expand(-1, -1, embeds.shape[-1]))
    return packed, mask.gather(1, order), lengths


def run_backbone(backbone: nn.Module, embeds: torch.Tensor, mask: torch.Tensor, logits_to_keep: int | None = None):
    """One right-padded backbone pass over `embeds` `(B, m, d)`. Returns `(logits, final hidden states (B, m, d))`.

    `logits_to_keep=None` skips the LM head (`logits` is None); `n >= 1` returns the logits of the last `n`
    positions `(B, n, V)`, so the vocabulary projection runs only where logits are used. The final hidden state is
    the vector the LM head reads (after the final norm, after OPT's `project_out`). An all-valid mask is passed as
    `None` so the pass is the backbone's plain causal pass, bit for bit.
    """
    attention_mask = None if bool(mask.all()) else mask.long()
    if logits_to_keep is None:
        out = backbone.base_model(inputs_embeds=embeds, attention_mask=attention_mask, use_cache=False)
        return None, out.last_hidden_state
    keep = 0 if logits_to_keep >= embeds.shape[1] else logits_to_keep  # 0 is transformers' "every position"
    head_kwargs = (
        {"logits_to_keep": keep} if "logits_to_keep" in inspect.signature(backbone.forward).parameters else {}
    )
    out = backbone(
        inputs_embeds=embeds, attention_mask=attention_mask, use_cache=False, output_hidden_states=True, **head_kwargs
    )
    return out.logits[:, out.logits.shape[1] - min(logits_to_keep, embeds.shape[1]) :], out.hidden_states[-1]


def with_sink(sink: torch.Tensor | None, embeds: torch.Tensor, mask: torch.Tensor):
    """Prepend the attention-sink embedding `sink` `(d,)` to every row of `embeds` `(R, n, d)` / `mask` `(R, n)`
    (nothing when `sink` is None: the paper's layout)."""
    if sink is None:
        return embeds, mask
    rows = embeds.shape[0]
    return (
        torch.cat([sink.to(embeds.dtype).expand(rows, 1, -1), embeds], 1),
        torch.cat([mask.new_ones(rows, 1), mask], 1),
    )


class RepresentationEncoder(nn.Module):
    """Eq. 1: `S_n = BBM([T ‖ X ‖ T])` read at the trailing `T`, with `T` the learned summary prompt.

    `X` is the first `j` tokens of the segment (``retrieval_mode="paper"``) or the `j` tokens before it
    (``"causal"``); the caller chooses. Rows of many segments are encoded in one backbone pass. With an attention
    sink the pass is `[sink ‖ T ‖ X ‖ T]`.
    """

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.summary_prompt = nn.Parameter(torch.zeros(hidden_dim))

    def forward(
        self,
        backbone: nn.Module,
        token_embeds: torch.Tensor,
        token_mask: torch.Tensor,
        sink: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`token_embeds` `(R, n, d)` with `token_mask` `(R, n)` (and the sink embedding `(d,)` or None) →
        segment representations `S` `(R, d)`."""
        rows = token_embeds.shape[0]
        prompt = self.summary_prompt.to(token_embeds.dtype).expand(rows, 1, -1)
        ones = token_mask.new_ones(rows, 1)
        packed, packed_mask, lengths = pack_right(
            *with_sink(sink, torch.cat([prompt, token_embeds, prompt], 1), torch.cat([ones, token_mask, ones], 1))
        )
        _, hidden = run_backbone(backbone, packed, packed_mask)
        return hidden[torch.arange(rows, device=hidden.device), lengths - 1]


class MemorySearch(nn.Module):
    """Eq. 2-3: cross-attention of a segment representation over the cached memory embeddings.

    `Q = S W_q`, `K = M W_k`, `P = softmax(Q Kᵀ / √d_h) M` (no value or output projection). A sequence whose cache
    is empty reads the learned `initial_memory` instead.

    With `normalized=True` the scores are `τ · cos(Q, K)` with a learned temperature `τ = exp(log_temperature)`:
    final hidden states share a few very large dimensions, so the raw dot products are so large that a small change
    in training turns the softmax one-hot (on SmolLM2 it settles on the oldest memory for every segment); the cosine
    bounds the scores by `±τ`.
    """

    def __init__(self, hidden_dim: int, search_dim: int):
        super().__init__()
        self.search_dim = search_dim
        self.query_proj = nn.Linear(hidden_dim, search_dim, bias=False)
        self.key_proj = nn.Linear(hidden_dim, search_dim, bias=False)
        self.initial_memory = nn.Parameter(torch.zeros(hidden_dim))
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(
        self, representation: torch.Tensor, memories: torch.Tensor, memory_mask: torch.Tensor, normalized: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`representation` `(B, d)`, `memories` `(B, c, d)`, `memory_mask` `(B, c)` →
        retrieved memory `P` `(B, d)` and retrieval weights `(B, c)` (zero on empty slots)."""
        batch = representation.shape[0]
        initial = self.initial_memory.to(representation.dtype).expand(batch, -1)
        if memories.shape[1] == 0:
            return initial, memory_mask.to(representation.dtype)
        query = self.query_proj(representation).float()
        keys = self.key_proj(memories).float()
        if normalized:
            query, keys = nn.functional.normalize(query, dim=-1), nn.functional.normalize(keys, dim=-1)
            scores = torch.einsum("bh,bch->bc", query, keys) * self.log_temperature.float().exp()
        else:
            scores = torch.einsum("bh,bch->bc", query, keys) / math.sqrt(self.search_dim)
        # A finite fill keeps rows with an empty cache NaN-free; their result is replaced below.
        scores = scores.masked_fill(~memory_mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1) * memory_mask
        retrieved = torch.einsum("bc,bcd->bd", weights.to(memories.dtype), memories)
        has_memory = memory_mask.any(1, keepdim=True)
        return torch.where(has_memory, retrieved, initial), weights


class SensoryMemory(nn.Module):
    """The last `k` token embeddings before a segment (the paper's `H_{n-1}[L-k, L)`), prepended to it."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, state: HMTMemoryState) -> tuple[torch.Tensor, torch.Tensor]:
        """→ sensory embeddings `(B, k', d)` and mask `(B, k')`, right-aligned, `k' = min(k, t)`."""
        if self.size == 0:
            return state.recent_embeds[:, :0], state.recent_mask[:, :0]
        return state.recent_embeds[:, -self.size :], state.recent_mask[:, -self.size :]


class MemoryEmbeddingGenerator(nn.Module):
    """Eq. 4-5: decode `[P ‖ sensory ‖ H_n ‖ P]`; the segment positions give the logits and the final hidden state
    at the trailing `P` is the new memory embedding `M_n`. With an attention sink: `[sink ‖ P ‖ sensory ‖ H_n ‖ P]`,
    so `P` is not at position 0, where pretrained backbones keep their attention sink.

    With `normalized=True`, `M_n = g ⊙ h / rms(h)` for the final hidden state `h`, with a learned gain `g` that
    starts at the token embeddings' scale: the memory enters the next segment as loud as a token does (a final
    hidden state is ~15x larger on SmolLM2, and the backbone all but ignores the slot).
    """

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.memory_gain = nn.Parameter(torch.ones(hidden_dim))

    def memory_embedding(self, hidden: torch.Tensor, normalized: bool) -> torch.Tensor:
        """The memory embedding `M_n` `(B, d)` from the final hidden state at the trailing memory slot `(B, d)`."""
        if not normalized:
            return hidden
        rms = hidden.float().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
        return (hidden.float() * rms).to(hidden.dtype) * self.memory_gain.to(hidden.dtype)

    def forward(
        self,
        backbone: nn.Module,
        retrieved: torch.Tensor,
        sensory_embeds: torch.Tensor,
        sensory_mask: torch.Tensor,
        segment_embeds: torch.Tensor,
        segment_mask: torch.Tensor,
        with_logits: bool = True,
        sink: torch.Tensor | None = None,
        normalized: bool = False,
        readout: str = "memory_slot",
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """`retrieved` `(B, d)`, sensory `(B, k', d)`/`(B, k')`, segment `(B, L', d)`/`(B, L')` (valid prefix), the
        sink embedding `(d,)` or None, `normalized` (see the class), `readout` (`"memory_slot"`: Eq. 5, the state at
        the trailing `P`; `"segment_mean"`: the mean final state over the segment's tokens) → segment logits
        `(B, L', V)` (None if not `with_logits`) and memory embeddings `M_n` `(B, d)`."""
        rows, seg_len = segment_mask.shape
        memory_slot = retrieved.unsqueeze(1)
        ones = segment_mask.new_ones(rows, 1)
        packed, packed_mask, lengths = pack_right(
            *with_sink(
                sink,
                torch.cat([memory_slot, sensory_embeds, segment_embeds, memory_slot], 1),
                torch.cat([ones, sensory_mask, segment_mask, ones], 1),
            )
        )
        first_token = 1 + (sink is not None) + sensory_mask.sum(1)
        # Logits from the earliest segment position of any row to the end: the LM head skips the memory and sensory
        # slots (and runs on one position only when no logits are needed).
        keep = packed.shape[1] - int(first_token.min()) if with_logits else 1
        logits, hidden = run_backbone(backbone, packed, packed_mask, logits_to_keep=keep)
        row_index = torch.arange(rows, device=hidden.device)
        if readout == "segment_mean":
            position = torch.arange(hidden.shape[1], device=hidden.device)
            tokens = (position >= first_token[:, None]) & (position < (lengths - 1)[:, None])
            weights = tokens.to(hidden.dtype) / tokens.sum(1, keepdim=True).clamp(min=1).to(hidden.dtype)
            state = torch.einsum("bp,bpd->bd", weights, hidden)
        else:
            state = hidden[row_index, lengths - 1]
        new_memory = self.memory_embedding(state, normalized)
        if not with_logits:
            return None, new_memory
        start = first_token - (packed.shape[1] - keep)
        if bool((start == start[0]).all()):  # rows aligned (the usual case): a view, no copy
            return logits[:, int(start[0]) : int(start[0]) + seg_len], new_memory
        token_index = (start[:, None] + torch.arange(seg_len, device=hidden.device)).clamp(max=keep - 1)
        return logits[row_index[:, None], token_index], new_memory


def decode_plain_segment(
    backbone: nn.Module, segment_embeds: torch.Tensor, segment_mask: torch.Tensor, with_logits: bool = True
) -> torch.Tensor | None:
    """The memory-free pass (`use_memory=False`, the chunked-backbone ablation): segment logits `(B, L', V)`."""
    packed, packed_mask, _ = pack_right(segment_embeds, segment_mask)
    logits, _ = run_backbone(backbone, packed, packed_mask, logits_to_keep=packed.shape[1] if with_logits else 1)
    return logits if with_logits else None


class HMTMemory(nn.Module):
    """All learned memory parameters of HMT in one module (so PEFT's `modules_to_save=["memory"]` trains and saves
    them with an adapter): `T` (Eq. 1), `W_q`, `W_k`, the initial memory and the search temperature (Eq. 2-3), the
    memory gain (Eq. 5). The temperature and gain exist in every layout; only `normalize_memory=True` reads them."""

    def __init__(self, hidden_dim: int, search_dim: int, sensory_memory_size: int):
        super().__init__()
        self.representation_encoder = RepresentationEncoder(hidden_dim)
        self.memory_search = MemorySearch(hidden_dim, search_dim)
        self.sensory_memory = SensoryMemory(sensory_memory_size)
        self.memory_embedding_generator = MemoryEmbeddingGenerator(hidden_dim)


@dataclass
class HMTMemoryState:
    """What HMT carries from one segment to the next, and from one call to the next (`out.memory`).

    Attributes:
        memories: `(B, c, d)` the FIFO cache of memory embeddings `M`, right-aligned: the valid entries of row `b`
            are its last `memory_mask[b].sum()` slots, newest last.
        memory_mask: `(B, c)` bool.
        recent_embeds: `(B, t, d)` the embeddings of the last `t` tokens seen, right-aligned (sensory memory and
            the causal query read them).
        recent_mask: `(B, t)` bool.
        num_segments: `(B,)` segments processed so far.
    """

    memories: torch.Tensor
    memory_mask: torch.Tensor
    recent_embeds: torch.Tensor
    recent_mask: torch.Tensor
    num_segments: torch.Tensor

    @classmethod
    def empty(cls, batch_size: int, hidden_dim: int, recent_tokens: int, device, dtype) -> HMTMemoryState:
        return cls(
            memories=torch.zeros(batch_size, 0, hidden_dim, device=device, dtype=dtype),
            memory_mask=torch.zeros(batch_size, 0, dtype=torch.bool, device=device),
            recent_embeds=torch.zeros(batch_size, recent_tokens, hidden_dim, device=device, dtype=dtype),
            recent_mask=torch.zeros(batch_size, recent_tokens, dtype=torch.bool, device=device),
            num_segments=torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    @property
    def batch_size(self) -> int:
        return self.memories.shape[0]

    @property
    def cache_size(self) -> torch.Tensor:
        """`(B,)` number of cached memory embeddings per sequence."""
        return self.memory_mask.sum(1)

    def newest_memory(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`M_{n-1}` `(B, d)` and whether it exists `(B,)` — the recurrent memory when search is off."""
        if self.memories.shape[1] == 0:
            return self.memories.new_zeros(self.batch_size, self.memories.shape[2]), self.memory_mask.new_zeros(
                self.batch_size
            )
        return self.memories[:, -1], self.memory_mask[:, -1]

    def push(self, new_memory: torch.Tensor, active: torch.Tensor, capacity: int) -> HMTMemoryState:
        """Append `new_memory` `(B, d)` to the cache of the `active` `(B,)` rows, keeping the newest `capacity`."""
        grown = torch.cat([self.memories, new_memory.unsqueeze(1)], 1)
        # Inactive rows (their document ended) get an empty slot in front instead, so they stay right-aligned.
        kept = torch.cat([torch.zeros_like(new_memory).unsqueeze(1), self.memories], 1)
        memories = torch.where(active[:, None, None], grown, kept)
        memory_mask = torch.where(
            active[:, None],
            torch.cat([self.memory_mask, active[:, None]], 1),
            torch.cat([active[:, None], self.memory_mask], 1),
        )
        unused = int((~memory_mask).all(0).long().cumprod(0).sum())  # leading slots empty in every row
        start = max(unused, memories.shape[1] - capacity)
        return self._replace(
            memories=memories[:, start:],
            memory_mask=memory_mask[:, start:],
            num_segments=self.num_segments + active.long(),
        )

    def remember_tokens(self, token_embeds: torch.Tensor, lengths: torch.Tensor) -> HMTMemoryState:
        """Append each row's first `lengths[b]` of `token_embeds` `(B, n, d)` to its recent tokens, keeping `t`."""
        recent = self.recent_embeds.shape[1]
        if recent == 0:
            return self
        embeds = torch.cat([self.recent_embeds, token_embeds], 1)
        mask = torch.cat(
            [self.recent_mask, torch.arange(token_embeds.shape[1], device=lengths.device) < lengths[:, None]], 1
        )
        index = lengths[:, None] + torch.arange(recent, device=lengths.device)
        return self._replace(
            recent_embeds=embeds.gather(1, index.unsqueeze(-1).expand(-1, -1, embeds.shape[-1])),
            recent_mask=mask.gather(1, index),
        )

    def _replace(self, **changes) -> HMTMemoryState:
        return HMTMemoryState(**{f.name: changes.get(f.name, getattr(self, f.name)) for f in fields(self)})

    def apply(self, fn) -> HMTMemoryState:
        """A new state with `fn` applied to every tensor (e.g. `lambda t: t.to(device)`)."""
        return HMTMemoryState(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def detach(self) -> HMTMemoryState:
        """Cut the gradient history (truncated backpropagation through time between calls)."""
        return self.apply(torch.Tensor.detach)

    def to(self, device=None, dtype=None) -> HMTMemoryState:
        """Move to `device`; the floating tensors (memories, recent embeddings) also to `dtype` if given."""
        return self.apply(lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else None))

    def index_select(self, rows: torch.Tensor) -> HMTMemoryState:
        """Keep (and reorder or repeat) the sequences listed in `rows` `(B',)`."""
        return self.apply(lambda t: t.index_select(0, rows.to(t.device)))
