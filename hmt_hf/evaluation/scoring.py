"""One scoring interface for every model the evaluation compares, and the paper's test-sample protocol.

Every model — HMT, RMT, the chunked backbone, a sliding window, a truncated ("vanilla") backbone, the full-context
backbone — is a [`Scorer`] (the models are in `baselines.py`): `scorer.score(input_ids)` returns a [`TokenScores`], the negative log-likelihood (nats)
and the rank of every scored target token. Perplexity, bits-per-byte and top-k accuracy are then computed from
those numbers the same way for every model (`hmt_hf/evaluation/metrics/`).

Conventions (shapes: `B` batch, `T` sequence length, `V` vocabulary):

- Target position `t` is the token `input_ids[:, t]`, predicted from tokens before it. Position 0 has no context
  and is never a target, so a fully scored sequence has `T - 1` targets.
- `first_target` asks for the targets `t >= first_target` only; a scorer may then skip work that cannot change
  them (the LM head on earlier positions, windows that hold none of them). Targets a scorer cannot score (tokens a
  truncating baseline dropped) stay unscored and are *counted* (`TokenScores.num_unscored`), never hidden.
- Long inputs are never turned into `(T, V)` logits: logits exist for at most `max_logit_positions` positions at a
  time.

The paper's protocol (§4, reference code): test samples of `test_length + L` tokens cut from the concatenated test
documents with stride `L`; the perplexity of each sample's last segment, averaged over samples
([`make_samples`], `protocol="last_segment"`). `protocol="all_tokens"` scores every target of each sample instead.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

PROTOCOLS = ("last_segment", "all_tokens")
PROTOCOL_DESCRIPTIONS = {
    "last_segment": (
        "paper protocol: samples of test_length + L tokens from the concatenated test documents, stride L; "
        "perplexity over the L-1 next-token predictions made inside each sample's last segment (the targets of "
        "HMTConfig.loss_on_last_segment_only), token-weighted over samples"
    ),
    "all_tokens": (
        "all-token protocol: non-overlapping samples of test_length + L tokens (unless a stride is set); "
        "perplexity over every target of each sample (all tokens but the first), token-weighted over samples"
    ),
}
# Ranks are kept exactly up to this value; larger ranks are clipped (top-k accuracy is defined for k <= it).
MAX_TRACKED_RANK = 100
# How `Workload` counts become FLOPs (`evaluator._flops_estimate`); the efficiency report prints it.
FLOPS_FORMULA = (
    "forward FLOPs = 2·P_body·positions + 4·n_layers·d_attn·(attended query-key pairs) + 2·d·V·(LM-head positions); "
    "P_body = backbone parameters without embedding/LM-head matrices; positions include HMT's memory slots, sensory "
    "tokens and representation-encoding passes"
)


# ---------------------------------------------------------------------------------------------------- results


@dataclass
class Workload:
    """Work a scorer did, counted as it ran, for the analytic FLOPs estimate.

    Attributes:
        positions: backbone positions computed (every pass, including HMT's memory slots, sensory tokens and
            representation passes; positions read from a KV cache are not recomputed and not counted).
        attended_pairs: (query, key) pairs of causal attention summed over passes.
        logit_positions: positions where the LM head ran.
        passes: backbone calls.
    """

    positions: int = 0
    attended_pairs: int = 0
    logit_positions: int = 0
    passes: int = 0

    def add_pass(self, new_positions: int, past_positions: int = 0, logit_positions: int = 0, rows: int = 1):
        """Count one causal pass over `new_positions` positions after `past_positions` cached ones, `rows` times."""
        pairs = new_positions * past_positions + new_positions * (new_positions + 1) // 2
        self.positions += rows * new_positions
        self.attended_pairs += rows * pairs
        self.logit_positions += rows * logit_positions
        self.passes += rows

    def __iadd__(self, other: Workload) -> Workload:
        self.positions += other.positions
        self.attended_pairs += other.attended_pairs
        self.logit_positions += other.logit_positions
        self.passes += other.passes
        return self

    def to_dict(self) -> dict:
        return {
            "positions": self.positions,
            "attended_pairs": self.attended_pairs,
            "logit_positions": self.logit_positions,
            "passes": self.passes,
        }


@dataclass
class TokenScores:
    """Per-target scores of a batch, aligned with the input positions.

    Attributes:
        nll (`torch.FloatTensor` of shape `(B, T)`): `-log p(x_t | context)` in nats at scored targets, 0 elsewhere.
        target_rank (`torch.LongTensor` of shape `(B, T)`): number of vocabulary entries with a strictly higher
            logit than the target (0 = the argmax is right), clipped at `MAX_TRACKED_RANK`; -1 where not scored.
        scored (`torch.BoolTensor` of shape `(B, T)`): targets that were scored.
        requested (`torch.BoolTensor` of shape `(B, T)`): targets that were asked for (`first_target` on, real
            tokens). `requested & ~scored` are the targets the scorer could not score (e.g. truncated away).
        step_seconds (`list[float]`): wall-clock seconds of each model call (an HMT chunk of segments, a window, a
            chunk), for latency percentiles.
        workload ([`Workload`]): positions and attention pairs computed, for the FLOPs estimate.
    """

    nll: torch.Tensor
    target_rank: torch.Tensor
    scored: torch.Tensor
    requested: torch.Tensor
    step_seconds: list[float] = field(default_factory=list)
    workload: Workload = field(default_factory=Workload)

    @classmethod
    def empty(cls, batch_size: int, length: int, requested: torch.Tensor) -> TokenScores:
        return cls(
            nll=torch.zeros(batch_size, length, dtype=torch.float32),
            target_rank=torch.full((batch_size, length), -1, dtype=torch.long),
            scored=torch.zeros(batch_size, length, dtype=torch.bool),
            requested=requested.clone(),
        )

    def num_scored(self) -> torch.Tensor:
        """`(B,)` scored targets per row."""
        return self.scored.sum(1)

    def num_unscored(self) -> torch.Tensor:
        """`(B,)` requested targets the scorer could not score (counted, so no report hides them)."""
        return (self.requested & ~self.scored).sum(1)

    def nll_sum(self) -> torch.Tensor:
        """`(B,)` summed NLL in nats over scored targets (float64)."""
        return (self.nll.double() * self.scored).sum(1)

    def rank_counts(self, max_rank: int = MAX_TRACKED_RANK) -> torch.Tensor:
        """`(B, max_rank + 1)` histogram of target ranks (last bin: rank >= max_rank). Top-k accuracy is
        `counts[:, :k].sum(1) / num_scored`."""
        ranks = self.target_rank.clamp(max=max_rank)
        counts = torch.zeros(ranks.shape[0], max_rank + 1, dtype=torch.long)
        counts.scatter_add_(1, ranks.clamp(min=0), self.scored.long())
        return counts

    def byte_count(self, byte_lengths: torch.Tensor) -> torch.Tensor:
        """`(B,)` UTF-8 bytes of the scored targets, given per-token byte lengths `(B, T)` or `(T,)`."""
        if byte_lengths.dim() == 1:
            byte_lengths = byte_lengths.expand_as(self.scored)
        return (byte_lengths.long() * self.scored).sum(1)


def _target_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NLL `(B, n)` (float32, nats) and rank `(B, n)` of `targets` `(B, n)` under `logits` `(B, n, V)`."""
    logits = logits.float()
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    target_logits = logits.gather(-1, targets.unsqueeze(-1))
    rank = (logits > target_logits).sum(-1).clamp(max=MAX_TRACKED_RANK)
    return nll, rank


def record_logits(scores: TokenScores, logits: torch.Tensor, input_ids: torch.Tensor, first_position: int):
    """Score the targets predicted by `logits` `(B, n, V)`, which hold positions `first_position ...`: the logits
    at position `p` predict target `p + 1`."""
    count = logits.shape[1]
    targets = input_ids[:, first_position + 1 : first_position + 1 + count]
    nll, rank = _target_scores(logits[:, : targets.shape[1]], targets)
    span = slice(first_position + 1, first_position + 1 + targets.shape[1])
    scores.nll[:, span] = nll.cpu()
    scores.target_rank[:, span] = rank.cpu()
    scores.scored[:, span] = True


# ---------------------------------------------------------------------------------------------------- scorers
class Scorer:
    """A model that scores target tokens. Subclasses implement `_score(input_ids, first_target, scores)` for an
    unpadded batch and `describe()`; padding is handled here (each padded row is scored on its own)."""

    #: Short method name used in reports and cache keys ("hmt", "chunked", "sliding_window", ...).
    method: str = "scorer"

    def __init__(self, name: str | None = None, max_logit_positions: int = 1024):
        if isinstance(max_logit_positions, bool) or not isinstance(max_logit_positions, int):
            raise ValueError(f"max_logit_positions={max_logit_positions!r} must be an int >= 1.")
        if max_logit_positions < 1:
            raise ValueError(f"max_logit_positions={max_logit_positions} must be >= 1.")
        self.name = name or self.default_name()
        self.max_logit_positions = max_logit_positions

    def default_name(self) -> str:
        return type(self).__name__

    # -- what reports and caches need
    def describe(self) -> dict:
        """Method and parameters, JSON-serialisable (reports; part of the resume-cache fingerprint)."""
        return {"name": self.name, "method": self.method}

    def fingerprint(self) -> str:
        return json.dumps(self.describe(), sort_keys=True, default=str)

    def step_description(self) -> str:
        """What one timed step (`TokenScores.step_seconds` entry) is, for latency reports."""
        return "one model call"

    @property
    def max_input_length(self) -> int | None:
        """Longest input this scorer accepts (None: any length)."""
        return None

    def fits(self, length: int) -> bool:
        limit = self.max_input_length
        return limit is None or length <= limit

    @property
    def language_model(self) -> torch.nn.Module:
        """The module whose parameters run (for device, dtype and parameter counts)."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        parameter = next(self.language_model.parameters(), None)
        return parameter.device if parameter is not None else torch.device("cpu")

    # -- scoring
    def score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, first_target: int = 1
    ) -> TokenScores:
        """Score the targets `t >= first_target` of `input_ids`.

        Args:
            input_ids (`torch.LongTensor` of shape `(B, T)` or `(T,)`).
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 for real tokens, 0 for padding
                (anywhere). Each padded row is scored on its own real tokens; `first_target` must then be 1.
            first_target (`int`): first target position asked for (>= 1).

        Returns:
            [`TokenScores`] aligned with `input_ids` (on CPU).

        The model runs in eval mode under `torch.inference_mode()`; a model that was training is put back in
        training mode afterwards.
        """
        module = self.language_model
        was_training = module.training
        module.eval()
        try:
            with torch.inference_mode():
                return self._score_batch(input_ids, attention_mask, first_target)
        finally:
            module.train(was_training)

    def _score_batch(self, input_ids, attention_mask, first_target) -> TokenScores:
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
            attention_mask = None if attention_mask is None else attention_mask[None]
        if input_ids.dim() != 2 or input_ids.numel() == 0:
            raise ValueError(f"input_ids must be a non-empty (B, T) tensor, got shape {tuple(input_ids.shape)}.")
        if input_ids.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
        batch_size, length = input_ids.shape
        if isinstance(first_target, bool) or not isinstance(first_target, int) or first_target < 1:
            raise ValueError(f"first_target={first_target!r} must be an int >= 1 (position 0 has no context).")
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids {tuple(input_ids.shape)}."
            )
        input_ids = input_ids.long().cpu()
        if attention_mask is None or bool(attention_mask.bool().all()):
            requested = torch.zeros(batch_size, length, dtype=torch.bool)
            requested[:, first_target:] = True
            scores = TokenScores.empty(batch_size, length, requested)
            if first_target < length:
                self._check_length(length)
                self._score(input_ids, first_target, scores)
            return scores
        if first_target != 1:
            raise ValueError("first_target must be 1 when the batch is padded (targets are per row then).")
        mask = attention_mask.bool().cpu()
        requested = mask.clone()
        first_real = mask.long().argmax(1)
        requested[torch.arange(batch_size), first_real] = False  # each row's first real token has no context
        scores = TokenScores.empty(batch_size, length, requested)
        for row in range(batch_size):
            positions = mask[row].nonzero().squeeze(1)
            if positions.numel() < 2:
                continue
            self._check_length(positions.numel())
            row_scores = TokenScores.empty(1, positions.numel(), requested[row, positions][None])
            self._score(input_ids[row, positions][None], 1, row_scores)
            scores.nll[row, positions] = row_scores.nll[0]
            scores.target_rank[row, positions] = row_scores.target_rank[0]
            scores.scored[row, positions] = row_scores.scored[0]
            scores.step_seconds += row_scores.step_seconds
            scores.workload += row_scores.workload
        return scores

    def _check_length(self, length: int):
        if not self.fits(length):
            raise ValueError(
                f"{self.name}: an input of {length} tokens exceeds this model's maximum of {self.max_input_length} "
                "positions. Use VanillaTransformer (truncation), SlidingWindowTransformer, ChunkedTransformer or HMT "
                "for longer inputs."
            )

    def _score(self, input_ids: torch.Tensor, first_target: int, scores: TokenScores):
        """Fill `scores` for the unpadded CPU batch `input_ids` `(B, T)`, targets `>= first_target`."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _timed(self, scores: TokenScores) -> Iterator[None]:
        """Time one model call into `scores.step_seconds` (synchronising CUDA so the time is the call's)."""
        device = self.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        scores.step_seconds.append(time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------------- protocol
@dataclass(frozen=True)
class EvalSample:
    """One test sample: token ids `(T,)`, their UTF-8 byte lengths `(T,)` (None when unknown) and the first target
    scored. `test_length` is the input length it stands for (the x axis of the paper's figures)."""

    input_ids: torch.Tensor
    byte_lengths: torch.Tensor | None
    first_target: int
    index: int
    start: int
    test_length: int
    protocol: str

    @property
    def num_targets(self) -> int:
        return self.input_ids.shape[0] - self.first_target

    def token_digest(self) -> str:
        """A short hash of the token ids (part of the resume-cache key, so changed data is never reused)."""
        import hashlib

        return hashlib.sha1(self.input_ids.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def num_protocol_samples(
    stream_length: int,
    test_length: int,
    segment_length: int,
    protocol: str = "last_segment",
    stride: int | None = None,
) -> int:
    """How many samples [`make_samples`] can cut from a stream of `stream_length` tokens."""
    sample_length = test_length + segment_length
    stride = _default_stride(protocol, sample_length, segment_length) if stride is None else stride
    if stream_length < sample_length:
        return 0
    return (stream_length - sample_length) // stride + 1


def _default_stride(protocol: str, sample_length: int, segment_length: int) -> int:
    return segment_length if protocol == "last_segment" else sample_length


def make_samples(
    token_ids: torch.Tensor | Sequence[int],
    test_length: int,
    segment_length: int,
    protocol: str = "last_segment",
    num_samples: int | None = None,
    stride: int | None = None,
    byte_lengths: torch.Tensor | Sequence[int] | None = None,
) -> list[EvalSample]:
    """Cut test samples from a token stream (the concatenated test documents), following the paper's protocol.

    Each sample has `test_length + segment_length` tokens; sample `i` starts at `i * stride` (default: `L` for
    `"last_segment"`, as the paper; the sample length — no overlap — for `"all_tokens"`). `"last_segment"` scores
    the targets inside the sample's last segment (positions `last_start + 1 ...`, with
    `last_start = (T - 1) // L * L`); `"all_tokens"` scores targets `1 ... T - 1`.

    Raises a `ValueError` when the stream is too short for one sample (naming both lengths): nothing is padded.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r} is invalid: use one of {PROTOCOLS}.")
    for label, value in (("test_length", test_length), ("segment_length", segment_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label}={value!r} must be an int >= 1.")
    token_ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
    if byte_lengths is not None:
        byte_lengths = torch.as_tensor(byte_lengths, dtype=torch.long).reshape(-1)
        if byte_lengths.shape != token_ids.shape:
            raise ValueError(f"byte_lengths has {byte_lengths.numel()} entries for {token_ids.numel()} tokens.")
    sample_length = test_length + segment_length
    stride = _default_stride(protocol, sample_length, segment_length) if stride is None else stride
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride={stride!r} must be an int >= 1.")
    available = num_protocol_samples(token_ids.numel(), test_length, segment_length, protocol, stride)
    if available == 0:
        raise ValueError(
            f"A test sample of test_length={test_length} + segment_length={segment_length} = {sample_length} tokens "
            f"needs a token stream at least that long; this one has {token_ids.numel()} tokens. Use more documents "
            "or a shorter test_length."
        )
    count = available if num_samples is None else min(num_samples, available)
    first_target = (sample_length - 1) // segment_length * segment_length + 1 if protocol == "last_segment" else 1
    samples = []
    for index in range(count):
        start = index * stride
        samples.append(
            EvalSample(
                input_ids=token_ids[start : start + sample_length],
                byte_lengths=None if byte_lengths is None else byte_lengths[start : start + sample_length],
                first_target=first_target,
                index=index,
                start=start,
                test_length=test_length,
                protocol=protocol,
            )
        )
    return samples
