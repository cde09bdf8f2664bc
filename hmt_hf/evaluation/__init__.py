"""Evaluation of HMT against its baselines: one scoring interface, metrics as `evaluate` modules, evaluators,
result logging and the paper-reproduction suite (`hmt-hf reproduce`)."""

from .baselines import (
    ChunkedTransformer,
    FullContextTransformer,
    HMTScorer,
    RMTScorer,
    SlidingWindowTransformer,
    VanillaTransformer,
    hmt_overrides,
)
from .scoring import PROTOCOLS, EvalSample, Scorer, TokenScores, Workload, make_samples

__all__ = [
    "PROTOCOLS",
    "ChunkedTransformer",
    "EvalSample",
    "FullContextTransformer",
    "HMTScorer",
    "RMTScorer",
    "Scorer",
    "SlidingWindowTransformer",
    "TokenScores",
    "VanillaTransformer",
    "Workload",
    "hmt_overrides",
    "make_samples",
]
