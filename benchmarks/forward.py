"""Forward-pass cost of HMT against the plain chunked backbone, and how HMT's peak memory grows with length.

Both are measured side by side in one run, on one document, with the same backbone and segment length `L`:

* time of `model(ids, logits_to_keep=1)` (HMT) against the backbone called on independent `L`-token chunks
  (`backbone(input_ids=chunk, use_cache=False)` per chunk, keeping only the last chunk's logits), under
  `torch.inference_mode()`, after a warm-up, repetitions interleaved (AB BA AB ...), medians compared;
* peak RSS of one HMT forward at a short and a long length (4k and 32k tokens; 4k and 16k with `--quick`), each in
  a fresh subprocess (they may overlap each other, never the timing), read from the kernel's peak counter
  (VmHWM) after it was reset behind model loading and a two-segment warm-up. `ru_maxrss` is reported too, but it
  cannot be reset and de-quantising the GGUF peaks above a short forward.

Both paths produce the same output, the last position's logits: HMT with `logits_to_keep=1`, the baseline with
`logits_to_keep=1` on every chunk, so neither runs the vocabulary projection where nothing reads it.

The cost floor of HMT per segment is `(L + k + 2 + j + 2) / L` backbone positions per new token: the segment pass
reads memory slot + `k` sensory tokens + `L` tokens + memory slot, the representation pass reads `T` + `j` tokens +
`T` (`k` = sensory_memory_size, `j` = representation_length). Attention grows slightly faster than linearly and the
representation pass skips the LM head, so the measured ratio may land a little on either side of the floor. The
first segment of a document has no memory to search and skips the representation pass, which lowers the ratio
over `n` segments by about `(j + 2) / (n L)` (0.06 for `--quick`'s 8 segments, 0.016 for the full run's 32).

Commands (from the repository root; on 2 CPU cores the full run takes ~11 min, `--quick` ~3 min)::

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/forward.py            # full: 8k timing tokens, 4k vs 32k
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/forward.py --quick    # 2k timing tokens, 4k vs 16k
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/forward.py --backbone tiny --quick   # seconds, random Llama

Torch uses one thread unless `--threads` says otherwise: see the comment at `--threads`.

The last output line is one JSON object with these keys:

* `benchmark`: "forward".
* `backbone`: backbone name ("smollm2" is SmolLM2-135M-Instruct Q4_1 GGUF, de-quantised to fp32).
* `quick`: whether `--quick` was given.
* `segment_length`, `sensory_memory_size`, `representation_length`, `num_memory_embeddings`,
  `representation_batch_size`: the HMTConfig fields used (`L`, `k`, `j`, `N`, segments per batched
  representation pass; the library default unless `--representation-batch-size` is given).
* `threads`: torch intra-op threads.
* `text`: where the token ids came from ("shakespeare:<file>" or "random").
* `timing_tokens`: document length used for timing; `repetitions`: timed runs of each path.
* `chunked_seconds`, `hmt_seconds`: every timed run, in order; `chunked_seconds_median`, `hmt_seconds_median`.
* `overhead_vs_chunked`: median HMT time / median chunked-backbone time.
* `analytic_floor`: `(L + k + 2 + j + 2) / L`.
* `overhead_target`: `1.10 * analytic_floor`; `overhead_pass`: `overhead_vs_chunked <= overhead_target`.
* `peak_memory_lengths`: `[short, long]` token counts of the peak-memory runs (the key names below say 4k/32k
  also when `--quick` uses other lengths). This and the keys down to `peak_rss_source` are absent with
  `--skip-peak`.
* `model_rss_mib`: `{length: RSS after loading the model and a two-segment warm-up, before the forward}` (MiB).
* `peak_rss_mib`: `{length: peak RSS during the HMT forward}`; `activation_mib`: `{length: peak - model}`.
* `lifetime_max_rss_mib`: `{length: getrusage ru_maxrss of the subprocess}`, which includes model loading.
* `peak_forward_seconds`: `{length: seconds of the measured forward}`.
* `peak_memory_ratio_32k_vs_4k`: peak RSS during forward, long / short (the number compared to the target).
* `peak_memory_ratio_activation_only`: activation part, long / short.
* `peak_memory_target`: 1.10; `peak_memory_pass`: `peak_memory_ratio_32k_vs_4k <= 1.10`.
* `peak_rss_source`: "VmHWM after reset" or "ru_maxrss" (where the peak counter cannot be reset).
* `logits_note`: how logits were kept.
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
    release_free_memory,
    run_json_subprocesses,
    set_threads,
    subprocess_flags,
)

from hmt_hf.peak_memory import lifetime_peak_rss_mib, peak_memory_mib, reset_peak_memory, rss_mib

CONFIG_KEYS = (
    "segment_length",
    "sensory_memory_size",
    "representation_length",
    "num_memory_embeddings",
    "representation_batch_size",
)
OVERHEAD_TOLERANCE = 1.10
PEAK_MEMORY_TARGET = 1.10
LOGITS_NOTE = (
    "Both return the last position's logits: HMT with logits_to_keep=1, the chunked backbone with logits_to_keep=1 "
    "per chunk, so neither runs the LM head where nothing reads it."
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing tokens, peak memory at 4k vs 16k")
    parser.add_argument("--backbone", default="smollm2", help="smollm2 (default), tiny, or a folder / Hub id")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --backbone, if any")
    parser.add_argument("--segment-length", type=int, default=256)
    parser.add_argument("--sensory-memory-size", type=int, default=32)
    parser.add_argument("--representation-length", type=int, default=128)
    parser.add_argument("--num-memory-embeddings", type=int, default=300)
    parser.add_argument(
        "--representation-batch-size", type=int, default=None, help="default: HMTConfig's; 0 means one batch (None)"
    )
    # One thread by default: on a 2-core machine shared with any other busy process, two OpenMP threads stall on
    # each other (seen here: 0.9 s -> 9 s per 256-token chunk), while one thread stays steady.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timing-tokens", type=int, default=None, help="default 8192 (2048 with --quick)")
    parser.add_argument("--repetitions", type=int, default=None, help="default 5 (3 with --quick)")
    parser.add_argument(
        "--peak-lengths", type=int, nargs=2, default=None, help="default 4096 32768 (4096 16384 with --quick)"
    )
    parser.add_argument("--skip-peak", action="store_true", help="timing only")
    parser.add_argument("--_measure-peak", dest="measure_peak", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_workdir", dest="workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.timing_tokens = args.timing_tokens or (2048 if args.quick else 8192)
    args.repetitions = args.repetitions or (3 if args.quick else 5)
    args.peak_lengths = sorted(args.peak_lengths or ([4096, 16384] if args.quick else [4096, 32768]))
    return args


def forward_hmt_fields(args) -> dict:
    """HMTConfig fields; the representation batch size is left to the library default unless given."""
    fields = hmt_fields(args)
    if args.representation_batch_size is not None:
        fields["representation_batch_size"] = args.representation_batch_size or None
    return fields


def analytic_floor(length: int, sensory: int, representation: int) -> float:
    return (length + sensory + 2 + representation + 2) / length


# ---------------------------------------------------------------------------------------------------- peak memory
def measure_peak(args) -> dict:
    """Subprocess mode: one HMT forward over `args.measure_peak` tokens; prints its memory as one JSON line."""
    set_threads(args.threads)
    workdir = Path(args.workdir)
    model = load_hmt(str(workdir / "backbone"), **forward_hmt_fields(args))
    ids = torch.load(workdir / "ids.pt")[:, : args.measure_peak]
    with torch.inference_mode():
        # A short warm-up keeps one-off lazy initialisation (kernels, thread pool) out of the measured peak.
        model(ids[:, : 2 * args.segment_length], logits_to_keep=1)
        release_free_memory()
        reset_ok = reset_peak_memory()
        model_rss = rss_mib()
        start = time.perf_counter()
        model(ids, logits_to_keep=1)
        seconds = time.perf_counter() - start
    peak = peak_memory_mib(since_reset=reset_ok)[0]
    return {
        "tokens": ids.shape[1],
        "model_rss_mib": model_rss,
        "peak_rss_mib": peak,
        "lifetime_max_rss_mib": lifetime_peak_rss_mib(),
        "seconds": seconds,
        "source": "VmHWM after reset" if reset_ok else "ru_maxrss",
    }


def peak_memory(args, workdir: Path) -> list[dict]:
    """Peak memory of one HMT forward per length, each in a fresh interpreter.

    The runs overlap when there are cores to spare (each process reads its own peak), which saves minutes; they
    run before the timing, never during it.
    """
    argvs = [
        [
            __file__,
            f"--_measure-peak={n}",
            f"--_workdir={workdir}",
            *subprocess_flags(args, "representation_batch_size"),
        ]
        for n in args.peak_lengths
    ]
    jobs = min(len(argvs), (os.cpu_count() or 1) // args.threads)
    return run_json_subprocesses(
        argvs, jobs, desc=f"peak memory ({len(argvs)} subprocesses, {max(jobs, 1)} at a time)"
    )


# ---------------------------------------------------------------------------------------------------- timing
def chunked_backbone(backbone, ids: torch.Tensor, length: int):
    """The baseline: the backbone on independent `length`-token chunks, producing the same output as the HMT call
    (the last position's logits): like HMT with `logits_to_keep=1`, its LM head runs on one position per chunk."""
    logits = None
    for chunk in ids.split(length, dim=1):
        logits = backbone(input_ids=chunk, use_cache=False, logits_to_keep=1).logits
    return logits


def time_forward(model, ids: torch.Tensor, args) -> dict[str, list[float]]:
    length = args.segment_length
    paths = {
        "chunked": lambda: chunked_backbone(model.backbone, ids, length),
        "hmt": lambda: model(ids, logits_to_keep=1),
    }
    with torch.inference_mode():
        # Warm-up over two segments (memory search included) so first-call costs land in neither path.
        warm = ids[:, : 2 * length]
        chunked_backbone(model.backbone, warm, length)
        model(warm, logits_to_keep=1)
        return interleaved_timings(paths, args.repetitions)


# ---------------------------------------------------------------------------------------------------- report
def summarise(args, config, text: str, times: dict, peaks: list[dict], wall: float) -> dict:
    floor = analytic_floor(args.segment_length, args.sensory_memory_size, args.representation_length)
    chunked, hmt = statistics.median(times["chunked"]), statistics.median(times["hmt"])
    result = {
        "benchmark": "forward",
        "backbone": args.backbone,
        "quick": args.quick,
        **{name: getattr(config, name) for name in CONFIG_KEYS},
        "threads": args.threads,
        "text": text,
        "timing_tokens": args.timing_tokens,
        "repetitions": args.repetitions,
        "chunked_seconds": [round(t, 3) for t in times["chunked"]],
        "hmt_seconds": [round(t, 3) for t in times["hmt"]],
        "chunked_seconds_median": round(chunked, 3),
        "hmt_seconds_median": round(hmt, 3),
        "overhead_vs_chunked": round(hmt / chunked, 4),
        "analytic_floor": round(floor, 4),
        "overhead_target": round(OVERHEAD_TOLERANCE * floor, 4),
        "overhead_pass": hmt / chunked <= OVERHEAD_TOLERANCE * floor,
    }
    if peaks:
        result |= summarise_peaks(peaks)
    result["logits_note"] = LOGITS_NOTE
    result["wall_seconds"] = round(wall, 1)
    return result


def summarise_peaks(peaks: list[dict]) -> dict:
    for run in peaks:
        run["activation_mib"] = run["peak_rss_mib"] - run["model_rss_mib"]
    short, long = peaks

    def by_length(key: str) -> dict:
        return {str(run["tokens"]): round(run[key], 1) for run in peaks}

    ratio = long["peak_rss_mib"] / short["peak_rss_mib"]
    return {
        "peak_memory_lengths": [short["tokens"], long["tokens"]],
        "model_rss_mib": by_length("model_rss_mib"),
        "peak_rss_mib": by_length("peak_rss_mib"),
        "activation_mib": by_length("activation_mib"),
        "lifetime_max_rss_mib": by_length("lifetime_max_rss_mib"),
        "peak_forward_seconds": by_length("seconds"),
        "peak_memory_ratio_32k_vs_4k": round(ratio, 4),
        "peak_memory_ratio_activation_only": round(long["activation_mib"] / max(short["activation_mib"], 1e-9), 4),
        "peak_memory_target": PEAK_MEMORY_TARGET,
        "peak_memory_pass": ratio <= PEAK_MEMORY_TARGET,
        "peak_rss_source": short["source"],
    }


def print_tables(result: dict):
    import pandas as pd

    tokens = result["timing_tokens"]
    timing = pd.DataFrame(
        {
            "median s": [result["chunked_seconds_median"], result["hmt_seconds_median"]],
            "runs (s)": [result["chunked_seconds"], result["hmt_seconds"]],
            "ms / token": [1000 * result[f"{p}_seconds_median"] / tokens for p in ("chunked", "hmt")],
        },
        index=["chunked backbone", "HMT"],
    )
    print(
        f"\nForward time on {tokens} tokens ({result['text']}), L={result['segment_length']}, "
        f"k={result['sensory_memory_size']}, j={result['representation_length']}, threads={result['threads']}"
    )
    print(timing.round(3).to_string())
    verdict = "PASS" if result["overhead_pass"] else "FAIL"
    print(
        f"overhead_vs_chunked = {result['overhead_vs_chunked']:.3f}   analytic floor = {result['analytic_floor']:.3f}"
        f"   target <= {result['overhead_target']:.3f}   {verdict}"
    )
    if "peak_rss_mib" in result:
        lengths = [str(n) for n in result["peak_memory_lengths"]]
        memory = pd.DataFrame(
            {
                key: [result[key][n] for n in lengths]
                for key in (
                    "model_rss_mib",
                    "peak_rss_mib",
                    "activation_mib",
                    "lifetime_max_rss_mib",
                    "peak_forward_seconds",
                )
            },
            index=[f"HMT {n} tokens" for n in lengths],
        )
        print(f"\nPeak memory of one HMT forward (fresh subprocess per length; {result['peak_rss_source']}; MiB)")
        print(memory.to_string())
        verdict = "PASS" if result["peak_memory_pass"] else "FAIL"
        print(
            f"peak RSS during forward, {lengths[1]} / {lengths[0]} tokens = "
            f"{result['peak_memory_ratio_32k_vs_4k']:.3f} (target <= {PEAK_MEMORY_TARGET}) {verdict}"
        )
        print(
            f"activation only (peak - model), {lengths[1]} / {lengths[0]} tokens = "
            f"{result['peak_memory_ratio_activation_only']:.3f}"
        )
    print(f"\n{result['logits_note']}")


def main(argv=None):
    args = parse_args(argv)
    if args.measure_peak is not None:
        print(json.dumps(measure_peak(args)))
        return
    started = time.perf_counter()
    set_threads(args.threads)
    model = load_hmt(args.backbone, gguf_file=args.gguf_file, **forward_hmt_fields(args))
    vocab_size = model.get_input_embeddings().num_embeddings
    tokens_needed = max([args.timing_tokens, *([] if args.skip_peak else args.peak_lengths)])
    ids, text = document_ids(load_tokenizer(args.backbone, args.gguf_file), tokens_needed, vocab_size)
    peaks = []
    if not args.skip_peak:
        with tempfile.TemporaryDirectory(prefix="hmt_bench_") as workdir:
            # Subprocesses reload the de-quantised backbone from safetensors in about a second instead of
            # de-quantising the GGUF again; the memory parameters are re-initialised, which does not change cost.
            model.backbone.save_pretrained(Path(workdir) / "backbone")
            torch.save(ids, Path(workdir) / "ids.pt")
            peaks = peak_memory(args, Path(workdir))
    times = time_forward(model, ids[:, : args.timing_tokens], args)
    result = summarise(args, model.config, text, times, peaks, time.perf_counter() - started)
    print_tables(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
