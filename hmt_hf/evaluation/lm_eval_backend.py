"""An lm-evaluation-harness backend for HMT, registered as `"hmt"`.

    import lm_eval
    from hmt_hf.evaluation.lm_eval_backend import HMTLM

    lm_eval.simple_evaluate(model=HMTLM(pretrained=model_or_folder, tokenizer=tokenizer), tasks=["arc_easy"])
    lm_eval.simple_evaluate(model="hmt", model_args="pretrained=path/to/hmt", tasks=["wikitext"])

lm-eval 0.4.x has no entry-point group for model backends: importing this module registers `"hmt"` (the
`hmt-lm-eval` command is `lm-eval` with it imported: `hmt-lm-eval run --model hmt --model_args pretrained=DIR ...`).

The stock `hf` backend loads an HMT checkpoint (`trust_remote_code=True`) but reads it as a fixed-context model: it
cuts every context to the backbone's `max_position_embeddings` (the long context HMT exists for), scores
`loglikelihood_rolling` documents in disjoint windows of that length, each from empty memory, drops the last token of
every input (which moves the memory query of a short last segment in `retrieval_mode="paper"`) and right-pads batches
without an attention mask (padding then enters that query). `HMTLM` differs from [`HFLM`] only where HMT needs it:

- **No length limit.** Contexts of any length are read through the memory; `max_length` is unbounded.
- **loglikelihood** runs through [`ContinuationScorer`] (`zero_shot/scorer.py`) on lm-eval's own tokenisation: requests
  are grouped by context, the context's full segments are run once and their memory reused for every candidate
  continuation (exact, not an approximation), and the rest is left-padded with an attention mask into batches of
  `batch_size` rows; every row gets the numbers it gets alone.
- **loglikelihood_rolling** scores each document in one pass through HMT ([`HMTScorer`]: calls of whole segments
  with the memory carried, logits for at most 2048 positions at a time), one document at a time.
- **generate_until** is HFLM's (left-padded batches, stop sequences) with HMT's `generate()`, prompts uncut.

[`ScorerLM`] is the same loglikelihood on a bare lm-eval `TemplateLM`, for what `HFLM` cannot load: the package's
baseline `Scorer`s (`VanillaTransformer`, `SlidingWindowTransformer`, ...), other modules with the causal-LM call
interface, PEFT-wrapped models. [`lm_for`] picks the backend for a loaded model (`run_zero_shot` and `run_pubmedqa`
evaluate through it): `HMTLM`, lm-eval's own `HFLM` for a plain transformers causal LM, else `ScorerLM`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

from .baselines import HMTScorer
from .zero_shot.scorer import ContinuationScorer, hmt_segment_length, underlying_model


class _ContinuationScoring:
    """lm-eval's `_loglikelihood_tokens` through `self.scorer` (a [`ContinuationScorer`]); `progress=False` hides
    the scorer's progress bar."""

    scorer: ContinuationScorer
    progress: bool = True

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """`(log-likelihood, is_greedy)` of lm-eval's tokenised `(request, context_ids, continuation_ids)` triples."""
        self.scorer.progress = self.progress and not disable_tqdm and self.rank == 0
        # An empty continuation has log-likelihood 0 and is trivially greedy (as in HFLM); the rest is scored.
        scored = [(context, continuation) for _, context, continuation in requests if continuation]
        scores = iter(self.scorer.score_encoded(scored) if scored else [])
        results = []
        for request, _, continuation in requests:
            score = next(scores) if continuation else None
            answer = (score.logprob, score.is_greedy) if score is not None else (0.0, True)
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
            results.append(answer)
        return results


@register_model("hmt")
class HMTLM(_ContinuationScoring, HFLM):
    """lm-eval's [`HFLM`] for an [`HMTForCausalLM`]: whole contexts through the memory, exact scores.

    Args:
        pretrained (`str` or [`HMTForCausalLM`]): an HMT checkpoint (folder or Hub id) or a loaded HMT (then also
            pass `tokenizer`).
        batch_size (`int`, defaults to 1): rows (candidate continuations) per model call for loglikelihood requests
            and prompts per `generate()` call. `"auto"` is not supported (memory use depends on the segment length,
            not on the input length lm-eval probes with).
        device (`str`, *optional*): defaults to `"cuda"` when available, else `"cpu"`.
        share_context_memory (`bool`, defaults to `True`): loglikelihood: build each context's memory once for all
            its candidates (exact); `False` runs every candidate from scratch.
        model_kwargs (`dict`, *optional*): loglikelihood: extra keyword arguments for every forward call (e.g.
            `{"use_memory": False}` for the chunked-backbone ablation).
        **kwargs: any other [`HFLM`] argument (`tokenizer`, `dtype`, `add_bos_token`, `revision`, `peft`, ...).
            `max_length` is refused: HMT reads any length (evaluate a truncated backbone with `--model hf`).
    """

    def __init__(
        self,
        pretrained,
        batch_size: int | str = 1,
        device: str | None = None,
        share_context_memory: bool = True,
        model_kwargs: Mapping | None = None,
        **kwargs,
    ):
        if kwargs.get("max_length") is not None:
            raise ValueError(
                "The hmt backend reads contexts of any length through the memory and takes no max_length; evaluate "
                "the backbone on truncated contexts with lm-eval's 'hf' backend instead."
            )
        if str(batch_size).startswith("auto"):
            raise ValueError(f"batch_size={batch_size!r} is not supported by the hmt backend; give an int (e.g. 8).")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        super().__init__(pretrained, backend="causal", batch_size=batch_size, device=device, **kwargs)
        if hmt_segment_length(self.model) is None:
            raise TypeError(
                f"{type(underlying_model(self.model)).__name__} is not an HMTForCausalLM; evaluate plain causal LMs with "
                "lm-eval's 'hf' backend."
            )
        self.scorer = ContinuationScorer(
            self.model,
            self.tokenizer,
            batch_size=self.batch_size,
            max_length=None,
            share_context_memory=share_context_memory,
            model_kwargs=model_kwargs,
        )

    @property
    def max_length(self) -> int:
        """No limit: HMT reads inputs of any length segment by segment."""
        return sys.maxsize

    def tok_batch_encode(self, strings, padding_side="left", left_truncate_len=None, truncation=False):
        """HFLM's batch encoding without `left_truncate_len`: generation prompts are never cut."""
        return super().tok_batch_encode(strings, padding_side=padding_side, truncation=truncation)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of every document's tokens, each read in one pass after `prefix_token_id` (lm-eval's
        convention for the first token)."""
        scorer = HMTScorer(underlying_model(self.model))
        results = []
        for request in tqdm(requests, disable=disable_tqdm or self.rank != 0, desc="Scoring documents with HMT"):
            (text,) = request.args
            input_ids = torch.tensor([[self.prefix_token_id, *self.tok_encode(text)]])
            loglikelihood = -float(scorer.score(input_ids).nll_sum()[0])
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), loglikelihood)
            results.append(loglikelihood)
        return results


class ScorerLM(_ContinuationScoring, TemplateLM):
    """A thin lm-eval `LM` whose loglikelihood is [`ContinuationScorer`]'s, for models lm-eval's `HFLM` cannot load.

    Those are the package's baseline `Scorer`s (`VanillaTransformer`, `SlidingWindowTransformer`, ...: read through
    their per-token scores), other modules with the causal-LM call interface (`forward(input_ids, attention_mask)`
    returning `.logits`) and PEFT-wrapped models; also an HMT under a length limit. Tokenisation is `HFLM`'s:
    `tokenizer.encode`, with special tokens as `add_bos_token` says (None: the tokenizer's default). It answers
    `loglikelihood` requests (multiple choice, continuations) only.

    Args:
        model: anything [`ContinuationScorer`] scores.
        tokenizer: its tokenizer.
        batch_size (`int`, defaults to 1): rows (candidate continuations) per model call.
        max_length (`int`, `"model"` or None): see [`ContinuationScorer`].
        add_bos_token (`bool`, *optional*): lm-eval's `add_bos_token`.
        **scorer_kwargs: other [`ContinuationScorer`] arguments (`share_context_memory`, `model_kwargs`).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 1,
        max_length: int | str | None = "model",
        add_bos_token: bool | None = None,
        **scorer_kwargs,
    ):
        super().__init__()
        self.tokenizer, self.add_bos_token, self.batch_size = tokenizer, add_bos_token, batch_size
        self.scorer = ContinuationScorer(
            model, tokenizer, batch_size=batch_size, max_length=max_length, **scorer_kwargs
        )
        self._device = self.scorer.device

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """BOS (EOS when there is none) stands in for an empty context, as in `HFLM`."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int | None:
        return self.scorer.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token
        special = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return list(self.tokenizer.encode(string, **special))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(
            "ScorerLM answers loglikelihood requests only; score documents with hmt_hf.evaluation's evaluators "
            "(or an HMT with the 'hmt' backend)."
        )

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("ScorerLM answers loglikelihood requests only; generate with the model itself.")


def lm_for(
    model,
    tokenizer,
    *,
    batch_size: int = 8,
    max_length: int | str | None = "model",
    prepend_bos: bool | None = None,
    share_context_memory: bool = True,
    model_kwargs: Mapping | None = None,
    progress: bool = True,
) -> TemplateLM:
    """The lm-eval `LM` that scores a loaded `model` by log-likelihood.

    - an [`HMTForCausalLM`] → [`HMTLM`] (whole contexts through the memory, built once per context);
    - a transformers causal LM → lm-eval's own `HFLM` (`max_length`: `"model"` reads it from the config, an int
      sets it, None lifts it; longer inputs lose context tokens from the left, lm-eval's way);
    - anything else, or options those backends lack (an HMT with an int `max_length`, `model_kwargs` for a plain
      model) → [`ScorerLM`].

    `prepend_bos` is lm-eval's `add_bos_token` (None: the tokenizer's default), `batch_size` rows per model call;
    `share_context_memory`, `model_kwargs` and `progress` are [`ContinuationScorer`]'s (HMT / `ScorerLM` only).
    """
    from transformers import PreTrainedModel

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an int >= 1.")
    if max_length not in ("model", None) and (not isinstance(max_length, int) or max_length < 2):
        raise ValueError(f"max_length={max_length!r} must be 'model', None or an int >= 2.")
    is_hmt = hmt_segment_length(model) is not None and isinstance(model, PreTrainedModel)
    scorer_kwargs = {"share_context_memory": share_context_memory, "model_kwargs": model_kwargs}
    if is_hmt and max_length in ("model", None):
        lm = HMTLM(
            pretrained=model, tokenizer=tokenizer, batch_size=batch_size, add_bos_token=prepend_bos, **scorer_kwargs
        )
    elif isinstance(model, PreTrainedModel) and not is_hmt and not model_kwargs:
        limit = {"model": None, None: sys.maxsize}.get(max_length, max_length)
        lm = HFLM(
            pretrained=model,
            tokenizer=tokenizer,
            backend="causal",
            batch_size=batch_size,
            max_length=limit,
            add_bos_token=prepend_bos,
        )
    else:
        lm = ScorerLM(
            model, tokenizer, batch_size=batch_size, max_length=max_length, add_bos_token=prepend_bos, **scorer_kwargs
        )
    lm.progress = progress  # read by HMTLM and ScorerLM (HFLM shows lm-eval's own bars)
    return lm


def encode_request(lm: TemplateLM, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The `(context_ids, continuation_ids)` that lm-eval's `TemplateLM.loglikelihood` scores for one request
    (an empty context becomes `prefix_token_id`)."""
    if context:
        return lm._encode_pair(context, continuation)
    ids = lm.tok_encode(continuation, add_special_tokens=False)
    return ([lm.prefix_token_id], ids) if lm.prefix_token_id != ids[0] else (ids[:1], ids[1:])


def main():
    """`lm-eval` with the `"hmt"` backend registered (the `hmt-lm-eval` command)."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


__all__ = ["HMTLM", "ScorerLM", "encode_request", "lm_for", "main"]
