"""Zero-shot evaluation by log-likelihood: multiple-choice tasks and PubMedQA-style multi-context QA.

Modules: `tasks` (task specs, data loading) ← `scorer` (`ContinuationScorer`) ← `multiple_choice` (`run_zero_shot`)
← `pubmedqa` (`run_pubmedqa`). lm-evaluation-harness reaches HMT through `..lm_eval_backend`, which scores with
`ContinuationScorer`.

Any causal LM with the Hugging Face interface can be scored: an [`HMTForCausalLM`] (inputs of any length; the
continuation is scored with the memory built from the context), its plain backbone, or a baseline module whose
`forward(input_ids, attention_mask)` returns `.logits`.

**Scoring.** A request is a `(context, continuation)` pair of strings. Tokenisation follows lm-evaluation-harness:
trailing whitespace of the context moves to the front of the continuation, then `context` and
`context + continuation` are encoded separately and the continuation's tokens are the difference
(`whole[len(context_ids):]`), so the continuation is tokenised as it would be in running text. Its score is
`sum_t log p(continuation_t | context, continuation_<t)`, read from one forward pass over the *whole*
`context + continuation` (lm-eval drops the last token; feeding it keeps the score identical to the model's ordinary
forward pass over the text, which matters for HMT's `retrieval_mode="paper"`, where a segment's memory query reads
that segment's first `j` tokens). With `retrieval_mode="causal"` and for every plain causal LM both conventions give
the same numbers.

**Multiple choice.** The predicted choice is the argmax (first on ties) of the summed log-likelihood (`acc`), of the
log-likelihood per character of the choice (`acc_norm`, lm-eval's convention), per token (`acc_per_token`) and per
UTF-8 byte (`acc_per_byte`).

**HMT.** Contexts longer than one segment are run once per context: its full segments (a multiple of
`segment_length` tokens, at least one context token left over) build the memory, which is then copied for every
candidate continuation. Calls whose lengths are multiples of `segment_length` reproduce one-call logits exactly, so
this changes cost, not scores (`share_context_memory=False` runs every candidate from scratch).

**Batching.** Requests are grouped by context, sorted by length and left-padded into batches of `batch_size` rows
(left padding keeps every row's last positions aligned, so the LM head runs only on the continuation positions).
Plain models get `position_ids` that restart at each row's first real token. A module that does not handle padding
can be scored with `batch_size=1` (no padding is ever added then).
"""

from .multiple_choice import NORMALISATIONS, choose, evaluate_multiple_choice, run_zero_shot
from .pubmedqa import (
    PUBMEDQA_DECISIONS,
    FusedQuestion,
    PubMedQAExample,
    fuse_contexts,
    load_pubmedqa,
    pubmedqa_prompt,
    run_pubmedqa,
)
from .scorer import ContinuationScore, ContinuationScorer
from .tasks import (
    SMALLBENCH,
    TASK_ALIASES,
    ZERO_SHOT_TASKS,
    MultipleChoiceExample,
    MultipleChoiceTask,
    get_task,
    load_task_dataset,
)

__all__ = [
    "NORMALISATIONS",
    "ContinuationScore",
    "ContinuationScorer",
    "FusedQuestion",
    "MultipleChoiceExample",
    "MultipleChoiceTask",
    "PUBMEDQA_DECISIONS",
    "PubMedQAExample",
    "SMALLBENCH",
    "TASK_ALIASES",
    "ZERO_SHOT_TASKS",
    "choose",
    "evaluate_multiple_choice",
    "fuse_contexts",
    "get_task",
    "load_pubmedqa",
    "load_task_dataset",
    "pubmedqa_prompt",
    "run_pubmedqa",
    "run_zero_shot",
]
