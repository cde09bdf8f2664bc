"""Training-step cost of HMT against its backbone on the same tokens, with and without activation checkpointing.

One optimizer step = forward with the LM loss over every token, backward, `AdamW.step()`, `zero_grad()`, on one
window of `D x L` tokens (`D` = BPTT depth, `L` = segment length), in training mode. Four configurations, measured
side by side in one run on the same window with the same weights:

* `hmt`: HMT in stage-2 mode (memory search on), backpropagation through all `D` segments;
* `backbone`: the plain backbone trained on the same `D x L` tokens — full causal attention over the whole window
  when it fits the backbone's context (`D x L <= max_position_embeddings`; SmolLM2: 8192), otherwise the `D`
  chunks of `L` tokens as a batch of independent sequences (the chunked baseline). `baseline` in the JSON says
  which was used;
* `hmt_checkpointing`, `backbone_checkpointing`: the same with activation checkpointing on the backbone's decoder
  layers (`activation_checkpointing_enable()`, non-reentrant), which recomputes their activations in backward.

Timing: one process, after a warm-up step of every configuration (AdamW allocates its state on its first step),
repetitions interleaved (AB BA AB ...), medians compared. HMT and the backbone share the backbone's weights and one
AdamW over all HMT parameters (the backbone path leaves the memory parameters without gradient, so AdamW skips
them). Peak memory: each configuration in a fresh subprocess, which builds the same model, runs one warm-up step,
resets the kernel's peak-RSS counter (VmHWM) and reads it after one more step. On CPU the peak holds weights,
gradients and AdamW state (about 4x the parameters) besides activations; `activation_mib` is the part above the
memory held before the step.

Commands (from the repository root; torch uses one thread unless `--threads` says otherwise, see forward.py).
`--quick` took 12.5 min on this project's 2-core CPU machine while other jobs ran (load average ~7); the full run
does about 4x the work per step (3840 vs 1024 tokens, 3 vs 2 repetitions)::

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/training.py            # SmolLM2-135M, D=15, L=256 (3840 tokens)
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/training.py --quick    # SmolLM2-135M, D=4, L=256 (1024 tokens)
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/training.py --backbone tiny --quick   # seconds, random Llama

The last output line is one JSON object with these keys:

* `benchmark`: "training".
* `backbone`: backbone name ("smollm2" is SmolLM2-135M-Instruct Q4_1 GGUF, de-quantised to fp32).
* `quick`: whether `--quick` was given.
* `segment_length`, `sensory_memory_size`, `representation_length`, `num_memory_embeddings`: HMTConfig fields
  (`L`, `k`, `j`, `N`); `use_memory_search`: true (stage 2).
* `bptt_depth`: `D`; `batch_size`: windows per step; `tokens_per_step`: `batch_size x D x L`.
* `baseline`: "full attention over D x L tokens" or "D independent chunks of L tokens" (see above).
* `threads`: torch intra-op threads; `text`: where the token ids came from; `dtype`: parameter dtype.
* `repetitions`: timed steps per configuration.
* `step_seconds`: `{config: [seconds of every timed step]}`; `step_seconds_median`: `{config: median}`.
* `step_time_ratio_vs_backbone`: median `hmt` / median `backbone` step time (no checkpointing).
* `step_time_ratio_vs_backbone_checkpointing`: the same, both with activation checkpointing.
* `checkpointing_time_ratio`: median `hmt_checkpointing` / median `hmt` (the recomputation cost).
* `tokens_per_second`: `{config: tokens_per_step / median step seconds}`.
* `peak_rss_mib`: `{config: peak RSS during one step}`; `rss_before_step_mib`: `{config: RSS before it}`;
  `activation_mib`: `{config: peak - before}`; `peak_rss_source`: "VmHWM after reset" or "ru_maxrss".
  These and the next two keys are absent with `--skip-peak`.
* `checkpointing_memory_ratio`: HMT peak RSS with checkpointing / without (whole-process peak, weights included).
* `checkpointing_activation_ratio`: the same for the activation part only.
* `losses`: `{config: loss of the last timed step}` (HMT and backbone losses differ: different models).
* `wall_seconds`: wall time of the whole benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import (
    document_ids,
    hmt_fields,
    interleaved_timings,
    load_hmt,
    load_tokenizer,
    peak_rss_since_reset_mib,
    release_free_memory,
    reset_peak_rss,
    rss_mib,
    run_json_subprocesses,
    set_threads,
    subprocess_flags,
    tiny_backbone,
)

CONFIGS = ("hmt", "backbone", "hmt_checkpointing", "backbone_checkpointing")
FULL_ATTENTION = "full attention over D x L tokens"
CHUNKED = "D independent chunks of L tokens"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="BPTT depth 4 instead of 15, 2 repetitions")
    parser.add_argument("--backbone", default="smollm2", help="smollm2 (default), tiny, or a folder / Hub id")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --backbone, if any")
    parser.add_argument("--segment-length", type=int, default=256)
    parser.add_argument("--sensory-memory-size", type=int, default=32)
    parser.add_argument("--representation-length", type=int, default=128)
    parser.add_argument("--num-memory-embeddings", type=int, default=300)
    parser.add_argument("--bptt-depth", type=int, default=None, help="default 15 (4 with --quick)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=None, help="default 3 (2 with --quick)")
    parser.add_argument("--skip-peak", action="store_true", help="timing only")
    parser.add_argument("--_measure-peak", dest="measure_peak", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_workdir", dest="workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.bptt_depth = args.bptt_depth or (4 if args.quick else 15)
    args.repetitions = args.repetitions or (2 if args.quick else 3)
    return args


def stage2_fields(args) -> dict:
    return {**hmt_fields(args), "use_memory_search": True}


def load_model(args):
    """HMT over the requested backbone (a tiny Llama whose context holds the window, for `tiny`)."""
    if args.backbone == "tiny":
        backbone = tiny_backbone(max_positions=max(args.bptt_depth * args.segment_length, 4 * args.segment_length))
        model = load_hmt(backbone, **stage2_fields(args))
    else:
        model = load_hmt(args.backbone, gguf_file=args.gguf_file, **stage2_fields(args))
    return model.train()


def baseline_kind(model, tokens: int) -> str:
    context = getattr(model.config.text_config, "max_position_embeddings", None)
    return FULL_ATTENTION if context is None or tokens <= context else CHUNKED


# ---------------------------------------------------------------------------------------------------- one step
class StepRunner:
    """One optimizer step of each configuration on the same window `ids` `(B, D x L)`."""

    def __init__(self, model, ids: torch.Tensor, segment_length: int):
        self.model = model
        self.ids = ids
        self.chunked = baseline_kind(model, ids.shape[1]) == CHUNKED
        self.segment_length = segment_length
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        self.losses = {}

    def set_checkpointing(self, enabled: bool):
        if enabled and not self.model.is_activation_checkpointing:
            self.model.activation_checkpointing_enable()
        elif not enabled and self.model.is_activation_checkpointing:
            self.model.activation_checkpointing_disable()

    def loss(self, config: str) -> torch.Tensor:
        if config.startswith("hmt"):
            return self.model(self.ids, labels=self.ids).loss
        ids = self.ids
        if self.chunked:  # independent L-token sequences; a partial last chunk is dropped from the baseline
            usable = ids.shape[1] // self.segment_length * self.segment_length
            ids = ids[:, :usable].reshape(-1, self.segment_length)
        return self.model.backbone(input_ids=ids, labels=ids, use_cache=False).loss

    def step(self, config: str):
        self.set_checkpointing(config.endswith("checkpointing"))
        loss = self.loss(config)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses[config] = loss.item()


# ---------------------------------------------------------------------------------------------------- peak memory
def measure_peak(args) -> dict:
    """Subprocess mode: peak RSS of one step of `args.measure_peak`; prints one JSON line."""
    set_threads(args.threads)
    workdir = Path(args.workdir)
    model = load_hmt(str(workdir / "backbone"), **stage2_fields(args)).train()
    ids = torch.load(workdir / "ids.pt")
    runner = StepRunner(model, ids, args.segment_length)
    runner.step(args.measure_peak)  # AdamW state and one-off allocations land before the measured step
    release_free_memory()
    reset_ok = reset_peak_rss()
    before = rss_mib()
    start = time.perf_counter()
    runner.step(args.measure_peak)
    seconds = time.perf_counter() - start
    return {
        "config": args.measure_peak,
        "rss_before_step_mib": before,
        "peak_rss_mib": peak_rss_since_reset_mib(reset_ok),
        "seconds": seconds,
        "source": "VmHWM after reset" if reset_ok else "ru_maxrss",
    }


def peak_memory(args, workdir: Path) -> dict[str, dict]:
    """Each configuration's step in a fresh interpreter; they may overlap each other, never the timing."""
    argvs = [
        [
            __file__,
            f"--_measure-peak={c}",
            f"--_workdir={workdir}",
            *subprocess_flags(args, "bptt_depth", "batch_size"),
        ]
        for c in CONFIGS
    ]
    jobs = min(len(argvs), max(1, (os.cpu_count() or 1) // args.threads))
    runs = run_json_subprocesses(argvs, jobs, desc=f"peak memory ({len(argvs)} subprocesses, {jobs} at a time)")
    return {run["config"]: run for run in runs}


# ---------------------------------------------------------------------------------------------------- report
def summarise(args, model, text: str, runner: StepRunner, times: dict, peaks: dict, wall: float) -> dict:
    medians = {config: statistics.median(times[config]) for config in CONFIGS}
    tokens = runner.ids.numel()
    config = model.config
    result = {
        "benchmark": "training",
        "backbone": args.backbone,
        "quick": args.quick,
        "segment_length": config.segment_length,
        "sensory_memory_size": config.sensory_memory_size,
        "representation_length": config.representation_length,
        "num_memory_embeddings": config.num_memory_embeddings,
        "use_memory_search": config.use_memory_search,
        "bptt_depth": args.bptt_depth,
        "batch_size": args.batch_size,
        "tokens_per_step": tokens,
        "baseline": baseline_kind(model, runner.ids.shape[1]),
        "threads": args.threads,
        "text": text,
        "dtype": str(model.dtype).removeprefix("torch."),
        "repetitions": args.repetitions,
        "step_seconds": {c: [round(t, 3) for t in times[c]] for c in CONFIGS},
        "step_seconds_median": {c: round(medians[c], 3) for c in CONFIGS},
        "step_time_ratio_vs_backbone": round(medians["hmt"] / medians["backbone"], 4),
        "step_time_ratio_vs_backbone_checkpointing": round(
            medians["hmt_checkpointing"] / medians["backbone_checkpointing"], 4
        ),
        "checkpointing_time_ratio": round(medians["hmt_checkpointing"] / medians["hmt"], 4),
        "tokens_per_second": {c: round(tokens / medians[c], 1) for c in CONFIGS},
    }
    if peaks:
        for run in peaks.values():
            run["activation_mib"] = run["peak_rss_mib"] - run["rss_before_step_mib"]

        def by_config(key: str) -> dict:
            return {c: round(peaks[c][key], 1) for c in CONFIGS}

        result |= {
            "peak_rss_mib": by_config("peak_rss_mib"),
            "rss_before_step_mib": by_config("rss_before_step_mib"),
            "activation_mib": by_config("activation_mib"),
            "peak_rss_source": peaks["hmt"]["source"],
            "checkpointing_memory_ratio": round(
                peaks["hmt_checkpointing"]["peak_rss_mib"] / peaks["hmt"]["peak_rss_mib"], 4
            ),
            "checkpointing_activation_ratio": round(
                peaks["hmt_checkpointing"]["activation_mib"] / max(peaks["hmt"]["activation_mib"], 1e-9), 4
            ),
        }
    result["losses"] = {c: round(runner.losses[c], 4) for c in CONFIGS}
    result["wall_seconds"] = round(wall, 1)
    return result


def print_tables(result: dict):
    import pandas as pd

    rows = {
        "median step s": result["step_seconds_median"],
        "tokens / s": result["tokens_per_second"],
    }
    if "peak_rss_mib" in result:
        rows |= {"peak RSS MiB": result["peak_rss_mib"], "activation MiB": result["activation_mib"]}
    table = pd.DataFrame(rows).loc[list(CONFIGS)]
    print(
        f"\nOne optimizer step on {result['tokens_per_step']} tokens (D={result['bptt_depth']} x "
        f"L={result['segment_length']}, batch {result['batch_size']}, {result['text']}), backbone "
        f"{result['backbone']}, threads={result['threads']}; baseline: {result['baseline']}"
    )
    print(table.round(3).to_string())
    print(
        f"step_time_ratio_vs_backbone = {result['step_time_ratio_vs_backbone']:.3f}   "
        f"(with checkpointing {result['step_time_ratio_vs_backbone_checkpointing']:.3f})   "
        f"checkpointing_time_ratio = {result['checkpointing_time_ratio']:.3f}"
    )
    if "checkpointing_memory_ratio" in result:
        print(
            f"checkpointing_memory_ratio = {result['checkpointing_memory_ratio']:.3f} (whole process)   "
            f"activation part: {result['checkpointing_activation_ratio']:.3f}   ({result['peak_rss_source']})"
        )


def main(argv=None):
    args = parse_args(argv)
    if args.measure_peak is not None:
        print(json.dumps(measure_peak(args)))
        return
    started = time.perf_counter()
    set_threads(args.threads)
    model = load_model(args)
    tokens = args.bptt_depth * args.segment_length
    vocab_size = model.get_input_embeddings().num_embeddings
    ids, text = document_ids(load_tokenizer(args.backbone, args.gguf_file), args.batch_size * tokens, vocab_size)
    ids = ids.reshape(args.batch_size, tokens)
    peaks = {}
    if not args.skip_peak:
        with tempfile.TemporaryDirectory(prefix="hmt_bench_") as workdir:
            # Subprocesses reload the de-quantised backbone from safetensors in about a second; the memory
            # parameters are re-initialised, which does not change cost.
            model.backbone.save_pretrained(Path(workdir) / "backbone")
            torch.save(ids, Path(workdir) / "ids.pt")
            peaks = peak_memory(args, Path(workdir))
    runner = StepRunner(model, ids, args.segment_length)
    for config in CONFIGS:  # warm-up: AdamW state, kernels, checkpointing wrappers
        runner.step(config)
    times = interleaved_timings({config: (lambda c=config: runner.step(c)) for config in CONFIGS}, args.repetitions)
    result = summarise(args, model, text, runner, times, peaks, time.perf_counter() - started)
    print_tables(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
