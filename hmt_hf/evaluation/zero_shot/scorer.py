"""`ContinuationScorer`: log-likelihood of continuations after contexts, batched, with HMT's context memory built once
per context and shared by its candidates."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------- scoring
@dataclass
class ContinuationScore:
    """The log-likelihood of one continuation given its context.

    Attributes:
        logprob: `sum_t log p(continuation_t | context, continuation_<t)` (natural log).
        num_tokens: number of continuation tokens scored.
        is_greedy: whether every continuation token is the model's argmax.
        truncated_tokens: context tokens dropped from the left to fit `max_length` (0 normally).
    """

    logprob: float
    num_tokens: int
    is_greedy: bool
    truncated_tokens: int = 0


@dataclass
class _Request:
    context: list[int]
    continuation: list[int]
    group: int = 0
    cut: int = 0  # context tokens run ahead of time into memory (HMT)
    truncated: int = 0


def hmt_segment_length(model) -> int | None:
    """`segment_length` if `model` is an HMT (also behind a PEFT wrapper), else None."""
    config = getattr(model, "config", None)
    if hasattr(model, "empty_memory") and isinstance(getattr(config, "segment_length", None), int):
        return config.segment_length
    return None


def _is_token_scorer(model) -> bool:
    """A `hmt_hf.evaluation` `Scorer` (HMTScorer, VanillaTransformer, SlidingWindowTransformer, ...): an object
    whose `score(input_ids, first_target=...)` returns per-token NLLs, rather than a module returning logits."""
    return (
        not isinstance(model, torch.nn.Module)
        and callable(getattr(model, "score", None))
        and hasattr(model, "language_model")
    )


def underlying_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _model_max_length(model) -> int | None:
    """The longest input a plain model takes (from its config); None for HMT or when unknown (e.g. ALiBi)."""
    if hmt_segment_length(model) is not None or _is_token_scorer(model):
        return None  # HMT reads any length; a Scorer applies its own policy (truncation, windows, chunks)
    config = getattr(underlying_model(model), "config", None)
    if config is None:
        return None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class ContinuationScorer:
    """Scores `(context, continuation)` requests with a causal LM (see the module docstring for the conventions).

    Args:
        model: an `HMTForCausalLM`, a `PreTrainedModel` with an LM head, or a module with the same call interface.
        tokenizer: the model's tokenizer.
        batch_size: rows (candidate continuations) per forward pass.
        max_length: `"model"` (default): a plain model's `max_position_embeddings` and no limit for HMT; an int:
            that limit; None: no limit. Longer inputs lose context tokens from the left, counted in
            `truncated_tokens` (and logged); a continuation that does not fit alone is an error.
        prepend_bos: put the BOS token in front of every context. None: do so if the tokenizer adds BOS itself.
        share_context_memory: HMT only: run each context's full segments once and reuse the memory for all its
            continuations (exact; see module docstring).
        model_kwargs: extra keyword arguments for every forward call (e.g. `{"use_memory": False}` for HMT's
            chunked-backbone ablation).
        progress: show tqdm progress bars.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 8,
        max_length: int | str | None = "model",
        prepend_bos: bool | None = None,
        share_context_memory: bool = True,
        model_kwargs: Mapping | None = None,
        progress: bool = True,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be an int >= 1.")
        if max_length == "model":
            max_length = _model_max_length(model)
        elif max_length is not None and (not isinstance(max_length, int) or max_length < 2):
            raise ValueError(f"max_length={max_length!r} must be 'model', None or an int >= 2.")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_length, self.progress = batch_size, max_length, progress
        self.model_kwargs = dict(model_kwargs or {})
        self.token_scorer = _is_token_scorer(model)
        self.segment_length = None if self.token_scorer else hmt_segment_length(model)
        self.share_context_memory = (
            share_context_memory
            and self.segment_length is not None
            and self.model_kwargs.get("use_memory") is not False
        )
        if self.token_scorer:
            if self.model_kwargs:
                raise ValueError("model_kwargs cannot be passed to a Scorer; configure the Scorer itself instead.")
            self._takes_logits_to_keep = self._takes_position_ids = False
            self.device = model.device
        else:
            base = underlying_model(model)
            parameters = inspect.signature(base.forward).parameters
            self._takes_logits_to_keep = "logits_to_keep" in parameters
            # HMT restarts positions inside every segment itself; plain models need positions that skip left padding.
            self._takes_position_ids = "position_ids" in parameters and self.segment_length is None
            parameter = next(iter(base.parameters()), None)
            self.device = parameter.device if parameter is not None else torch.device("cpu")
        if prepend_bos is None:
            bos = getattr(tokenizer, "bos_token_id", None)
            prepend_bos = bos is not None and tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos]
        self.prepend_bos = prepend_bos
        self._context_cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ tokenisation
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's `_encode_pair`: context ids, and the continuation ids as the difference between the encodings
        of `context + continuation` and `context` (after moving the context's trailing whitespace over). The BOS
        token (`prepend_bos`) goes in front of the context; an empty context becomes BOS (or EOS) alone."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if context not in self._context_cache:
            self._context_cache[context] = self._encode(context)
        text_ids = self._context_cache[context]
        continuation_ids = self._encode(context + continuation)[len(text_ids) :]
        if not continuation_ids:
            raise ValueError(
                f"The continuation {continuation!r} encodes to no tokens after context {context[-40:]!r}."
            )
        context_ids = ([self.tokenizer.bos_token_id] if self.prepend_bos else []) + text_ids
        if not context_ids:
            stand_in = getattr(self.tokenizer, "bos_token_id", None)
            stand_in = stand_in if stand_in is not None else getattr(self.tokenizer, "eos_token_id", None)
            if stand_in is None:
                raise ValueError(
                    "A context is empty and the tokenizer has no BOS/EOS token to stand in for it; every continuation "
                    "needs at least one token before it."
                )
            context_ids = [stand_in]
        return context_ids, continuation_ids

    # ------------------------------------------------------------------ scoring
    def score(self, requests: Sequence[tuple[str, str]], desc: str = "scoring") -> list[ContinuationScore]:
        """`ContinuationScore` of every `(context, continuation)` request, in order."""
        return self.score_encoded(
            [self.encode_pair(context, continuation) for context, continuation in requests], desc
        )

    def score_encoded(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], desc: str = "scoring"
    ) -> list[ContinuationScore]:
        """`ContinuationScore` of already tokenised `(context_ids, continuation_ids)` requests (e.g. lm-eval's
        `_encode_pair` output), in order. The context needs at least one token, the continuation too."""
        for context, continuation in requests:
            if not context or not continuation:
                raise ValueError(
                    f"A request has {len(context)} context and {len(continuation)} continuation tokens; both need at "
                    "least one (an empty context is a BOS/EOS token)."
                )
        return self.score_ids(
            [self._prepare(list(context), list(continuation)) for context, continuation in requests], desc
        )

    def _prepare(self, context: list[int], continuation: list[int]) -> _Request:
        request = _Request(context, continuation)
        if self.max_length is not None and len(context) + len(continuation) > self.max_length:
            if len(continuation) >= self.max_length:
                raise ValueError(
                    f"A continuation of {len(continuation)} tokens does not fit max_length={self.max_length} with at "
                    "least one context token; raise max_length (None: no limit) or shorten the continuation."
                )
            request.truncated = len(context) + len(continuation) - self.max_length
            request.context = context[request.truncated :]
        return request

    def score_ids(self, requests: Sequence[_Request], desc: str = "scoring") -> list[ContinuationScore]:
        from tqdm.auto import tqdm

        groups: dict[tuple[int, ...], int] = {}
        for request in requests:
            request.group = groups.setdefault(tuple(request.context), len(groups))
            if self.share_context_memory:
                request.cut = (len(request.context) - 1) // self.segment_length * self.segment_length
        truncated = sum(request.truncated > 0 for request in requests)
        if truncated:
            logger.warning(
                "%d of %d requests lost context tokens from the left to fit max_length=%d.",
                truncated,
                len(requests),
                self.max_length,
            )
        # Longest first (as lm-eval): padding stays small and an out-of-memory error shows up at once.
        group_length = {}
        for request in requests:
            tail = len(request.context) - request.cut + len(request.continuation)
            group_length[request.group] = max(group_length.get(request.group, 0), tail)
        order = sorted(range(len(requests)), key=lambda i: (-group_length[requests[i].group], requests[i].group, i))
        results: list[ContinuationScore | None] = [None] * len(requests)
        prefix_memory: dict[int, Any] = {}
        remaining = {group: 0 for group in group_length}
        for request in requests:
            remaining[request.group] += 1

        if self.token_scorer:
            return self._score_with_token_scorer(requests, desc)
        model = self.model
        was_training = getattr(model, "training", False)
        if hasattr(model, "eval"):
            model.eval()
        try:
            with torch.inference_mode():
                bar = tqdm(total=len(requests), desc=desc, disable=not self.progress, leave=False)
                for start in range(0, len(order), self.batch_size):
                    rows = order[start : start + self.batch_size]
                    batch = [requests[i] for i in rows]
                    if self.share_context_memory:
                        self._run_prefixes(batch, prefix_memory)
                    for i, score in zip(rows, self._score_batch(batch, prefix_memory)):
                        results[i] = score
                        remaining[requests[i].group] -= 1
                        if remaining[requests[i].group] == 0:
                            prefix_memory.pop(requests[i].group, None)
                    bar.update(len(rows))
                bar.close()
        finally:
            if was_training and hasattr(model, "train"):
                model.train()
        return results

    def _score_with_token_scorer(self, requests: Sequence[_Request], desc: str) -> list[ContinuationScore]:
        """Requests one at a time through a `Scorer` (no padding: its `first_target` is per call)."""
        from tqdm.auto import tqdm

        results = []
        for request in tqdm(requests, desc=desc, disable=not self.progress, leave=False):
            start = len(request.context)
            ids = torch.tensor([request.context + request.continuation])
            token_scores = self.model.score(ids, first_target=start)
            scored = token_scores.scored[0, start:]
            if not bool(scored.all()):
                raise ValueError(
                    f"{getattr(self.model, 'name', type(self.model).__name__)} left {int((~scored).sum())} of "
                    f"{scored.numel()} continuation tokens unscored (e.g. a head-truncating baseline dropped them); "
                    "use tail truncation or a longer window so every continuation token is scored."
                )
            results.append(
                ContinuationScore(
                    logprob=-float(token_scores.nll[0, start:].double().sum()),
                    num_tokens=len(request.continuation),
                    is_greedy=bool((token_scores.target_rank[0, start:] == 0).all()),
                    truncated_tokens=request.truncated,
                )
            )
        return results

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, logits_to_keep: int, memory=None):
        kwargs = dict(self.model_kwargs)
        if memory is not None:
            kwargs["memory"] = memory
        if self._takes_position_ids:
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        return self.model(input_ids=ids, attention_mask=mask, **kwargs)

    def _run_prefixes(self, batch: list[_Request], prefix_memory: dict):
        """HMT: run the shared full segments of every new context of the batch once (batched) and keep the memory."""
        new = {}
        for request in batch:
            if request.cut > 0 and request.group not in prefix_memory:
                new[request.group] = request.context[: request.cut]
        if not new:
            return
        ids, mask = _left_pad(list(new.values()), self.device)
        out = self._forward(ids, mask, logits_to_keep=1, memory=self.model.empty_memory(len(new)))
        for row, group in enumerate(new):
            prefix_memory[group] = out.memory.index_select(torch.tensor([row], device=self.device))

    def _score_batch(self, batch: list[_Request], prefix_memory: dict) -> list[ContinuationScore]:
        tails = [request.context[request.cut :] + request.continuation for request in batch]
        ids, mask = _left_pad(tails, self.device)
        keep = max(len(request.continuation) for request in batch) + 1
        memory = None
        if self.segment_length is not None and self.model_kwargs.get("use_memory") is not False:
            # An explicit memory for every row (empty where the context fits in the tail): a call inside
            # `model.carry_memory()` must not continue from an unrelated earlier call.
            empty = self.model.empty_memory(1)
            memory = _stack_states(
                [prefix_memory.get(request.group, empty) if request.cut else empty for request in batch]
            )
        logits = self._forward(ids, mask, logits_to_keep=keep, memory=memory).logits
        # Positions T-keep .. T-2 predict the last keep-1 tokens of every (left-padded) row.
        logits = logits[:, logits.shape[1] - keep : -1].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        scores = []
        for row, request in enumerate(batch):
            n = len(request.continuation)
            target = torch.tensor(request.continuation, device=log_probs.device)
            row_log_probs = log_probs[row, log_probs.shape[1] - n :]
            token_log_probs = row_log_probs.gather(-1, target[:, None]).squeeze(-1)
            scores.append(
                ContinuationScore(
                    logprob=float(token_log_probs.double().sum()),
                    num_tokens=n,
                    is_greedy=bool((row_log_probs.argmax(-1) == target).all()),
                    truncated_tokens=request.truncated,
                )
            )
        return scores


def _left_pad(sequences: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(sequence) for sequence in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, width - len(sequence) :] = torch.tensor(sequence)
            mask[row, width - len(sequence) :] = 1
    return ids.to(device), mask.to(device)


def _stack_states(states: list):
    """One batch of HMT memory states `(B, ...)` from single-row states with different cache sizes: caches are
    right-aligned, so shorter ones get empty (masked) slots in front."""
    width = max(state.memories.shape[1] for state in states)

    def grow(state):
        missing = width - state.memories.shape[1]
        if missing == 0:
            return state
        return dataclasses.replace(
            state,
            memories=torch.nn.functional.pad(state.memories, (0, 0, missing, 0)),
            memory_mask=torch.nn.functional.pad(state.memory_mask, (missing, 0), value=False),
        )

    grown = [grow(state) for state in states]
    return dataclasses.replace(
        grown[0],
        **{f.name: torch.cat([getattr(s, f.name) for s in grown]) for f in dataclasses.fields(grown[0])},
    )
