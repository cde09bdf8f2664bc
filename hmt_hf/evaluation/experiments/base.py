"""What every experiment shares: the `Runner` (cached scoring), `Experiment` and its registry, metric records, the
length and variant sweeps, and the run's test corpus."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..baselines import (
    HMTScorer,
)
from ..config import ExperimentConfig
from ..corpus import EvalCorpus, load_texts
from ..evaluator import (
    SampleSetResult,
    evaluate_scorer,
)
from ..results import ResultCache
from ..scoring import Scorer, make_samples, num_protocol_samples
from .models import QUALITY_METRICS, ModelSet


# ---------------------------------------------------------------------------------------------------- runner
@dataclass
class Runner:
    """Scores samples for experiments: one cached record per sample (resume), progress bars, top-k settings."""

    cache: ResultCache | None = None
    progress: bool = True
    top_k: tuple[int, ...] = (1, 5)

    def evaluate(self, scorer: Scorer, samples, scope: str, desc: str | None = None) -> SampleSetResult:
        return evaluate_scorer(scorer, samples, self.cache, scope, self.top_k, self.progress, desc)


@dataclass
class ExperimentResult:
    """What an experiment returns: metric records (keyword arguments of `ResultLogger.log_metric`), notes for
    the report, curves, the scorers it described, and whether it ran."""

    metrics: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    series: list[dict] = field(default_factory=list)
    models: dict[str, dict] = field(default_factory=dict)
    status: str = "complete"
    reason: str | None = None

    @classmethod
    def skipped(cls, reason: str) -> ExperimentResult:
        return cls(status="skipped", reason=reason)


@dataclass(frozen=True)
class Experiment:
    """A named experiment: `run(config, models, data, runner) -> ExperimentResult`."""

    name: str
    paper_item: str
    description: str
    run: Callable[[ExperimentConfig, ModelSet, EvalCorpus, Runner], ExperimentResult]
    seed_names: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    uses_corpus: bool = True

    def item_for(self, config: ExperimentConfig) -> str:
        """The paper item, specialised to the data set (Fig. 2 is WikiText, Fig. 3 PG-19)."""
        if self.name == "ppl_vs_length":
            return {"wiki": "Fig. 2", "books": "Fig. 3", "shakespeare": "Fig. 3"}.get(config.dataset, self.paper_item)
        return self.paper_item


EXPERIMENTS: dict[str, Experiment] = {}


def register_experiment(experiment: Experiment) -> Experiment:
    """Add an experiment to the registry (`hmt-hf reproduce --experiments <name>`). Other modules (e.g.
    `hmt_hf.evaluation.zero_shot`) may register theirs; a later registration of the same name replaces it."""
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def resolve_experiments(names: Sequence[str]) -> list[Experiment]:
    """Experiments by name, paper item or seed name (`"fig2"`, `"table8"`, `"Table 7"`, `"all"`), in order."""
    result: list[Experiment] = []

    def key(text: str) -> str:
        return text.lower().replace(" ", "").replace(".", "").replace("figure", "fig").replace("-", "_")

    for name in names:
        if name == "all":
            candidates = list(EXPERIMENTS.values())
        else:
            candidates = [
                e
                for e in EXPERIMENTS.values()
                if key(name) in {key(e.name), *(key(a) for a in e.aliases), *(key(s) for s in e.seed_names)}
            ]
        if not candidates:
            raise ValueError(
                f"Unknown experiment {name!r}. Known: {', '.join(EXPERIMENTS)} (or a paper item such as fig2, "
                "table8, a seed name such as 'Table 5', or 'all')."
            )
        result += [c for c in candidates if c not in result]
    return result


# ---------------------------------------------------------------------------------------------------- helpers
def metric_record(experiment: str, paper_item: str, model: str, metric: str, value, **fields) -> dict:
    return {
        "experiment": experiment,
        "paper_item": paper_item,
        "model": model,
        "metric": metric,
        "value": value,
        **fields,
    }


def quality_records(experiment, paper_item, name, scorer, metrics, models, top_k, **fields) -> list[dict]:
    retrieval_mode = scorer.retrieval_mode if isinstance(scorer, HMTScorer) else None
    names = [*QUALITY_METRICS, *(f"top_{k}_accuracy" for k in top_k)]
    return [
        metric_record(
            experiment,
            paper_item,
            name,
            metric,
            metrics.get(metric),
            retrieval_mode=retrieval_mode,
            num_samples=metrics["num_samples"],
            num_tokens=metrics["num_scored_tokens"],
            weights=models.weights_of(scorer),
            **fields,
        )
        for metric in names
        if metric in metrics
    ]


def protocol_samples(config, data: EvalCorpus, length: int, segment_length: int, protocol: str):
    return make_samples(
        data.token_ids, length, segment_length, protocol, config.num_samples, config.sample_stride, data.byte_lengths
    )


def has_samples(config, data: EvalCorpus, length: int, segment_length: int, protocol: str) -> bool:
    return num_protocol_samples(len(data), length, segment_length, protocol, config.sample_stride) > 0


def length_sweep(experiment, paper_item, config, models, data, runner, scorers, lengths, scope) -> ExperimentResult:
    """PPL (and the other quality metrics) of every scorer at every length and protocol."""
    result = ExperimentResult()
    length_unit = models.segment_length
    evaluated = 0
    for protocol in config.protocols:
        for length in lengths:
            if not has_samples(config, data, length, length_unit, protocol):
                result.notes.append(
                    f"Input length {length} ({protocol}) left out: one sample needs {length + length_unit} tokens, "
                    f"the test data has {len(data)}."
                )
                continue
            samples = protocol_samples(config, data, length, length_unit, protocol)
            for name, scorer in scorers.items():
                result.models[name] = scorer.describe() | {"weights": models.weights_of(scorer)}
                fields = {"protocol": protocol, "sequence_length": length}
                if not scorer.fits(length + length_unit):
                    result.metrics.append(
                        metric_record(
                            experiment,
                            paper_item,
                            name,
                            "perplexity",
                            None,
                            weights=models.weights_of(scorer),
                            note=f"not run: {length + length_unit} tokens exceed its "
                            f"{scorer.max_input_length} positions",
                            **fields,
                        )
                    )
                    continue
                outcome = runner.evaluate(scorer, samples, scope, desc=f"{name} @ {length} ({protocol})")
                result.metrics += quality_records(
                    experiment, paper_item, name, scorer, outcome.metrics, models, runner.top_k, **fields
                )
                evaluated += 1
    if evaluated == 0:
        return ExperimentResult.skipped(
            f"no input length fits the test data ({len(data)} tokens); lengths asked: {list(lengths)}"
        )
    return result


def ablation_length(config, models, data) -> int | None:
    """The input length of the ablations: `config.ablation_length`, else the longest configured length the data
    holds a sample of."""
    segment_length = models.segment_length
    if config.ablation_length is not None:
        return config.ablation_length
    fitting = [
        length
        for length in config.sequence_lengths
        if all(has_samples(config, data, length, segment_length, p) for p in config.protocols)
    ]
    return max(fitting) if fitting else None


def variant_sweep(experiment, paper_item, config, models, data, runner, variants, notes=()) -> ExperimentResult:
    """Quality metrics of HMT variants at the ablation length. `variants`: `(label, checkpoint key, overrides,
    use_memory)`; a checkpoint registered under the key replaces the config switch on the base weights."""
    length = ablation_length(config, models, data)
    if length is None:
        return ExperimentResult.skipped(f"the test data ({len(data)} tokens) holds no sample of any configured length")
    result = ExperimentResult(notes=list(notes))
    segment_length = models.segment_length
    for protocol in config.protocols:
        if not has_samples(config, data, length, segment_length, protocol):
            result.notes.append(f"{protocol}: no sample of {length} + {segment_length} tokens in the test data.")
            continue
        samples = protocol_samples(config, data, length, segment_length, protocol)
        for label, key, overrides, use_memory in variants:
            path = config.variant_checkpoints.get(key) if key else None
            model = models.checkpoint(path) if path else models.hmt
            try:
                scorer = HMTScorer(
                    model,
                    name=f"HMT {label}",
                    use_memory=use_memory,
                    overrides={} if path else overrides,
                    max_logit_positions=config.max_logit_positions,
                )
            except ValueError as error:
                result.notes.append(f"Variant {label} left out: {error}")
                continue
            how = f"checkpoint {path}" if path else ("config switch on the run's HMT weights" if overrides else None)
            result.models[scorer.name] = scorer.describe() | {"weights": models.weights_of(scorer), "variant": how}
            outcome = runner.evaluate(scorer, samples, experiment, desc=f"{label} ({protocol})")
            result.metrics += quality_records(
                experiment,
                paper_item,
                "HMT",
                scorer,
                outcome.metrics,
                models,
                runner.top_k,
                variant=label,
                protocol=protocol,
                sequence_length=length,
                note=how,
            )
    return result


def required_tokens(config: ExperimentConfig, segment_length: int) -> int:
    """Tokens of test data the configured experiments can use (more are not tokenized)."""
    lengths = [*config.sequence_lengths, config.long_length]
    if config.ablation_length:
        lengths.append(config.ablation_length)
    if config.efficiency_length:
        lengths.append(config.efficiency_length)
    needed = 0
    for protocol in set(config.protocols) | {"all_tokens"}:
        for length in lengths:
            sample = length + segment_length
            stride = config.sample_stride or (segment_length if protocol == "last_segment" else sample)
            needed = max(needed, sample + (config.num_samples - 1) * stride)
    return needed


def load_corpus(config: ExperimentConfig, models: ModelSet) -> EvalCorpus:
    """The test token stream of the run: `config.dataset` tokenized with the run's tokenizer (only as many
    documents as the experiments can use), or random ids for `"random"` (no bytes, so no bits-per-byte)."""
    needed = required_tokens(config, models.segment_length)
    if config.dataset == "random":
        generator = torch.Generator().manual_seed(config.seed)
        vocab = models.hmt.get_input_embeddings().num_embeddings
        ids = torch.randint(0, vocab, (needed,), generator=generator)
        return EvalCorpus(ids, None, [0], f"random token ids (seed {config.seed})")
    texts, source = load_texts(config.dataset, config.data_dir)
    return EvalCorpus.from_texts(texts, models.tokenizer, max_tokens=needed, source=source)
