"""Perplexity from summed negative log-likelihoods — an `evaluate` metric that runs offline.

import evaluate
perplexity = evaluate.load("path/to/hmt_hf/evaluation/metrics/perplexity")   # or hmt_hf.evaluation.load_metric
perplexity.compute(nll_sum=[2.0, 3.0], num_tokens=[1, 2])
# {'perplexity': exp(5/3), 'mean_nll': 5/3, 'num_tokens': 3, 'mean_sample_perplexity': (e^2 + e^1.5) / 2, ...}
"""

import math

import datasets
import evaluate

_DESCRIPTION = """
Perplexity of a language model over scored tokens: `exp(total NLL / number of scored tokens)`, with the NLL in nats.
Unlike the Hub's `perplexity` metric, it does not run a model: each row is a sample (or a single token) with its
summed negative log-likelihood and how many tokens that sum covers, so any model (HMT, RMT, baselines) is scored the
same way and nothing needs the network.
"""

_KWARGS_DESCRIPTION = """
Args:
    nll_sum (`list[float]`): summed negative log-likelihood (natural log, nats) of each row's scored tokens.
    num_tokens (`list[int]`): number of scored tokens in each row (rows with 0 tokens must have nll_sum 0).
Returns:
    perplexity (`float`): exp(sum(nll_sum) / sum(num_tokens)), token-weighted over rows.
    mean_nll (`float`): sum(nll_sum) / sum(num_tokens), nats per token (the usual "loss").
    num_tokens (`int`): total scored tokens.
    num_rows (`int`): rows that scored at least one token.
    mean_sample_perplexity (`float`): mean over those rows of exp(nll_sum / num_tokens).
Examples:
    >>> perplexity.compute(nll_sum=[2.0, 3.0], num_tokens=[1, 2])["perplexity"]  # exp(5 / 3)
    5.294490050470174
"""

_CITATION = """
@inproceedings{he2025hmt,
  title={Hierarchical Memory Transformer for Efficient Long Context Language Processing},
  author={He, Zifan and Cao, Yingqi and Qin, Zongyue and Prakriya, Neha and Sun, Yizhou and Cong, Jason},
  booktitle={NAACL},
  year={2025}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Perplexity(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"nll_sum": datasets.Value("float64"), "num_tokens": datasets.Value("int64")}),
        )

    def _compute(self, nll_sum, num_tokens):
        if any(count < 0 for count in num_tokens):
            raise ValueError("perplexity: num_tokens must be >= 0 in every row.")
        if any(count == 0 and value != 0 for value, count in zip(nll_sum, num_tokens)):
            raise ValueError("perplexity: a row with num_tokens=0 has a non-zero nll_sum; the counts do not match.")
        total_tokens = sum(num_tokens)
        if total_tokens == 0:
            raise ValueError("perplexity: no scored tokens (every num_tokens is 0); perplexity is undefined.")
        total_nll = math.fsum(nll_sum)
        rows = [(value, count) for value, count in zip(nll_sum, num_tokens) if count > 0]
        return {
            "perplexity": math.exp(total_nll / total_tokens),
            "mean_nll": total_nll / total_tokens,
            "num_tokens": total_tokens,
            "num_rows": len(rows),
            "mean_sample_perplexity": math.fsum(math.exp(value / count) for value, count in rows) / len(rows),
        }
