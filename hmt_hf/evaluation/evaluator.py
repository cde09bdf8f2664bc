"""Evaluators: score samples with any [`Scorer`], aggregate with the `evaluate` metric modules, resume from cache.

- [`evaluate_scorer`]: the loop every evaluation uses: per sample `scorer.score(...)`, one cached record per sample
  (so an interrupted run resumes), a tqdm bar, then [`aggregate_records`].
- [`HMTEvaluator`]: one HMT — perplexity with and without memory, bits-per-byte, top-k accuracy.
- [`BaselineEvaluator`]: several models side by side — `evaluate_all_models`, `compare_long_context`,
  `compare_efficiency` (the seed notebook's workflow).
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..peak_memory import PeakMemory
from .baselines import HMTScorer
from .corpus import EvalCorpus, as_corpus, token_byte_lengths
from .results import ResultCache
from .scoring import MAX_TRACKED_RANK, PROTOCOL_DESCRIPTIONS, EvalSample, Scorer, Workload, make_samples

METRICS_DIR = Path(__file__).resolve().parent / "metrics"
METRIC_NAMES = ("perplexity", "bits_per_byte", "top_k_accuracy")


def load_metric(name: str, **kwargs):
    """Load one of the packaged `evaluate` metrics (`"perplexity"`, `"bits_per_byte"`, `"top_k_accuracy"`) by
    path, offline: `evaluate.load(<package>/evaluation/metrics/<name>)`."""
    import evaluate

    if name not in METRIC_NAMES:
        raise ValueError(f"Unknown metric {name!r}; the packaged metrics are {METRIC_NAMES}.")
    path = METRICS_DIR / name
    if not (path / f"{name}.py").exists():
        raise FileNotFoundError(
            f"{path / (name + '.py')} is missing: the package was installed without its metric scripts "
            "(setup.cfg package_data must include hmt_hf.evaluation.metrics)."
        )
    return evaluate.load(str(path), **kwargs)


@functools.cache
def _metric(name: str):
    # Loaded once per process (`evaluate.load` copies and imports the script each time); inputs stay in memory, so
    # no Arrow cache files or file locks are shared between processes.
    return load_metric(name, keep_in_memory=True)


# ---------------------------------------------------------------------------------------------------- records
def sample_record(scores, sample: EvalSample | None = None, seconds: float | None = None, row: int = 0) -> dict:
    """The per-sample numbers kept (and cached): NLL sum, token/byte counts, rank histogram, timings, work."""
    byte_lengths = None if sample is None else sample.byte_lengths
    return {
        "sample": None if sample is None else sample.index,
        "start": None if sample is None else sample.start,
        "test_length": None if sample is None else sample.test_length,
        "nll_sum": float(scores.nll_sum()[row]),
        "num_tokens": int(scores.num_scored()[row]),
        "num_unscored": int(scores.num_unscored()[row]),
        "num_bytes": None if byte_lengths is None else int(scores.byte_count(byte_lengths)[row]),
        "rank_counts": scores.rank_counts()[row].tolist(),
        "seconds": seconds,
        "step_seconds": list(scores.step_seconds),
        "workload": scores.workload.to_dict(),
    }


def aggregate_records(records: Sequence[dict], top_k: Sequence[int] = (1, 5)) -> dict:
    """Corpus-level metrics over per-sample records, computed by the packaged `evaluate` modules.

    Returns `perplexity` (token-weighted), `loss` (mean NLL, nats/token), `mean_sample_perplexity`,
    `bits_per_byte` (when every record has a byte count), `top_{k}_accuracy`, `num_scored_tokens`,
    `num_unscored_tokens`, `num_samples`. Metrics are None when nothing was scored.
    """
    records = list(records)
    scored = [r for r in records if r["num_tokens"] > 0]
    result = {
        "num_samples": len(records),
        "num_scored_tokens": sum(r["num_tokens"] for r in records),
        "num_unscored_tokens": sum(r["num_unscored"] for r in records),
        "perplexity": None,
        "loss": None,
        "mean_sample_perplexity": None,
        "bits_per_byte": None,
        **{f"top_{k}_accuracy": None for k in top_k},
    }
    if not scored:
        return result
    perplexity = _metric("perplexity").compute(
        nll_sum=[r["nll_sum"] for r in scored], num_tokens=[r["num_tokens"] for r in scored]
    )
    result.update(
        perplexity=perplexity["perplexity"],
        loss=perplexity["mean_nll"],
        mean_sample_perplexity=perplexity["mean_sample_perplexity"],
    )
    if all(r["num_bytes"] is not None for r in scored) and sum(r["num_bytes"] for r in scored) > 0:
        bits = _metric("bits_per_byte").compute(
            nll_sum=[r["nll_sum"] for r in scored], num_bytes=[r["num_bytes"] for r in scored]
        )
        result["bits_per_byte"] = bits["bits_per_byte"]
    if top_k:
        if max(top_k) > MAX_TRACKED_RANK:
            raise ValueError(f"top_k={list(top_k)}: ranks are tracked up to k={MAX_TRACKED_RANK}.")
        counts = np.sum([r["rank_counts"] for r in scored], axis=0)
        ranks = np.repeat(np.arange(len(counts)), counts)  # ranks >= MAX_TRACKED_RANK share the last bin
        result.update(
            {
                k: v
                for k, v in _metric("top_k_accuracy").compute(target_rank=ranks, k=list(top_k)).items()
                if k != "num_tokens"
            }
        )
    return result


def timing_stats(records: Sequence[dict]) -> dict:
    """Latency percentiles (ms) per sample and per model call ("step"), and throughput (input tokens / s)."""
    sample_seconds = [r["seconds"] for r in records if r.get("seconds") is not None]
    step_seconds = [s for r in records for s in r.get("step_seconds", [])]
    input_tokens = sum(r.get("input_tokens", 0) or 0 for r in records)
    stats = {}
    for label, values in (("sample", sample_seconds), ("step", step_seconds)):
        for q in (50, 95, 99):
            stats[f"latency_per_{label}_ms_p{q}"] = float(np.percentile(values, q) * 1000) if values else None
    stats["throughput"] = input_tokens / sum(sample_seconds) if sample_seconds and input_tokens else None
    return stats


# ---------------------------------------------------------------------------------------------------- the loop
@dataclass
class SampleSetResult:
    """Records of every sample and the metrics aggregated over them."""

    records: list[dict]
    metrics: dict
    num_computed: int  # samples scored in this call (the rest came from the cache)


def evaluate_scorer(
    scorer: Scorer,
    samples: Sequence[EvalSample],
    cache: ResultCache | None = None,
    scope: str = "",
    top_k: Sequence[int] = (1, 5),
    progress: bool = True,
    desc: str | None = None,
) -> SampleSetResult:
    """Score `samples` with `scorer`, one cached record per sample, and aggregate.

    With a `cache`, each sample's record is stored under `(scope, scorer name, protocol, length, index)` with a
    fingerprint of the scorer's settings and the sample's token ids; samples already there are not scored again,
    so rerunning after an interruption continues where it stopped and gives the same numbers.
    """
    from tqdm.auto import tqdm

    fingerprint = scorer.fingerprint()
    records, computed = [], 0
    bar = tqdm(samples, desc=desc or f"{scorer.name}", disable=not progress, file=sys.stderr, leave=False)
    for sample in bar:
        key = f"{scope}|{scorer.name}|{sample.protocol}|T={sample.test_length}|i={sample.index}"
        sample_fingerprint = f"{fingerprint}|{sample.token_digest()}|{sample.first_target}"
        record = cache.get(key, sample_fingerprint) if cache is not None else None
        if record is None:
            start = time.perf_counter()
            scores = scorer.score(sample.input_ids[None], first_target=sample.first_target)
            record = sample_record(scores, sample, seconds=time.perf_counter() - start)
            record["input_tokens"] = int(sample.input_ids.numel())
            computed += 1
            if cache is not None:
                cache.put(key, sample_fingerprint, record)
        records.append(record)
    bar.close()
    return SampleSetResult(records=records, metrics=aggregate_records(records, top_k), num_computed=computed)


# ---------------------------------------------------------------------------------------------------- batches
def _iterate_batches(data, max_batches: int | None) -> Iterable[dict]:
    """Batches as dicts with `input_ids` (and optional `attention_mask`, `byte_lengths`) from a DataLoader, a list
    of batches, a single tensor, or a list of [`EvalSample`]."""
    if isinstance(data, torch.Tensor):
        data = [{"input_ids": data if data.dim() == 2 else data[None]}]
    for number, batch in enumerate(data):
        if max_batches is not None and number >= max_batches:
            return
        if isinstance(batch, EvalSample):
            batch = {"sample": batch}
        elif isinstance(batch, torch.Tensor):
            batch = {"input_ids": batch if batch.dim() == 2 else batch[None]}
        elif isinstance(batch, (list, tuple)):
            batch = {"input_ids": batch[0]}
        elif not hasattr(batch, "keys") or "input_ids" not in batch:
            raise TypeError(
                f"Batch {number} is a {type(batch).__name__} without input_ids; yield dicts with input_ids "
                "(attention_mask, byte_lengths optional), tensors, or EvalSample objects."
            )
        yield batch


def _flops_estimate(backbone, workload: Workload) -> float:
    """Forward FLOPs (analytic): `2 * P_body * positions + 4 * n_layers * d_attn * attended_pairs
    + 2 * d * V * logit_positions`, with `P_body` the backbone parameters without the embedding and LM-head
    matrices. It counts every position processed, HMT's memory slots, sensory tokens and representation passes
    included; it leaves out norms, activations and softmax."""
    config = backbone.config
    embeddings = backbone.get_input_embeddings().weight
    head = backbone.get_output_embeddings().weight
    matrices = {embeddings.data_ptr(): embeddings.numel(), head.data_ptr(): head.numel()}
    body = sum(p.numel() for p in backbone.parameters()) - sum(matrices.values())
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 0)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", 1)
    head_dim = getattr(config, "head_dim", None) or hidden // max(heads, 1)
    attention_width = heads * head_dim
    return (
        2 * body * workload.positions
        + 4 * layers * attention_width * workload.attended_pairs
        + 2 * head.shape[1] * head.shape[0] * workload.logit_positions
    )


def measure_efficiency(
    scorer: Scorer, samples: Sequence[EvalSample], num_warmup: int = 1, num_measure: int = 5, progress: bool = True
) -> dict:
    """Latency (p50/p95/p99 per sample and per model call), throughput, peak memory, FLOPs estimate and parameter
    overhead of `scorer` scoring every target of `samples` (cycled: `num_warmup` unmeasured calls, then
    `num_measure` measured ones)."""
    from tqdm.auto import tqdm

    if not samples:
        raise ValueError("measure_efficiency needs at least one sample.")
    if num_measure < 1:
        raise ValueError(f"num_measure={num_measure} must be >= 1.")
    for index in range(num_warmup):
        sample = samples[index % len(samples)]
        scorer.score(sample.input_ids[None])
    records, workload = [], Workload()
    with PeakMemory(scorer.device) as memory:
        for index in tqdm(
            range(num_measure), desc=f"{scorer.name} timing", disable=not progress, file=sys.stderr, leave=False
        ):
            sample = samples[index % len(samples)]
            start = time.perf_counter()
            scores = scorer.score(sample.input_ids[None])
            seconds = time.perf_counter() - start
            records.append(
                {
                    "seconds": seconds,
                    "step_seconds": scores.step_seconds,
                    "input_tokens": int(sample.input_ids.numel()),
                }
            )
            workload += scores.workload
    tokens = sum(r["input_tokens"] for r in records)
    backbone = scorer.model.backbone if isinstance(scorer, HMTScorer) else scorer.language_model
    stats = timing_stats(records)
    stats.update(
        peak_memory=memory.peak_mib,
        peak_memory_kind=memory.kind,
        forward_flops_per_token=_flops_estimate(backbone, workload) / tokens,
        positions_per_token=workload.positions / tokens,
        parameters=sum(p.numel() for p in scorer.language_model.parameters()),
        memory_parameters=0,
        parameter_overhead=0.0,
        num_measured=num_measure,
        input_tokens_per_sample=tokens / num_measure,
        step_description=scorer.step_description(),
    )
    if isinstance(scorer, HMTScorer):
        overhead = scorer.model.memory_parameter_overhead()
        stats.update(memory_parameters=overhead["memory_parameters"], parameter_overhead=overhead["overhead_percent"])
    return stats


# ---------------------------------------------------------------------------------------------------- evaluators
def as_scorer(model, name: str | None = None) -> Scorer:
    """A [`Scorer`] for `model`: scorers pass through (renamed to `name`, the key reports and caches use), an
    `HMTForCausalLM` becomes an [`HMTScorer`]."""
    from ..modeling_hmt import HMTForCausalLM

    if isinstance(model, Scorer):
        if name is not None:
            model.name = name
        return model
    if isinstance(model, HMTForCausalLM):
        return HMTScorer(model, name=name)
    raise TypeError(
        f"{type(model).__name__} is not a scorer. Wrap a plain causal LM in one of ChunkedTransformer, "
        "SlidingWindowTransformer, VanillaTransformer or FullContextTransformer (or pass an HMTForCausalLM)."
    )


class _BatchEvaluation:
    """Shared by both evaluators: score batches (DataLoader-style) with one scorer."""

    def __init__(self, tokenizer=None, top_k: Sequence[int] = (1, 5), progress: bool = True):
        self.tokenizer = tokenizer
        self.top_k = tuple(top_k)
        self.progress = progress

    def _batch_records(self, scorer: Scorer, data, max_batches: int | None, need_bytes: bool) -> tuple[list, int]:
        """One record per row (or sample) of `data`, and the number of batches read."""
        from tqdm.auto import tqdm

        records = []
        byte_method = None
        batches = 0
        total = len(data) if hasattr(data, "__len__") and not isinstance(data, torch.Tensor) else None
        if total is not None and max_batches is not None:
            total = min(total, max_batches)
        for batch in tqdm(
            _iterate_batches(data, max_batches),
            total=total,
            desc=scorer.name,
            disable=not self.progress,
            file=sys.stderr,
            leave=False,
        ):
            batches += 1
            if "sample" in batch:
                sample = batch["sample"]
                start = time.perf_counter()
                scores = scorer.score(sample.input_ids[None], first_target=sample.first_target)
                record = sample_record(scores, sample, seconds=time.perf_counter() - start)
                record.update(input_tokens=int(sample.input_ids.numel()), protocol=sample.protocol)
                records.append(record)
                continue
            input_ids = torch.as_tensor(batch["input_ids"])
            input_ids = input_ids if input_ids.dim() == 2 else input_ids[None]
            mask = batch.get("attention_mask")
            start = time.perf_counter()
            scores = scorer.score(input_ids, attention_mask=mask)
            seconds = time.perf_counter() - start
            byte_lengths = batch.get("byte_lengths")
            if byte_lengths is None and need_bytes:
                if self.tokenizer is None:
                    raise ValueError(
                        "Bits-per-byte needs the bytes of the scored text: give batches a 'byte_lengths' entry "
                        "(EvalCorpus does) or pass tokenizer= to the evaluator."
                    )
                lengths, byte_method = token_byte_lengths(self.tokenizer, input_ids.reshape(-1))
                byte_lengths = lengths.view_as(input_ids)
            for row in range(input_ids.shape[0]):
                record = sample_record(scores, None, seconds=seconds / input_ids.shape[0], row=row)
                if byte_lengths is not None:
                    row_bytes = torch.as_tensor(byte_lengths)
                    row_bytes = row_bytes[row] if row_bytes.dim() == 2 else row_bytes
                    record["num_bytes"] = int((row_bytes.long() * scores.scored[row]).sum())
                record["input_tokens"] = int(scores.requested[row].sum()) + 1
                record["step_seconds"] = scores.step_seconds if row == 0 else []
                records.append(record)
        if not records:
            raise ValueError("The data yielded no batch to evaluate.")
        if byte_method is not None:
            for record in records:
                record["byte_count_method"] = byte_method
        return records, batches


class HMTEvaluator(_BatchEvaluation):
    """Evaluate one HMT: perplexity with and without memory, bits-per-byte, top-k accuracy.

    Batches are scored on all their tokens (each row's first token has no context); padding is handled. The
    `retrieval_mode` in force is part of every result.

    Args:
        model ([`HMTForCausalLM`]).
        tokenizer (*optional*): for bits-per-byte on batches that carry no `byte_lengths`.
        top_k (`tuple[int]`): accuracies to report.
        max_logit_positions (`int`): logits are held for at most this many positions at a time.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        top_k: Sequence[int] = (1, 5),
        progress: bool = True,
        max_logit_positions: int = 2048,
    ):
        super().__init__(tokenizer, top_k, progress)
        self.model = model
        self.max_logit_positions = max_logit_positions

    def _scorer(self, use_memory: bool) -> HMTScorer:
        return HMTScorer(self.model, use_memory=use_memory, max_logit_positions=self.max_logit_positions)

    def evaluate(self, data, use_memory: bool = True, max_batches: int | None = None, bits_per_byte: bool = False):
        """All metrics over `data` (batches, tensors or [`EvalSample`] objects)."""
        scorer = self._scorer(use_memory)
        records, batches = self._batch_records(scorer, data, max_batches, need_bytes=bits_per_byte)
        result = aggregate_records(records, self.top_k)
        result.update(timing_stats(records))
        protocols = {r.get("protocol") or "all_tokens" for r in records}
        result.update(
            num_batches=batches,
            use_memory=use_memory,
            retrieval_mode=scorer.retrieval_mode,
            protocol=protocols.pop() if len(protocols) == 1 else sorted(protocols),
        )
        if records and "byte_count_method" in records[0]:
            result["byte_count_method"] = records[0]["byte_count_method"]
        return result

    def evaluate_perplexity(self, data, use_memory: bool = True, max_batches: int | None = None) -> dict:
        """`{"perplexity", "loss", "num_scored_tokens", ...}` with (`use_memory=True`) or without memory."""
        return self.evaluate(data, use_memory=use_memory, max_batches=max_batches)

    def evaluate_bits_per_byte(self, data, use_memory: bool = True, max_batches: int | None = None) -> dict:
        """`{"bits_per_byte", "perplexity", ...}`: total NLL / (ln 2 x UTF-8 bytes of the scored tokens)."""
        return self.evaluate(data, use_memory=use_memory, max_batches=max_batches, bits_per_byte=True)

    def compare_memory(self, data, max_batches: int | None = None) -> dict:
        """Perplexity with and without memory on the same batches, and the relative change (%)."""
        with_memory = self.evaluate(data, use_memory=True, max_batches=max_batches)
        without = self.evaluate(data, use_memory=False, max_batches=max_batches)
        change = 100 * (with_memory["perplexity"] - without["perplexity"]) / without["perplexity"]
        return {"with_memory": with_memory, "without_memory": without, "relative_change": change}


class BaselineEvaluator(_BatchEvaluation):
    """Compare models side by side under one protocol (the seed notebook's `BaselineEvaluator`).

    Args:
        models (`dict[str, Scorer | HMTForCausalLM]`): name -> model. Plain causal LMs must be wrapped in a
            baseline (`VanillaTransformer`, `SlidingWindowTransformer`, `ChunkedTransformer`,
            `FullContextTransformer`).
        cache ([`ResultCache`], *optional*): per-sample cache (resume after an interruption).
        logger ([`ResultLogger`], *optional*): every comparison also logs its metrics there (and its cache is used).
        segment_length (`int`, *optional*): `L` of the paper's sample protocol; defaults to the first HMT's.
        protocol (`str`): `"last_segment"` (the paper's) or `"all_tokens"` for `compare_long_context`.
    """

    def __init__(
        self,
        models: dict,
        cache: ResultCache | None = None,
        logger=None,
        tokenizer=None,
        top_k: Sequence[int] = (1, 5),
        progress: bool = True,
        segment_length: int | None = None,
        protocol: str = "last_segment",
    ):
        super().__init__(tokenizer, top_k, progress)
        if not models:
            raise ValueError("BaselineEvaluator needs at least one model.")
        self.models = {name: as_scorer(model, name) for name, model in models.items()}
        self.logger = logger
        self.cache = cache if cache is not None else (logger.cache if logger is not None else None)
        self.segment_length = segment_length
        self.protocol = protocol
        if self.logger is not None:
            for name, scorer in self.models.items():
                self.logger.describe_model(name, scorer.describe())

    def _segment_length(self) -> int:
        if self.segment_length is not None:
            return self.segment_length
        for scorer in self.models.values():
            if isinstance(scorer, HMTScorer):
                return scorer.model.config.segment_length
        raise ValueError("No HMT among the models: pass segment_length= (the L of the test-sample protocol).")

    def _log(self, experiment: str, name: str, metrics: dict, **fields):
        if self.logger is None:
            return
        scorer = self.models[name]
        retrieval_mode = scorer.retrieval_mode if isinstance(scorer, HMTScorer) else None
        for metric, value in metrics.items():
            if metric in ("num_samples",) or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            self.logger.log_metric(
                experiment,
                name,
                metric,
                value,
                retrieval_mode=retrieval_mode,
                num_samples=metrics.get("num_samples"),
                num_tokens=metrics.get("num_scored_tokens"),
                **fields,
            )

    def evaluate_all_models(self, data, max_batches: int | None = None) -> dict:
        """`{name: {"perplexity", "loss", "bits_per_byte", "top_1_accuracy", ...}}` over the same batches (all
        tokens of each batch) or [`EvalSample`] objects."""
        results = {}
        need_bytes = self.tokenizer is not None
        for name, scorer in self.models.items():
            records, _ = self._batch_records(scorer, data, max_batches, need_bytes=need_bytes)
            results[name] = aggregate_records(records, self.top_k) | timing_stats(records)
            self._log("evaluate_all_models", name, results[name])
        return results

    def compare_long_context(
        self,
        test_dataset,
        sequence_lengths: Sequence[int],
        num_samples: int = 100,
        protocol: str | None = None,
        stride: int | None = None,
        return_details: bool = False,
        experiment: str = "compare_long_context",
    ):
        """Perplexity of every model at every input length: `{name: {length: perplexity or None}}`.

        Samples follow the paper's protocol (`protocol="last_segment"`): `length + L` tokens cut from the token
        stream of `test_dataset` (anything [`as_corpus`] takes) with stride `L`, scored on the last segment.
        A model that cannot take a length (full context beyond its window) gets None; lengths the data is too
        short for are left out, with a warning. `return_details=True` also returns the full metrics per model and
        length.
        """
        import warnings

        protocol = protocol or self.protocol
        corpus = as_corpus(test_dataset, self.tokenizer)
        segment_length = self._segment_length()
        results = {name: {} for name in self.models}
        details = {name: {} for name in self.models}
        for length in sequence_lengths:
            try:
                samples = make_samples(
                    corpus.token_ids, length, segment_length, protocol, num_samples, stride, corpus.byte_lengths
                )
            except ValueError as error:
                warnings.warn(f"Length {length} left out: {error}", stacklevel=2)
                continue
            for name, scorer in self.models.items():
                if not scorer.fits(length + segment_length):
                    results[name][length] = None
                    details[name][length] = {"skipped": f"{name} takes at most {scorer.max_input_length} tokens"}
                    continue
                outcome = evaluate_scorer(
                    scorer,
                    samples,
                    self.cache,
                    scope=experiment,
                    top_k=self.top_k,
                    progress=self.progress,
                    desc=f"{name} @ {length}",
                )
                results[name][length] = outcome.metrics["perplexity"]
                details[name][length] = outcome.metrics
                self._log(experiment, name, outcome.metrics, protocol=protocol, sequence_length=length)
        return (results, details) if return_details else results

    def compare_efficiency(
        self,
        data,
        num_warmup: int = 10,
        num_measure: int = 100,
        baseline: str | None = None,
        sequence_length: int | None = None,
    ) -> dict:
        """Latency, throughput, peak memory, FLOPs and parameters of every model on the same inputs, and the
        speedup in throughput over `baseline` (default "Vanilla" if present, else the first model):
        `{name: {"tokens_per_second", "seconds_per_batch", "latency_per_sample_ms_p50", ...}, "speedup": {...}}`.

        `data`: [`EvalSample`] objects, a tensor `(B, T)`, batches, or a corpus with `sequence_length`.
        """
        samples = self._efficiency_samples(data, sequence_length)
        results = {}
        for name, scorer in self.models.items():
            fitting = [s for s in samples if scorer.fits(s.input_ids.numel())]
            if not fitting:
                results[name] = {"skipped": f"{name} takes at most {scorer.max_input_length} tokens"}
                continue
            stats = measure_efficiency(scorer, fitting, num_warmup, num_measure, self.progress)
            stats["tokens_per_second"] = stats["throughput"]
            stats["seconds_per_batch"] = (stats["latency_per_sample_ms_p50"] or 0) / 1000
            results[name] = stats
            self._log(
                "compare_efficiency",
                name,
                {
                    k: v
                    for k, v in stats.items()
                    if k not in ("tokens_per_second", "seconds_per_batch", "num_measured", "input_tokens_per_sample")
                },
                sequence_length=int(fitting[0].input_ids.numel()),
            )
        measured = [n for n in results if "throughput" in results[n]]
        if baseline is None:
            baseline = "Vanilla" if "Vanilla" in measured else (measured[0] if measured else None)
        reference = results.get(baseline, {}).get("throughput")
        results["speedup"] = {n: (results[n]["throughput"] / reference if reference else None) for n in measured}
        return results

    def _efficiency_samples(self, data, sequence_length: int | None) -> list[EvalSample]:
        if isinstance(data, (list, tuple)) and data and isinstance(data[0], EvalSample):
            return list(data)
        if isinstance(data, (EvalCorpus,)) or (sequence_length is not None and not isinstance(data, torch.Tensor)):
            if sequence_length is None:
                raise ValueError("compare_efficiency on a corpus needs sequence_length=.")
            corpus = as_corpus(data, self.tokenizer)
            return make_samples(corpus.token_ids, sequence_length, self._segment_length(), "all_tokens", num_samples=4)
        samples = []
        for batch in _iterate_batches(data, None):
            input_ids = batch["sample"].input_ids[None] if "sample" in batch else torch.as_tensor(batch["input_ids"])
            mask = batch.get("attention_mask")
            for row in range(input_ids.shape[0]):
                ids = input_ids[row] if mask is None else input_ids[row][torch.as_tensor(mask[row]).bool()]
                samples.append(EvalSample(ids, None, 1, len(samples), 0, int(ids.numel()), "all_tokens"))
        return samples


def protocol_statement(protocol: str) -> str:
    """The sentence reports print for a protocol."""
    return PROTOCOL_DESCRIPTIONS[protocol]


def relative_change(value: float | None, reference: float | None) -> float | None:
    """`100 * (value - reference) / reference` (negative = lower than the reference), None if undefined."""
    if value is None or reference is None or reference == 0 or not math.isfinite(reference):
        return None
    return 100 * (value - reference) / reference
