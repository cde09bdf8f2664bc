"""Evaluation of HMT against its baselines: one scoring interface for every model, metrics shipped as `evaluate`
modules, evaluators, result logging and the paper-reproduction suite (`hmt-hf reproduce`).

    from hmt_hf.evaluation import BaselineEvaluator, HMTEvaluator, SlidingWindowTransformer, VanillaTransformer

Heavy dependencies (evaluate, pandas, matplotlib) are imported only when metrics are computed or reports written.
"""

from .baselines import (
    ChunkedTransformer,
    FullContextTransformer,
    HMTScorer,
    RMTScorer,
    SlidingWindowTransformer,
    VanillaTransformer,
    hmt_overrides,
)
from .config import ExperimentConfig
from .corpus import EvalCorpus, as_corpus, load_texts
from .evaluator import BaselineEvaluator, HMTEvaluator, evaluate_scorer, load_metric, measure_efficiency
from .results import ResultCache, ResultLogger, validate_metrics
from .scoring import PROTOCOLS, EvalSample, Scorer, TokenScores, Workload, make_samples

__all__ = [
    "PROTOCOLS",
    "BaselineEvaluator",
    "ChunkedTransformer",
    "EvalCorpus",
    "EvalSample",
    "ExperimentConfig",
    "FullContextTransformer",
    "HMTEvaluator",
    "HMTScorer",
    "RMTScorer",
    "ResultCache",
    "ResultLogger",
    "Scorer",
    "SlidingWindowTransformer",
    "TokenScores",
    "VanillaTransformer",
    "Workload",
    "as_corpus",
    "evaluate_scorer",
    "hmt_overrides",
    "load_metric",
    "load_texts",
    "make_samples",
    "measure_efficiency",
    "validate_metrics",
]
