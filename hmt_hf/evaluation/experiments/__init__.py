"""The named experiments of the reproduction suite, each mapped to the paper item it reproduces, one family per
module: `perplexity` (Figs. 2-3, Tables 2 and 4), `ablations` (Figs. 8-10, Tables 8-9), `training_runs` (Fig. 12),
`efficiency`, `pubmedqa`; what they share (`Runner`, `Experiment`, the registry, sweeps) is in `base`, the models in
`models`. Dependencies point one way: models ← base ← families ← this registry.

An experiment is a function `run(config, models, data, runner) -> ExperimentResult`: it reads the
[`ExperimentConfig`], takes its models from a [`ModelSet`] (loaded once, shared by all experiments), cuts samples
from the [`EvalCorpus`], scores them through the [`Runner`] (which caches every sample, so interrupted runs
resume) and returns metric records, notes and curves. `hmt-hf reproduce` runs a list of them and writes the run
directory.

| experiment | paper item | also accepted | what |
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

from .ablations import run_bptt_depth, run_cache_size, run_representation_length, run_retrieval, run_sensory_size
from .base import (
    EXPERIMENTS,
    Experiment,
    ExperimentResult,
    Runner,
    load_corpus,
    register_experiment,
    required_tokens,
    resolve_experiments,
)
from .efficiency import run_efficiency
from .models import HMT_FIELDS, PAPER_HMT_FIELDS, ModelSet
from .perplexity import run_average_ppl, run_long_input, run_ppl_vs_length
from .pubmedqa import run_pubmedqa
from .training_runs import run_two_stage

__all__ = [
    "EXPERIMENTS",
    "HMT_FIELDS",
    "PAPER_HMT_FIELDS",
    "Experiment",
    "ExperimentResult",
    "ModelSet",
    "Runner",
    "load_corpus",
    "register_experiment",
    "required_tokens",
    "resolve_experiments",
]

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
