"""Zero-shot evaluation by log-likelihood on lm-evaluation-harness: multiple-choice tasks and PubMedQA-style
multi-context QA.

Modules: `tasks` (task specs, data loading), `scorer` (`ContinuationScorer`), `harness` (the questions as in-memory
lm-eval tasks), `multiple_choice` (`run_zero_shot`), `pubmedqa` (`run_pubmedqa`). `harness` and the run_* functions
need lm-eval (`pip install 'hmt_hf[lm_eval]'`); the rest does not.

**What runs where.** The package turns rows into questions (task specs, the seed's SmallBench, PubMedQA fusion) and
hands them to `lm_eval.evaluator.evaluate` as in-memory tasks; lm-eval builds the requests, tokenises them, calls the
model's backend and computes the metrics. The backend (`..lm_eval_backend.lm_for`): `HMTLM` for an
[`HMTForCausalLM`], lm-eval's own `HFLM` for a plain transformers causal LM, `ScorerLM` for a baseline `Scorer`
(`VanillaTransformer`, ...) or another module whose `forward(input_ids, attention_mask)` returns `.logits`. `HMTLM`
and `ScorerLM` score with `ContinuationScorer`.

**Scoring.** A request is a `(context, continuation)` pair of strings, tokenised as lm-eval does: trailing whitespace
of the context moves to the front of the continuation, then `context` and `context + continuation` are encoded
separately and the continuation's tokens are the difference (`whole[len(context_ids):]`). Its score is
`sum_t log p(continuation_t | context, continuation_<t)`. `ContinuationScorer` reads it from one forward pass over
the *whole* `context + continuation` (lm-eval drops the last token; feeding it keeps the score identical to the
model's ordinary forward pass over the text, which matters for HMT's `retrieval_mode="paper"`, where a segment's
memory query reads that segment's first `j` tokens). With `retrieval_mode="causal"` and for every plain causal LM
both conventions give the same numbers.

**Multiple choice.** The predicted choice is the argmax (first on ties) of the summed log-likelihood (`acc`), of the
log-likelihood per character of the choice (`acc_norm`) and per UTF-8 byte (`acc_per_byte`, lm-eval's `acc_bytes`),
all lm-eval's, and per token (`acc_per_token`, added by `harness.ChoiceTask`).

**HMT.** Contexts longer than one segment are run once per context: its full segments (a multiple of
`segment_length` tokens, at least one context token left over) build the memory, which is then copied for every
candidate continuation. Calls whose lengths are multiples of `segment_length` reproduce one-call logits exactly, so
this changes cost, not scores (`share_context_memory=False` runs every candidate from scratch). lm-eval hands all
requests of a run to the backend at once, so candidates of different tasks that share a context (PubMedQA's long
and short answers) share its memory too.

**Batching** (`ContinuationScorer`; `HFLM` batches its own way). Requests are grouped by context, sorted by length
and left-padded into batches of `batch_size` rows (left padding keeps every row's last positions aligned, so the LM
head runs only on the continuation positions). Plain models get `position_ids` that restart at each row's first
real token. A module that does not handle padding can be scored with `batch_size=1` (no padding is ever added
then).
"""

from .multiple_choice import NORMALISATIONS, run_zero_shot
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
    "fuse_contexts",
    "get_task",
    "load_pubmedqa",
    "load_task_dataset",
    "pubmedqa_prompt",
    "run_pubmedqa",
    "run_zero_shot",
]
