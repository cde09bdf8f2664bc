"""Top-k next-token accuracy from target ranks — an `evaluate` metric that runs offline.

    top_k = evaluate.load("path/to/hmt_hf/evaluation/metrics/top_k_accuracy")
    top_k.compute(target_rank=[0, 3, 1, 7], k=[1, 5])   # {'top_1_accuracy': 0.25, 'top_5_accuracy': 0.75, ...}

The rank of the target token is the number of vocabulary entries with a strictly higher logit:
`(logits > logits.gather(-1, labels[..., None])).sum(-1)` (0 when the argmax is right).
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Top-k accuracy of next-token prediction: the fraction of scored tokens whose target is among the model's k highest
logits. Inputs are target ranks, so one pass over the logits serves every k.
"""

_KWARGS_DESCRIPTION = """
Args:
    target_rank (`list[int]`): rank of each scored target (0 = top-1); ranks are >= 0.
    k (`int` or `list[int]`, defaults to `[1, 5]`): the k values to report, each >= 1.
Returns:
    top_{k}_accuracy (`float`) for each k, and num_tokens (`int`).
Examples:
    >>> top_k.compute(target_rank=[0, 3, 1, 7], k=[1, 5])
    {'top_1_accuracy': 0.25, 'top_5_accuracy': 0.75, 'num_tokens': 4}
"""

_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TopKAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"target_rank": datasets.Value("int64")}),
            format="numpy",
        )

    def _compute(self, target_rank, k=(1, 5)):
        ks = [k] if isinstance(k, int) else list(k)
        if not ks or any(isinstance(value, bool) or not isinstance(value, int) or value < 1 for value in ks):
            raise ValueError(f"top_k_accuracy: k={k!r} must be an int >= 1 or a list of them.")
        target_rank = np.asarray(target_rank)
        if target_rank.size == 0:
            raise ValueError("top_k_accuracy: no scored tokens; accuracy is undefined.")
        if target_rank.min() < 0:
            raise ValueError("top_k_accuracy: ranks must be >= 0 (0 = the target has the highest logit).")
        total = int(target_rank.size)
        result = {f"top_{value}_accuracy": float((target_rank < value).sum()) / total for value in ks}
        result["num_tokens"] = total
        return result
