"""Bits per byte (BPB) — an `evaluate` metric that runs offline.

bits_per_byte = evaluate.load("path/to/hmt_hf/evaluation/metrics/bits_per_byte")
bits_per_byte.compute(nll_sum=[math.log(2) * 8], num_bytes=[4])   # {'bits_per_byte': 2.0, ...}
"""

import math

import datasets
import evaluate

_DESCRIPTION = """
Bits per UTF-8 byte of the scored text: total negative log-likelihood in nats / (ln 2 x number of UTF-8 bytes of the
text whose tokens were scored). It compares models with different tokenizers. It is *not* the loss / ln 2, which is
bits per *token*.
"""

_KWARGS_DESCRIPTION = """
Args:
    nll_sum (`list[float]`): summed negative log-likelihood (nats) of each row's scored tokens.
    num_bytes (`list[int]`): UTF-8 bytes of the text those tokens cover, per row.
Returns:
    bits_per_byte (`float`): sum(nll_sum) / (ln 2 * sum(num_bytes)).
    total_nll_nats (`float`), total_bits (`float`), num_bytes (`int`).
Examples:
    >>> bits_per_byte.compute(nll_sum=[2 * math.log(2), 6 * math.log(2)], num_bytes=[1, 3])["bits_per_byte"]
    2.0
"""

_CITATION = """
@article{gao2020pile,
  title={The Pile: An 800GB Dataset of Diverse Text for Language Modeling},
  author={Gao, Leo and others},
  journal={arXiv preprint arXiv:2101.00027},
  year={2020}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class BitsPerByte(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"nll_sum": datasets.Value("float64"), "num_bytes": datasets.Value("int64")}),
        )

    def _compute(self, nll_sum, num_bytes):
        if any(count < 0 for count in num_bytes):
            raise ValueError("bits_per_byte: num_bytes must be >= 0 in every row.")
        total_bytes = sum(num_bytes)
        if total_bytes == 0:
            raise ValueError("bits_per_byte: the scored text has 0 bytes; bits per byte is undefined.")
        total_nll = math.fsum(nll_sum)
        total_bits = total_nll / math.log(2)
        return {
            "bits_per_byte": total_bits / total_bytes,
            "total_nll_nats": total_nll,
            "total_bits": total_bits,
            "num_bytes": total_bytes,
        }
