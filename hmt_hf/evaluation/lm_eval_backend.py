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
"""

from __future__ import annotations

import sys

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

from .baselines import HMTScorer
from .zero_shot.scorer import ContinuationScorer, hmt_segment_length, underlying_model


@register_model("hmt")
class HMTLM(HFLM):
    """lm-eval's [`HFLM`] for an [`HMTForCausalLM`]: whole contexts through the memory, exact scores.

    Args:
        pretrained (`str` or [`HMTForCausalLM`]): an HMT checkpoint (folder or Hub id) or a loaded HMT (then also
            pass `tokenizer`).
        batch_size (`int`, defaults to 1): rows (candidate continuations) per model call for loglikelihood requests
            and prompts per `generate()` call. `"auto"` is not supported (memory use depends on the segment length,
            not on the input length lm-eval probes with).
        device (`str`, *optional*): defaults to `"cuda"` when available, else `"cpu"`.
        **kwargs: any other [`HFLM`] argument (`tokenizer`, `dtype`, `add_bos_token`, `revision`, `peft`, ...).
            `max_length` is refused: HMT reads any length (evaluate a truncated backbone with `--model hf`).
    """

    def __init__(self, pretrained, batch_size: int | str = 1, device: str | None = None, **kwargs):
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
        self.scorer = ContinuationScorer(self.model, self.tokenizer, batch_size=self.batch_size, max_length=None)

    @property
    def max_length(self) -> int:
        """No limit: HMT reads inputs of any length segment by segment."""
        return sys.maxsize

    def tok_batch_encode(self, strings, padding_side="left", left_truncate_len=None, truncation=False):
        """HFLM's batch encoding without `left_truncate_len`: generation prompts are never cut."""
        return super().tok_batch_encode(strings, padding_side=padding_side, truncation=truncation)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """`(log-likelihood, is_greedy)` of lm-eval's tokenised `(request, context_ids, continuation_ids)` triples."""
        self.scorer.progress = not disable_tqdm and self.rank == 0
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


def main():
    """`lm-eval` with the `"hmt"` backend registered (the `hmt-lm-eval` command)."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


__all__ = ["HMTLM", "main"]
