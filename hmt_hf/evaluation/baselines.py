"""The models the evaluation compares, all behind the one [`Scorer`] interface of `scoring.py`.

| scorer | what it is | paper |
|---|---|---|
| [`HMTScorer`] | an HMT, segment by segment, memory carried | HMT |
| [`RMTScorer`] | the same HMT with memory tokens only (no sensory memory, no memory search) | RMT |
| [`ChunkedTransformer`] | the backbone on independent `L`-token chunks | the paper's baseline (its code's "sliding window") |
| [`SlidingWindowTransformer`] | windows of `W` tokens every `S` tokens, each target scored once | a true sliding window |
| [`VanillaTransformer`] | the backbone on the input truncated to its maximum length (head or tail) | seed notes' "Vanilla" |
| [`FullContextTransformer`] | the backbone on the whole input, where it fits | full attention |

`VanillaTransformer` and `SlidingWindowTransformer` keep the names (and arguments) of the seed notebook.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

from .scoring import Scorer, TokenScores, Workload, record_logits

# ---------------------------------------------------------------------------------------------------- HMT / RMT
OVERRIDABLE_FIELDS = (
    "attention_sink",
    "normalize_memory",
    "memory_readout",
    "use_memory_search",
    "use_sensory_memory",
    "sensory_memory_size",
    "num_memory_embeddings",
    "representation_length",
    "retrieval_mode",
)


@contextlib.contextmanager
def hmt_overrides(model, **fields) -> Iterator:
    """Switch `HMTConfig` fields of a live [`HMTForCausalLM`] for the duration of the block (same weights).

    None of these fields sizes a parameter. `sensory_memory_size` and `use_sensory_memory` also resize the
    (parameter-free) sensory-memory module, so `k = 0` or `use_sensory_memory=False` really prepends nothing. The
    new values are validated (`HMTConfig.validate_hmt`) and the old ones restored on exit, even after an error.
    """
    unknown = set(fields) - set(OVERRIDABLE_FIELDS)
    if unknown:
        raise ValueError(f"Cannot switch {sorted(unknown)} on a live model; allowed: {OVERRIDABLE_FIELDS}.")
    config = model.config
    sensory = model.memory.sensory_memory
    saved = {name: getattr(config, name) for name in fields}
    saved_size = sensory.size
    try:
        for name, value in fields.items():
            setattr(config, name, value)
        config.validate_hmt()
        sensory.size = config.sensory_memory_size if config.use_sensory_memory else 0
        yield model
    finally:
        for name, value in saved.items():
            setattr(config, name, value)
        sensory.size = saved_size


class HMTScorer(Scorer):
    """An [`HMTForCausalLM`] scored segment by segment with its memory carried between calls.

    The input is fed in calls of `segments_per_call * L` tokens (a multiple of `L`, so the logits equal those of
    one call over the whole input) with `memory=` carried; before the first requested target the calls keep only
    one position's logits, so the LM head runs where targets are scored. `overrides` switch `HMTConfig` fields on
    the same weights while scoring (RMT, ablations), e.g. `{"use_memory_search": False}`.

    Args:
        model ([`HMTForCausalLM`]).
        name (`str`, *optional*): the name reports use (default "HMT").
        use_memory (`bool`): `False` scores the plain chunked backbone of the same model (the ablation).
        overrides (`dict`, *optional*): `HMTConfig` fields to set while scoring (see [`hmt_overrides`]).
        max_logit_positions (`int`): logits are held for at most this many positions at a time (rounded down to
            whole segments, at least one segment).
        segments_per_call (`int`, *optional*): segments per model call; defaults to what `max_logit_positions`
            allows. `1` times every segment separately (per-segment latency).
    """

    method = "hmt"

    def __init__(
        self,
        model,
        name: str | None = None,
        use_memory: bool = True,
        overrides: dict | None = None,
        max_logit_positions: int = 2048,
        segments_per_call: int | None = None,
    ):
        from ..modeling_hmt import HMTForCausalLM

        if not isinstance(model, HMTForCausalLM):
            raise TypeError(f"{type(self).__name__} needs an HMTForCausalLM, not {type(model).__name__}.")
        self.model = model
        self.use_memory = use_memory
        self.overrides = dict(overrides or {})
        unknown = set(self.overrides) - set(OVERRIDABLE_FIELDS)
        if unknown:
            raise ValueError(
                f"overrides {sorted(unknown)} cannot be switched on a live model; allowed: {OVERRIDABLE_FIELDS}."
            )
        if segments_per_call is not None and (
            isinstance(segments_per_call, bool) or not isinstance(segments_per_call, int) or segments_per_call < 1
        ):
            raise ValueError(f"segments_per_call={segments_per_call!r} must be an int >= 1.")
        self.segments_per_call = segments_per_call
        super().__init__(name, max_logit_positions)
        with hmt_overrides(model, **self.overrides):  # invalid overrides fail here, not mid-evaluation
            pass

    def default_name(self) -> str:
        return "HMT" if self.use_memory else "HMT (no memory)"

    @property
    def language_model(self):
        return self.model

    @property
    def retrieval_mode(self) -> str | None:
        """The retrieval mode in force (None when no memory search runs, so the mode cannot matter)."""
        fields = self.effective_config()
        return fields["retrieval_mode"] if self.use_memory and fields["use_memory_search"] else None

    def effective_config(self) -> dict:
        """The HMT fields in force while scoring: the model's config with `overrides` applied."""
        config = self.model.config
        return {name: getattr(config, name) for name in (*OVERRIDABLE_FIELDS, "segment_length")} | self.overrides

    def describe(self) -> dict:
        checkpoint = getattr(self.model.config, "_name_or_path", None) or None
        return {
            **super().describe(),
            "use_memory": self.use_memory,
            **self.effective_config(),
            "retrieval_mode": self.retrieval_mode,
            "backbone": getattr(self.model.config.text_config, "_name_or_path", None)
            or self.model.config.text_config.model_type,
            "checkpoint": checkpoint,
            "segments_per_call": self._segments_per_call(),
        }

    def step_description(self) -> str:
        count = self._segments_per_call()
        return f"one call of {count} segment{'s' if count > 1 else ''} (L={self.model.config.segment_length})"

    def _segments_per_call(self) -> int:
        if self.segments_per_call is not None:
            return self.segments_per_call
        return max(1, self.max_logit_positions // self.model.config.segment_length)

    def _score(self, input_ids, first_target, scores):
        model = self.model
        with hmt_overrides(model, **self.overrides):
            length = model.config.segment_length
            rows, total = input_ids.shape
            call = self._segments_per_call() * length
            device = self.device
            # Position p predicts target p + 1, so logits are needed from position first_target - 1 on. Calls start
            # on segment boundaries: chunked calls then give exactly one call's logits.
            first_logit = first_target - 1
            start = first_logit // length * length
            memory = None
            position = 0
            while self.use_memory and position < start:  # the prefix only builds memory (no chunk is independent)
                end = min(position + call, start)
                with self._timed(scores):
                    out = model(input_ids[:, position:end].to(device), memory=memory, logits_to_keep=1)
                memory = out.memory
                self._count(scores.workload, position, end, with_logits=False, rows=rows)
                position = end
            position = start
            while position < total - 1:
                end = min(position + call, total)
                with self._timed(scores):
                    out = model(input_ids[:, position:end].to(device), memory=memory, use_memory=self.use_memory)
                memory = out.memory if self.use_memory else None
                self._count(scores.workload, position, end, with_logits=True, rows=rows)
                keep_from = max(first_logit, position)
                record_logits(scores, out.logits[:, keep_from - position :], input_ids, keep_from)
                del out
                position = end

    def _count(self, workload: Workload, start: int, end: int, with_logits: bool, rows: int):
        """Count the backbone positions of segments `[start, end)` (Eq. 1 and Eq. 4-5 passes)."""
        config = self.model.config
        length, j = config.segment_length, config.representation_length
        sensory = config.sensory_memory_size if config.use_sensory_memory else 0
        for segment_start in range(start, end, length):
            tokens = min(length, end - segment_start)
            logits = tokens if with_logits else 0
            if not self.use_memory:
                workload.add_pass(tokens, logit_positions=logits, rows=rows)
                continue
            if config.use_memory_search and segment_start > 0:  # Eq. 1 runs once the cache is non-empty
                read = min(j, tokens) if config.retrieval_mode == "paper" else min(j, segment_start)
                workload.add_pass(read + 2 + config.sink_positions, rows=rows)
            workload.add_pass(
                2 + config.sink_positions + min(sensory, segment_start) + tokens, logit_positions=logits, rows=rows
            )
        if not with_logits:
            workload.logit_positions += rows  # logits_to_keep=1


class RMTScorer(HMTScorer):
    """RMT (Bulatov et al., 2022) as the paper compares it: memory tokens only — no sensory memory, no memory
    search — on the given HMT's weights (a config switch; pass an RMT-trained checkpoint for the paper's RMT)."""

    method = "rmt"

    def __init__(self, model, name: str | None = None, overrides: dict | None = None, **kwargs):
        overrides = {"use_memory_search": False, "use_sensory_memory": False, **(overrides or {})}
        super().__init__(model, name=name, overrides=overrides, **kwargs)

    def default_name(self) -> str:
        return "RMT"


# ---------------------------------------------------------------------------------------------------- backbones
def unwrap_backbone(model) -> torch.nn.Module:
    """The causal LM to run: an HMT's `backbone`, or the model itself."""
    if hasattr(model, "memory") and hasattr(model, "backbone"):
        return model.backbone
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise TypeError(
            f"{type(model).__name__} is not a causal LM with an LM head; pass an AutoModelForCausalLM model "
            "(or an HMTForCausalLM, whose backbone is used)."
        )
    return model


def max_positions(backbone) -> int | None:
    """The backbone's maximum number of positions (`max_position_embeddings`); None where unlimited (ALiBi)."""
    config = backbone.config
    for attribute in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _check_positive_int(label: str, value, minimum: int = 1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{label}={value!r} must be an int >= {minimum}.")


class BackboneScorer(Scorer):
    """Base of the baselines: the plain backbone run over windows of the input."""

    def __init__(self, backbone, name: str | None = None, max_logit_positions: int = 1024):
        self.backbone = unwrap_backbone(backbone)
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(self.backbone.forward).parameters
        super().__init__(name, max_logit_positions)

    @property
    def language_model(self):
        return self.backbone

    def describe(self) -> dict:
        backbone = getattr(self.backbone.config, "_name_or_path", None) or self.backbone.config.model_type
        return {**super().describe(), "backbone": backbone}

    def _check_window(self, label: str, size: int):
        limit = max_positions(self.backbone)
        if limit is not None and size > limit:
            raise ValueError(f"{label}={size} exceeds the backbone's max_position_embeddings={limit}; lower it.")

    def _score_window(
        self, input_ids: torch.Tensor, start: int, end: int, first_logit: int, last_logit: int, scores: TokenScores
    ):
        """Run the backbone on `input_ids[:, start:end]` alone (no other context) and score the targets predicted
        by positions `[first_logit, last_logit)` (absolute; position `p` predicts target `p + 1`).

        A window of at most `max_logit_positions` tokens is one pass; a longer one runs in pieces through the
        backbone's KV cache (the same causal attention, without `(n, V)` logits at once). The LM head runs only on
        the positions whose logits are used.
        """
        last_logit = min(last_logit, end, input_ids.shape[1] - 1)
        if first_logit >= last_logit:
            return
        if not start <= first_logit:
            raise ValueError(f"first_logit={first_logit} lies before the window start {start}.")
        device, rows = self.device, input_ids.shape[0]
        with self._timed(scores):
            cache = None
            for piece_start in range(start, end, self.max_logit_positions):
                piece_end = min(piece_start + self.max_logit_positions, end)
                wanted_from, wanted_to = max(first_logit, piece_start), min(last_logit, piece_end)
                keep = max(wanted_to - wanted_from, 0)
                # logits_to_keep keeps the *last* n positions, so keep from wanted_from to the piece's end.
                kwargs = (
                    {"logits_to_keep": piece_end - wanted_from if keep else 1} if self._takes_logits_to_keep else {}
                )
                more_pieces = piece_end < end
                if more_pieces or cache is not None:
                    out = self.backbone(
                        input_ids[:, piece_start:piece_end].to(device), past_key_values=cache, use_cache=True, **kwargs
                    )
                    cache = out.past_key_values
                else:
                    out = self.backbone(input_ids[:, piece_start:piece_end].to(device), use_cache=False, **kwargs)
                scores.workload.add_pass(piece_end - piece_start, piece_start - start, logit_positions=keep, rows=rows)
                if keep:
                    logits = out.logits[:, out.logits.shape[1] - (piece_end - wanted_from) :]
                    record_logits(scores, logits[:, :keep], input_ids, wanted_from)
                del out


class ChunkedTransformer(BackboneScorer):
    """The paper's baseline (what its code calls "sliding window"): the backbone on independent chunks of
    `chunk_length` tokens, no memory.

    Target `t` is predicted from the tokens of its predecessor's chunk up to `t - 1`: the first token of a chunk is
    predicted by the previous chunk's last position. This is `HMTForCausalLM(..., use_memory=False)` with
    `segment_length = chunk_length`, for any causal LM.
    """

    method = "chunked"

    def __init__(self, backbone, chunk_length: int, name: str | None = None, max_logit_positions: int = 1024):
        _check_positive_int("chunk_length", chunk_length)
        self.chunk_length = chunk_length
        super().__init__(backbone, name, max_logit_positions)
        self._check_window("chunk_length", chunk_length)

    def default_name(self) -> str:
        return "Chunked"

    def describe(self) -> dict:
        return {**super().describe(), "chunk_length": self.chunk_length}

    def step_description(self) -> str:
        return f"one chunk of {self.chunk_length} tokens"

    def _score(self, input_ids, first_target, scores):
        total, length = input_ids.shape[1], self.chunk_length
        first_logit = first_target - 1
        for start in range(first_logit // length * length, total - 1, length):
            end = min(start + length, total)
            self._score_window(input_ids, start, end, max(first_logit, start), end, scores)


class SlidingWindowTransformer(BackboneScorer):
    """A true sliding window: windows of `window_size` tokens every `stride` tokens; each target scored exactly
    once.

    Window `w` covers `[w * stride, w * stride + window_size)` (clipped to the input). The first window scores
    all its targets; every later window scores only the targets after the previous window's end (its last
    `stride` targets), each predicted with at least `window_size - stride` and at most `window_size - 1` tokens of
    left context. Windows that hold no requested target are not run.

    Args:
        backbone: a causal LM (or an HMT, whose backbone is used).
        window_size (`int`): `W`, at most the backbone's `max_position_embeddings`.
        stride (`int`): `S`, `1 <= S < W` (`S = W` would be independent chunks: use `ChunkedTransformer`).
    """

    method = "sliding_window"

    def __init__(
        self, backbone, window_size: int, stride: int, name: str | None = None, max_logit_positions: int = 1024
    ):
        _check_positive_int("window_size", window_size, 2)
        _check_positive_int("stride", stride)
        if stride >= window_size:
            raise ValueError(
                f"stride={stride} must be smaller than window_size={window_size}: a window that starts where the "
                "previous one ended has no context for its first token (stride = window_size is ChunkedTransformer)."
            )
        self.window_size, self.stride = window_size, stride
        super().__init__(backbone, name, max_logit_positions)
        self._check_window("window_size", window_size)

    def default_name(self) -> str:
        return "Sliding Window"

    def describe(self) -> dict:
        return {**super().describe(), "window_size": self.window_size, "stride": self.stride}

    def step_description(self) -> str:
        return f"one window of {self.window_size} tokens ({self.stride} new targets)"

    def windows(self, length: int) -> list[tuple[int, int, int]]:
        """`(start, end, first_target)` of each window over an input of `length` tokens. The windows' target
        ranges `[first_target, end)` partition `[1, length)`."""
        result, scored_until, start = [], 1, 0
        while scored_until < length:
            end = min(start + self.window_size, length)
            result.append((start, end, scored_until))
            scored_until = end
            start += self.stride
        return result

    def _score(self, input_ids, first_target, scores):
        for start, end, window_first_target in self.windows(input_ids.shape[1]):
            if end <= first_target:
                continue
            first_logit = max(window_first_target, first_target) - 1
            self._score_window(input_ids, start, end, first_logit, end - 1, scores)


class VanillaTransformer(BackboneScorer):
    """The backbone on the input truncated to `max_length` tokens: the first (`truncation_strategy="head"`) or the
    last (`"tail"`) `max_length` tokens. Targets outside the kept tokens are NOT scored: `TokenScores.num_unscored`
    counts them and every report prints that count. Inputs that fit are scored with full context.

    Args:
        backbone: a causal LM (or an HMT, whose backbone is used).
        max_length (`int`, *optional*): defaults to the backbone's `max_position_embeddings`.
        truncation_strategy (`str`): `"tail"` (keep the most recent tokens, the default) or `"head"`.
    """

    method = "vanilla"

    def __init__(
        self,
        backbone,
        max_length: int | None = None,
        truncation_strategy: str = "tail",
        name: str | None = None,
        max_logit_positions: int = 1024,
    ):
        super().__init__(backbone, name, max_logit_positions)
        if max_length is None:
            max_length = max_positions(self.backbone)
            if max_length is None:
                raise ValueError(
                    f"{type(self.backbone).__name__} has no max_position_embeddings; pass max_length explicitly."
                )
        _check_positive_int("max_length", max_length, 2)
        self._check_window("max_length", max_length)
        if truncation_strategy not in ("head", "tail"):
            raise ValueError(f"truncation_strategy={truncation_strategy!r} must be 'head' or 'tail'.")
        self.max_length, self.truncation_strategy = max_length, truncation_strategy

    def default_name(self) -> str:
        return "Vanilla"

    def describe(self) -> dict:
        return {**super().describe(), "max_length": self.max_length, "truncation_strategy": self.truncation_strategy}

    def step_description(self) -> str:
        return f"one forward pass over at most {self.max_length} tokens"

    def kept_span(self, length: int) -> tuple[int, int]:
        """`(start, end)` of the tokens the model sees of an input of `length` tokens."""
        if length <= self.max_length:
            return 0, length
        return (0, self.max_length) if self.truncation_strategy == "head" else (length - self.max_length, length)

    def _score(self, input_ids, first_target, scores):
        start, end = self.kept_span(input_ids.shape[1])
        # Targets inside the kept span only: its first token has no context, tokens past it were never input.
        self._score_window(input_ids, start, end, max(first_target - 1, start), end - 1, scores)


class FullContextTransformer(BackboneScorer):
    """The backbone over the whole input: every target sees every earlier token. Refuses inputs longer than
    `max_position_embeddings` with an error naming the alternatives; it never truncates."""

    method = "full_context"

    def default_name(self) -> str:
        return "Full Context"

    def step_description(self) -> str:
        return "one forward pass over the whole input"

    @property
    def max_input_length(self) -> int | None:
        return max_positions(self.backbone)

    def _score(self, input_ids, first_target, scores):
        total = input_ids.shape[1]
        self._score_window(input_ids, 0, total, first_target - 1, total - 1, scores)


BASELINE_METHODS = ("hmt", "rmt", "chunked", "sliding_window", "vanilla", "full_context")
