"""Long-context inference: HMT's prefill cost per token and peak memory as the prompt grows, and its decode speed.

Measured in one run on one document (Shakespeare's plays, concatenated as needed), with the same backbone:

* **Prefill** — reading a prompt of `n` tokens into a state ready to decode, for `n` in 2k, 8k, 32k and 128k
  (`--quick`: 1k, 2k, 8k, 16k):
  - HMT: `model(ids, use_cache=True, logits_to_keep=1)`, the call `generate()` makes first (full segments go into
    memory, the last one is opened in the KV cache);
  - the backbone with full attention over the whole prompt, where it fits in `max_position_embeddings` (8k for
    SmolLM2): `backbone(ids, use_cache=True, logits_to_keep=1)`;
  - the chunked backbone: independent `L`-token chunks, `backbone(chunk, use_cache=False, logits_to_keep=1)`.
  Every HMT length runs in a fresh subprocess, which also reads its peak RSS during the prefill (the kernel's
  VmHWM counter, reset after loading and a two-segment warm-up); the peak-memory ratio compares 128k to 4k tokens
  (`--quick`: 16k to 4k). Runs are sequential (never overlapping a timing). The HMT 8k measurement runs both
  before and after the long ones, so a drift of the machine shows; all its runs are pooled. Backbone paths are
  timed in the main process after a warm-up. Short lengths are repeated (`--repetitions`), medians reported.
* **Decode** — tokens per second of greedy decoding, timed from the first generated token to the last with a
  logits processor that stamps each step (the prefill is excluded from both):
  - HMT: `model.generate(prompt, max_new_tokens=G)` with `G = 2.5 L` new tokens from a prompt that ends mid-segment,
    so decoding crosses at least two segment rollovers (each: the memory embedding of the closed segment, the
    memory search, the new segment's `[P ‖ sensory]` prefill); the KV cache holds at most one segment context
    (`1 + k + L + 1` positions);
  - the backbone's own `generate` with a KV cache over the same window: a prompt of `k + 2` tokens and `L` new
    tokens, so its cache grows over exactly the positions of one HMT segment context (34 → 1058 for L=1024).
  Runs are interleaved (AB BA ...); medians compared. EOS is suppressed (`min_new_tokens`) in both.

The backbone is SmolLM2-135M-Instruct (GGUF Q4_1, de-quantised to fp32) unless `--backbone` says otherwise; HMT
uses the paper's configuration by default: L = 1024, k = 32, j = 512, N = 300 (`--quick`: L = 256, j = 128). The
memory parameters are untrained; cost and memory do not depend on their values.

Commands (from the repository root, 2 CPU cores; full ~25 min, `--quick` ~4 min)::

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/inference.py
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/inference.py --quick
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/inference.py --backbone tiny --quick   # random Llama, seconds

It writes a PNG (`--plot`, default `benchmarks/results/inference[_quick].png`). The last output line is one JSON
object:

* `benchmark` ("inference"), `backbone`, `quick`, `threads`, `text`, `segment_length`, `sensory_memory_size`,
  `representation_length`, `num_memory_embeddings`, `repetitions`.
* `prefill_lengths`: prompt lengths; `prefill_ms_per_token`: `{path: {length: median ms per token}}` for `hmt`,
  `full_attention` (lengths that fit only) and `chunked`; `prefill_seconds`: every timed run per path and length.
* `prefill_cost_ratio_128k_vs_8k`: HMT ms/token at the longest length / at 8k (`--quick`: 16k / 2k; the key keeps
  its name); target 1.10, `prefill_cost_pass`.
* `hmt_vs_chunked_prefill`: HMT / chunked ms per token at each length; `hmt_vs_full_attention_prefill` likewise.
* `peak_rss_mib`, `model_rss_mib`: `{length: MiB}` for HMT prefills; `peak_memory_ratio_128k_vs_4k` (peak RSS
  during prefill, longest / 4k; target 1.10, `peak_memory_pass`); `peak_memory_ratio_activation_only`
  (peak − model RSS, same lengths); `peak_rss_source`.
* `decode_new_tokens`: `{hmt: G, backbone: L}`; `decode_rollovers`: segment rollovers during HMT decoding;
  `decode_tokens_per_second`: `{hmt: [...], backbone: [...]}` every run; `decode_tokens_per_second_median`;
  `decode_speed_ratio_vs_backbone`: HMT median / backbone median (target ≥ 0.80, `decode_speed_pass`);
  `decode_kv_window`: positions of the largest KV cache in each path.
* `plot`: the PNG written; `wall_seconds`.
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
    REPO_ROOT,
    document_ids,
    hmt_fields,
    interleaved_timings,
    load_hmt,
    load_tokenizer,
    release_free_memory,
    run_json_subprocess,
    set_threads,
    subprocess_flags,
)
from transformers import LogitsProcessor, LogitsProcessorList

from hmt_hf.peak_memory import peak_memory_mib, reset_peak_memory, rss_mib

PREFILL_TARGET = 1.10
PEAK_MEMORY_TARGET = 1.10
DECODE_TARGET = 0.80


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="L=256, prefill at 1k-16k, fewer repetitions")
    parser.add_argument("--backbone", default="smollm2", help="smollm2 (default), tiny, or a folder / Hub id")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --backbone, if any")
    parser.add_argument("--segment-length", type=int, default=None, help="default 1024 (256 with --quick)")
    parser.add_argument("--sensory-memory-size", type=int, default=32)
    parser.add_argument("--representation-length", type=int, default=None, help="default L // 2")
    parser.add_argument("--num-memory-embeddings", type=int, default=300)
    parser.add_argument("--prefill-lengths", type=int, nargs="+", default=None)
    parser.add_argument("--repetitions", type=int, default=None, help="default 3 (2 with --quick)")
    # One thread: on a 2-core machine two OpenMP threads stall on any other busy process (see forward.py).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", default=None, help="PNG path (default benchmarks/results/inference[_quick].png)")
    parser.add_argument("--_prefill", dest="prefill", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_workdir", dest="workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.segment_length = args.segment_length or (256 if args.quick else 1024)
    args.representation_length = args.representation_length or args.segment_length // 2
    args.prefill_lengths = sorted(args.prefill_lengths or ([1024, 2048, 8192, 16384] if args.quick else
                                                           [2048, 8192, 32768, 131072]))  # fmt: skip
    args.repetitions = args.repetitions or (2 if args.quick else 3)
    args.plot = args.plot or str(
        REPO_ROOT / "benchmarks" / "results" / f"inference{'_quick' if args.quick else ''}.png"
    )
    return args


def reference_lengths(args) -> tuple[int, int]:
    """(short, long) lengths of the prefill-flatness ratio: 8k (the backbone's context) vs the longest."""
    short = 8192 if 8192 in args.prefill_lengths else args.prefill_lengths[1]
    return short, args.prefill_lengths[-1]


# ---------------------------------------------------------------------------------------------------- prefill
def repetitions_for(length: int, args) -> int:
    """Short prompts are cheap: repeat them; the long ones run once (minutes each)."""
    return args.repetitions if length <= 8192 else 1


def measure_hmt_prefill(args) -> dict:
    """Subprocess mode: HMT prefill over `args.prefill` tokens, timed `repetitions_for` times; peak RSS of the first."""
    set_threads(args.threads)
    workdir = Path(args.workdir)
    model = load_hmt(str(workdir / "backbone"), **hmt_fields(args))
    ids = torch.load(workdir / "ids.pt")[:, : args.prefill]
    seconds = []
    with torch.inference_mode():
        model(ids[:, : 2 * args.segment_length], use_cache=True, logits_to_keep=1)  # warm-up: search included
        release_free_memory()
        reset_ok = reset_peak_memory()
        model_rss = rss_mib()
        peak = None
        for _ in range(repetitions_for(args.prefill, args)):
            start = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            seconds.append(time.perf_counter() - start)
            peak = peak if peak is not None else peak_memory_mib(since_reset=reset_ok)[0]
            del out
    return {
        "tokens": ids.shape[1],
        "seconds": seconds,
        "model_rss_mib": model_rss,
        "peak_rss_mib": peak,
        "source": "VmHWM after reset" if reset_ok else "ru_maxrss",
    }


def hmt_prefill_runs(args, workdir: Path) -> dict[int, list[dict]]:
    """Fresh subprocess per HMT length, one at a time; 8k (the flatness reference) again at the end."""
    short, _ = reference_lengths(args)
    lengths = sorted(set(args.prefill_lengths) | {4096}) + [short]
    runs: dict[int, list[dict]] = {}
    from tqdm.auto import tqdm

    for length in tqdm(lengths, desc="HMT prefill (subprocess per length)"):
        argv = [__file__, f"--_prefill={length}", f"--_workdir={workdir}", *subprocess_flags(args, "repetitions")]
        runs.setdefault(length, []).append(run_json_subprocess(argv))
    return runs


def chunked_prefill(backbone, ids: torch.Tensor, length: int):
    for chunk in ids.split(length, dim=1):
        logits = backbone(input_ids=chunk, use_cache=False, logits_to_keep=1).logits
    return logits


def backbone_prefill_times(model, ids: torch.Tensor, args) -> dict[str, dict[int, list[float]]]:
    """Full-attention (where it fits) and chunked backbone prefills, timed in this process."""
    backbone, length = model.backbone, args.segment_length
    max_positions = backbone.config.max_position_embeddings
    times: dict[str, dict[int, list[float]]] = {"full_attention": {}, "chunked": {}}
    with torch.inference_mode():
        chunked_prefill(backbone, ids[:, : 2 * length], length)  # warm-up
        for n in args.prefill_lengths:
            prompt = ids[:, :n]
            paths = {"chunked": lambda prompt=prompt: chunked_prefill(backbone, prompt, length)}
            if n <= max_positions:
                paths["full_attention"] = lambda prompt=prompt: backbone(prompt, use_cache=True, logits_to_keep=1)
            print(f"backbone prefill at {n} tokens: {', '.join(paths)}")
            for name, runs in interleaved_timings(paths, repetitions_for(n, args)).items():
                times[name][n] = runs
    return times


# ---------------------------------------------------------------------------------------------------- decode
class StepClock(LogitsProcessor):
    """Records the time of every decoding step (called once per generated token, after its forward)."""

    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores

    def tokens_per_second(self) -> float:
        """Tokens generated after the first, over the time from the first step to the last (prefill excluded)."""
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0])


def decode_speeds(model, ids: torch.Tensor, args) -> tuple[dict[str, list[float]], dict]:
    length, sensory = args.segment_length, args.sensory_memory_size
    hmt_new = int(2.5 * length)
    hmt_prompt = ids[:, : length + length // 2]  # ends mid-segment: rollovers at L/2 and 3L/2 new tokens
    backbone_prompt = ids[:, : sensory + 2]
    speeds: dict[str, list[float]] = {"hmt": [], "backbone": []}

    def run(name: str, generator, prompt, new_tokens: int):
        clock = StepClock()
        generator.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([clock]),
            pad_token_id=0,
        )
        assert len(clock.stamps) == new_tokens
        speeds[name].append(clock.tokens_per_second())

    paths = {
        "hmt": lambda: run("hmt", model, hmt_prompt, hmt_new),
        "backbone": lambda: run("backbone", model.backbone, backbone_prompt, length),
    }
    with torch.inference_mode():
        model.generate(ids[:, : length - 8], max_new_tokens=16, min_new_tokens=16, pad_token_id=0)  # warm-up
        model.backbone.generate(backbone_prompt, max_new_tokens=16, min_new_tokens=16, pad_token_id=0)
        interleaved_timings(paths, args.repetitions)
    rollovers = (hmt_prompt.shape[1] % length + hmt_new - 1) // length
    info = {
        "decode_new_tokens": {"hmt": hmt_new, "backbone": length},
        "decode_rollovers": rollovers,
        "decode_kv_window": {"hmt": 1 + sensory + length + 1, "backbone": sensory + 2 + length},
    }
    return speeds, info


# ---------------------------------------------------------------------------------------------------- report
def summarise(args, text, hmt_runs, backbone_times, speeds, decode_info, wall) -> dict:
    def ms_per_token(runs_by_length: dict[int, list[float]]) -> dict[str, float]:
        return {str(n): round(1000 * statistics.median(r) / n, 4) for n, r in sorted(runs_by_length.items())}

    hmt_seconds = {n: [s for run in runs for s in run["seconds"]] for n, runs in hmt_runs.items()}
    hmt_seconds = {n: s for n, s in hmt_seconds.items() if n in args.prefill_lengths}
    per_token = {"hmt": ms_per_token(hmt_seconds), **{k: ms_per_token(v) for k, v in backbone_times.items()}}
    short, long = reference_lengths(args)
    prefill_ratio = per_token["hmt"][str(long)] / per_token["hmt"][str(short)]
    peaks = {n: runs[0] for n, runs in hmt_runs.items()}
    peak_ratio = peaks[long]["peak_rss_mib"] / peaks[4096]["peak_rss_mib"]
    activation_ratio = (peaks[long]["peak_rss_mib"] - peaks[long]["model_rss_mib"]) / max(
        peaks[4096]["peak_rss_mib"] - peaks[4096]["model_rss_mib"], 1e-9
    )
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    decode_ratio = medians["hmt"] / medians["backbone"]

    def relative(path: str) -> dict[str, float]:
        return {n: round(per_token["hmt"][n] / v, 4) for n, v in per_token[path].items()}

    return {
        "benchmark": "inference",
        "backbone": args.backbone,
        "quick": args.quick,
        "threads": args.threads,
        "text": text,
        **hmt_fields(args),
        "repetitions": args.repetitions,
        "prefill_lengths": args.prefill_lengths,
        "prefill_ms_per_token": per_token,
        "prefill_seconds": {
            "hmt": {str(n): [round(s, 3) for s in r] for n, r in sorted(hmt_seconds.items())},
            **{k: {str(n): [round(s, 3) for s in r] for n, r in v.items()} for k, v in backbone_times.items()},
        },
        "prefill_ratio_lengths": [short, long],
        "prefill_cost_ratio_128k_vs_8k": round(prefill_ratio, 4),
        "prefill_cost_target": PREFILL_TARGET,
        "prefill_cost_pass": prefill_ratio <= PREFILL_TARGET,
        "hmt_vs_chunked_prefill": relative("chunked"),
        "hmt_vs_full_attention_prefill": relative("full_attention"),
        "peak_rss_mib": {str(n): round(p["peak_rss_mib"], 1) for n, p in sorted(peaks.items())},
        "model_rss_mib": {str(n): round(p["model_rss_mib"], 1) for n, p in sorted(peaks.items())},
        "peak_memory_lengths": [4096, long],
        "peak_memory_ratio_128k_vs_4k": round(peak_ratio, 4),
        "peak_memory_ratio_activation_only": round(activation_ratio, 4),
        "peak_memory_target": PEAK_MEMORY_TARGET,
        "peak_memory_pass": peak_ratio <= PEAK_MEMORY_TARGET,
        "peak_rss_source": peaks[long]["source"],
        **decode_info,
        "decode_tokens_per_second": {k: [round(v, 2) for v in vs] for k, vs in speeds.items()},
        "decode_tokens_per_second_median": {k: round(v, 2) for k, v in medians.items()},
        "decode_speed_ratio_vs_backbone": round(decode_ratio, 4),
        "decode_speed_target": DECODE_TARGET,
        "decode_speed_pass": decode_ratio >= DECODE_TARGET,
        "plot": os.path.relpath(args.plot, REPO_ROOT),  # no machine-specific absolute path in committed results
        "wall_seconds": round(wall, 1),
    }


def print_tables(result: dict):
    import pandas as pd

    table = pd.DataFrame(result["prefill_ms_per_token"]).reindex([str(n) for n in result["prefill_lengths"]])
    print(f"\nPrefill ms per token ({result['text']}; L={result['segment_length']}, threads={result['threads']})")
    print(table.to_string(na_rep="n/a (exceeds context)"))
    short, long = result["prefill_ratio_lengths"]
    verdict = "PASS" if result["prefill_cost_pass"] else "FAIL"
    print(f"prefill cost per token, HMT {long} / {short}: {result['prefill_cost_ratio_128k_vs_8k']:.3f} "
          f"(target <= {PREFILL_TARGET}) {verdict}")  # fmt: skip
    memory = pd.DataFrame({"model_rss_mib": result["model_rss_mib"], "peak_rss_mib": result["peak_rss_mib"]})
    print(f"\nHMT peak RSS during prefill (MiB, {result['peak_rss_source']})\n{memory.to_string()}")
    verdict = "PASS" if result["peak_memory_pass"] else "FAIL"
    print(f"peak memory HMT {long} / 4096: {result['peak_memory_ratio_128k_vs_4k']:.3f} "
          f"(target <= {PEAK_MEMORY_TARGET}) {verdict}")  # fmt: skip
    speeds = result["decode_tokens_per_second_median"]
    verdict = "PASS" if result["decode_speed_pass"] else "FAIL"
    print(
        f"\nDecode tokens/s (median): HMT {speeds['hmt']:.2f} ({result['decode_new_tokens']['hmt']} tokens, "
        f"{result['decode_rollovers']} rollovers) vs backbone {speeds['backbone']:.2f} "
        f"({result['decode_new_tokens']['backbone']} tokens, same KV window): ratio "
        f"{result['decode_speed_ratio_vs_backbone']:.3f} (target >= {DECODE_TARGET}) {verdict}"
    )


def plot(result: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (prefill_axis, memory_axis, decode_axis) = plt.subplots(1, 3, figsize=(15, 4.2))
    labels = {"hmt": "HMT", "full_attention": "backbone, full attention", "chunked": "backbone, chunked"}
    for path, values in result["prefill_ms_per_token"].items():
        lengths = [int(n) for n in values]
        prefill_axis.plot(lengths, list(values.values()), marker="o", label=labels[path])
    prefill_axis.set(xscale="log", xlabel="prompt tokens", ylabel="prefill ms / token", title="Prefill cost per token")
    prefill_axis.set_ylim(bottom=0)
    prefill_axis.legend()
    peaks = result["peak_rss_mib"]
    memory_axis.plot([int(n) for n in peaks], list(peaks.values()), marker="o", label="peak during prefill")
    memory_axis.plot([int(n) for n in peaks], list(result["model_rss_mib"].values()), "--", label="model loaded")
    memory_axis.set(xscale="log", xlabel="prompt tokens", ylabel="RSS (MiB)", title="HMT peak memory")
    memory_axis.set_ylim(bottom=0)
    memory_axis.legend()
    speeds = result["decode_tokens_per_second_median"]
    decode_axis.bar(["HMT", "backbone (same KV window)"], [speeds["hmt"], speeds["backbone"]], color=["C0", "C1"])
    decode_axis.set(ylabel="tokens / s", title=f"Greedy decode (ratio {result['decode_speed_ratio_vs_backbone']:.2f})")
    figure.suptitle(
        f"{result['backbone']} · L={result['segment_length']} k={result['sensory_memory_size']} "
        f"j={result['representation_length']} N={result['num_memory_embeddings']} · {result['threads']} thread(s)"
    )
    figure.tight_layout()
    path = REPO_ROOT / result["plot"]
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    if args.prefill is not None:
        print(json.dumps(measure_hmt_prefill(args)))
        return
    started = time.perf_counter()
    set_threads(args.threads)
    model = load_hmt(args.backbone, gguf_file=args.gguf_file, **hmt_fields(args))
    vocab_size = model.get_input_embeddings().num_embeddings
    ids, text = document_ids(load_tokenizer(args.backbone, args.gguf_file), max(args.prefill_lengths), vocab_size)
    with tempfile.TemporaryDirectory(prefix="hmt_bench_") as workdir:
        # Subprocesses reload the de-quantised backbone from safetensors in a second instead of de-quantising again.
        model.backbone.save_pretrained(Path(workdir) / "backbone")
        torch.save(ids, Path(workdir) / "ids.pt")
        hmt_runs = hmt_prefill_runs(args, Path(workdir))
    backbone_times = backbone_prefill_times(model, ids, args)
    speeds, decode_info = decode_speeds(model, ids, args)
    result = summarise(args, text, hmt_runs, backbone_times, speeds, decode_info, time.perf_counter() - started)
    plot(result)
    print_tables(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
