#!/usr/bin/env python
"""Does HMT's memory help? Held-out perplexity of HMT against the chunked backbone, sample by sample.

Two measurements (both on the test split of the offline corpora, `hmt-hf prepare-data NAME --output-dir DIR`):

* `untrained`: a freshly converted HMT (`from_backbone`, memory parameters untrained) in the default layout
  (`attention_sink=True`) and in the paper's exact layout (`attention_sink=False`, Eq. 4: the memory slot at
  position 0), against the plain chunked backbone at the same L. Plus the diagnostics that explain the difference:
  per-segment losses, attention mass on position 0, memory-embedding norms, retrieval-weight entropy.
* `trained`: checkpoints written by `examples/train_hmt.py` with `--method hmt|rmt|chunked` on the same windows,
  steps and schedule: HMT (paper and causal retrieval) and RMT against the chunked baselines.

Every sample is a contiguous piece of the concatenated test documents (an EOS between documents), cut without
overlap and spread over the stream; each model scores the same samples. Two protocols from the same forward pass:
`all_tokens` (every target 1..T-1) and `last_segment` (the paper's: the targets of the sample's last segment).
Perplexities are token-weighted over samples; `worst`/`best` are the extreme per-sample ratios to the reference.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/memory_quality.py untrained --corpora books,wiki,arxiv \\
        --lengths 1024,4096,16384 --output reports/untrained_memory
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/memory_quality.py trained --corpora books,wiki \\
        --lengths 2048,8192,16384 --checkpoint HMT=runs/books-cpu/hmt/stage2 ... --output reports/books_cpu
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch  # noqa: I001
from common import load_tokenizer, set_threads, smollm2_location

from hmt_hf import HMTForCausalLM
from hmt_hf.evaluation import ChunkedTransformer, HMTScorer
from hmt_hf.evaluation.baselines import hmt_overrides
from hmt_hf.evaluation.corpus import EvalCorpus, load_texts

PROTOCOLS = ("all_tokens", "last_segment")


# ---------------------------------------------------------------------------------------------------- samples
def corpus_samples(corpus: str, data_root: str, tokenizer, length: int, count: int) -> list[torch.Tensor]:
    """Up to `count` non-overlapping `length`-token samples spread evenly over the corpus's test stream."""
    texts, _ = load_texts(corpus, f"{data_root}/{corpus}")
    stream = EvalCorpus.from_texts(texts, tokenizer, source=corpus).token_ids
    available = len(stream) // length
    if available == 0:
        return []
    count = min(count, available)
    stride = (len(stream) - length) // max(count - 1, 1) if count > 1 else 0
    return [stream[i * stride : i * stride + length] for i in range(count)]


def token_nll(scorer, sample: torch.Tensor) -> torch.Tensor:
    """`(T,)` float64 NLL of targets 1..T-1 (position 0 holds 0)."""
    scores = scorer.score(sample[None], first_target=1)
    assert bool(scores.scored[0, 1:].all()), f"{scorer.name} left targets unscored"
    return scores.nll[0].double()


def protocol_nll(nll: torch.Tensor, segment_length: int) -> dict[str, torch.Tensor]:
    last_start = (len(nll) - 1) // segment_length * segment_length
    return {"all_tokens": nll[1:], "last_segment": nll[last_start + 1 :]}


def summarize(per_sample: dict[str, list[torch.Tensor]], reference: str, segment_length: int) -> list[dict]:
    """Rows `{model, protocol, perplexity, ratio, worst, best, per_sample}` against the `reference` model."""
    rows = []
    for model, nlls in per_sample.items():
        for protocol in PROTOCOLS:
            pieces = [protocol_nll(n, segment_length)[protocol] for n in nlls]
            references = [protocol_nll(n, segment_length)[protocol] for n in per_sample[reference]]
            ppl = math.exp(torch.cat(pieces).mean())
            ref_ppl = math.exp(torch.cat(references).mean())
            ratios = [math.exp(p.mean() - r.mean()) - 1 for p, r in zip(pieces, references)]
            rows.append({
                "model": model, "protocol": protocol, "perplexity": round(ppl, 3),
                "change_vs_reference": round(ppl / ref_ppl - 1, 4), "worst_sample": round(max(ratios), 4),
                "best_sample": round(min(ratios), 4), "per_sample_change": [round(r, 4) for r in ratios],
                "num_samples": len(pieces), "num_targets": int(sum(len(p) for p in pieces)),
            })  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------------- diagnostics
def per_position(per_sample: dict[str, list[torch.Tensor]], segment_length: int, bins: int = 8) -> dict:
    """Perplexity by position within a segment (after the first segment), in `bins` equal bins: where in a segment
    the memory helps (a chunked model is worst at the start of its chunks)."""
    result = {}
    for model, nlls in per_sample.items():
        stacked = torch.cat([n[segment_length : len(n) // segment_length * segment_length] for n in nlls])
        by_position = stacked.view(-1, segment_length).mean(0)
        result[model] = [round(math.exp(b.mean()), 2) for b in by_position.chunk(bins)]
    return result


@torch.no_grad()
def attention_to_first_positions(model: HMTForCausalLM, sample: torch.Tensor, segment: int) -> dict:
    """Mean attention (over layers, heads and the segment's token queries) on key positions 0 and 1 when segment
    `segment` is decoded: by the chunked backbone, and in the HMT's layout with its real memory embedding."""
    length, config = model.config.segment_length, model.config
    backbone, embed = model.backbone, model.get_input_embeddings()
    state = model(sample[None, : segment * length], logits_to_keep=1).memory
    memory = state.memories[0, -1]
    tokens = embed(sample[None, segment * length : (segment + 1) * length])[0]
    sensory = embed(sample[None, segment * length - config.sensory_memory_size : segment * length])[0]
    previous = backbone.config._attn_implementation
    backbone.set_attn_implementation("eager")
    try:
        layouts = {"chunked": (tokens, 0)}
        layout = [memory[None], sensory, tokens, memory[None]]
        sink = model.sink_embedding()
        if sink is not None:
            layout.insert(0, sink[None])
        layouts["hmt"] = (torch.cat(layout), len(layout[0]) + (sink is not None) + len(sensory))
        result = {}
        for name, (inputs, first_token) in layouts.items():
            out = backbone(inputs_embeds=inputs[None], output_attentions=True)
            attention = torch.stack(out.attentions)[:, 0, :, first_token : first_token + length]  # layers, heads, q, k
            result[name] = {
                "position_0": round(attention[..., 0].mean().item(), 4),
                "position_1": round(attention[..., 1].mean().item(), 4),
                "input_norm_position_0": round(inputs[0].norm().item(), 2),
            }
        return result
    finally:
        backbone.set_attn_implementation(previous)


@torch.no_grad()
def memory_diagnostics(model: HMTForCausalLM, sample: torch.Tensor, per_sample: dict) -> dict:
    """Per-segment losses of each model on `sample`, memory norms, retrieval-weight entropy, attention to 0/1."""
    length = model.config.segment_length
    out = model(sample[None], output_retrieval_weights=True, logits_to_keep=1)
    entropies = [
        float(-(w[0][w[0] > 0] * w[0][w[0] > 0].log()).sum()) / math.log(int((w[0] > 0).sum()))
        for w in out.retrieval_weights or ()
        if int((w[0] > 0).sum()) > 1
    ]
    segments = len(sample) // length
    per_segment = {
        name: [round(math.exp(nlls[0][max(1, s * length) : (s + 1) * length].mean()), 2) for s in range(segments)]
        for name, nlls in per_sample.items()
    }
    return {
        "per_segment_perplexity": per_segment,
        "memory_embedding_norm_mean": round(out.memory.memories[0].norm(dim=-1).mean().item(), 2),
        "token_embedding_norm_mean": round(model.get_input_embeddings().weight.norm(dim=-1).mean().item(), 2),
        "retrieval_weight_entropy_normalized_mean": round(sum(entropies) / len(entropies), 4) if entropies else None,
        "attention_to_first_positions": attention_to_first_positions(model, sample, min(4, segments - 1)),
    }


# ---------------------------------------------------------------------------------------------------- runs
def scorers_untrained(model: HMTForCausalLM) -> dict:
    length = model.config.segment_length
    return {
        f"chunked (L={length})": ChunkedTransformer(model.backbone, length),
        "HMT default (attention sink)": HMTScorer(model, name="HMT default", overrides={"attention_sink": True}),
        "HMT paper layout (Eq. 4)": HMTScorer(model, name="HMT paper", overrides={"attention_sink": False}),
        "HMT paper layout, stage-1 mode": HMTScorer(
            model, name="HMT paper s1", overrides={"attention_sink": False, "use_memory_search": False}
        ),
    }


def training_budget(path: str) -> dict:
    """Steps, tokens and wall time of the `examples/train_hmt.py` run a checkpoint came from (its stage folders)."""
    run = Path(path).resolve()
    run = run.parent if run.name in ("stage1", "stage2", "backbone") else run
    budget = {}
    for stage in ("stage1", "stage2"):
        results, state = run / stage / "train_results.json", run / stage / "trainer_state.json"
        if results.is_file() and state.is_file():
            metrics, history = json.loads(results.read_text()), json.loads(state.read_text())
            budget[stage] = {
                "steps": history["global_step"],
                "tokens": metrics.get("num_input_tokens_seen", history.get("num_input_tokens_seen")),
                "wall_seconds": round(metrics["train_runtime"], 1),
                "final_train_loss": round(metrics["train_loss"], 4),
            }
    return budget


def load_checkpoint(path: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, AutoConfig.from_pretrained(path)


def scorers_trained(checkpoints: dict[str, str]) -> dict:
    """`NAME=PATH` checkpoints: HMT folders are scored in both retrieval modes (RMT ones as they are), plain
    backbones (a chunked run's `backbone` folder) as chunked models at `chunk_length` from `NAME` (`...L=1024`)."""
    scorers = {}
    for name, path in checkpoints.items():
        model, config = load_checkpoint(path)
        if config.model_type == "hmt" and config.use_sensory_memory:
            scorers[f"{name} (paper retrieval)"] = HMTScorer(model, name=name, overrides={"retrieval_mode": "paper"})
            scorers[f"{name} (causal retrieval)"] = HMTScorer(model, name=name, overrides={"retrieval_mode": "causal"})
        elif config.model_type == "hmt":
            scorers[name] = HMTScorer(model, name=name, overrides={"use_memory_search": False})
        else:
            chunk = int(name.rsplit("L=", 1)[1].rstrip(")")) if "L=" in name else None
            if chunk is None:
                raise SystemExit(f"--checkpoint {name}={path}: a plain backbone needs its chunk length in the name")
            scorers[name] = ChunkedTransformer(model, chunk)
    return scorers


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("untrained", "trained", "summary"), help="summary: rewrite summary.md")
    parser.add_argument("--corpora", default="books,wiki,arxiv")
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--num-samples", type=int, default=4, help="samples per corpus and length (at most)")
    parser.add_argument("--data-root", default="data", help="folder holding prepare-data's books/wiki/arxiv")
    parser.add_argument("--backbone", default="smollm2", help="untrained: backbone to convert (smollm2 or folder)")
    parser.add_argument("--checkpoint", action="append", default=[], help="trained: NAME=PATH (repeat)")
    parser.add_argument("--reference", default=None, help="model the ratios are taken against (default: first)")
    parser.add_argument("--segment-length", type=int, default=256)
    parser.add_argument("--sensory-memory-size", type=int, default=32)
    parser.add_argument("--representation-length", type=int, default=128)
    parser.add_argument("--num-memory-embeddings", type=int, default=300)
    parser.add_argument("--diagnostics-length", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", required=True, help="folder for metrics.json and summary.md")
    args = parser.parse_args()
    set_threads(args.threads)
    start = time.time()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    if args.mode == "summary":
        return write_summary(json.loads((output / "metrics.json").read_text()), output)

    if args.mode == "untrained":
        backbone, gguf = smollm2_location() if args.backbone == "smollm2" else (args.backbone, None)
        tokenizer = load_tokenizer(args.backbone)
        torch.manual_seed(0)
        model = HMTForCausalLM.from_backbone(
            backbone, gguf_file=gguf, segment_length=args.segment_length,
            sensory_memory_size=args.sensory_memory_size, representation_length=args.representation_length,
            num_memory_embeddings=args.num_memory_embeddings,
        ).eval()  # fmt: skip
        scorers = scorers_untrained(model)
        budgets, curves = {}, {}
        weights = f"{args.backbone} backbone, freshly converted: HMT memory parameters UNTRAINED (seed 0)"
    else:
        checkpoints = dict(item.split("=", 1) for item in args.checkpoint)
        if not checkpoints:
            raise SystemExit("trained: pass --checkpoint NAME=PATH for each model")
        scorers = scorers_trained(checkpoints)
        tokenizer = load_tokenizer(next(iter(checkpoints.values())))
        model = next((s.model for s in scorers.values() if isinstance(s, HMTScorer)), None)
        weights = "trained checkpoints: " + ", ".join(f"{k}={v}" for k, v in checkpoints.items())
        budgets = {name: training_budget(path) for name, path in checkpoints.items()}
        curves = {name: learning_curve(path) for name, path in checkpoints.items()}
    reference = args.reference or next(iter(scorers))
    segment_length = args.segment_length
    results, diagnostics = [], {}
    for corpus in args.corpora.split(","):
        for length in (int(n) for n in args.lengths.split(",")):
            samples = corpus_samples(corpus, args.data_root, tokenizer, length, args.num_samples)
            if not samples:
                print(f"{corpus}: test split shorter than {length} tokens, skipped", flush=True)
                continue
            per_sample = {}
            for name, scorer in scorers.items():
                began = time.time()
                per_sample[name] = [token_nll(scorer, sample) for sample in samples]
                print(f"{corpus} {length:>6} {name:40s} {time.time() - began:7.1f} s", flush=True)
            for row in summarize(per_sample, reference, segment_length):
                results.append({"corpus": corpus, "length": length, **row})
                print(
                    f"  {row['protocol']:12s} {row['model']:40s} ppl {row['perplexity']:9.2f} "
                    f"{row['change_vs_reference']:+.1%} (worst {row['worst_sample']:+.1%}, best {row['best_sample']:+.1%})",
                    flush=True,
                )
            if length == args.diagnostics_length:
                diagnostics.setdefault(corpus, {})["per_position_in_segment"] = per_position(
                    per_sample, segment_length
                )
            if length == args.diagnostics_length and model is not None:
                with hmt_overrides(model, **({"attention_sink": True} if args.mode == "untrained" else {})):
                    diagnostics[corpus]["default"] = memory_diagnostics(model, samples[0], per_sample)
                if args.mode == "untrained":
                    with hmt_overrides(model, attention_sink=False):
                        diagnostics[corpus]["paper_layout"] = memory_diagnostics(model, samples[0], per_sample)
    document = {
        "benchmark": f"memory_quality {args.mode}",
        "weights": weights,
        "reference": reference,
        "hmt": {
            "segment_length": segment_length,
            "sensory_memory_size": args.sensory_memory_size,
            "representation_length": args.representation_length,
            "num_memory_embeddings": args.num_memory_embeddings,
        },  # fmt: skip
        "protocols": {
            "all_tokens": "every target 1..T-1 of each sample",
            "last_segment": "the targets of each sample's last segment (the paper's protocol)",
        },
        "training_budget": budgets,
        "learning_curves": curves,
        "results": results,
        "diagnostics": diagnostics,
        "wall_seconds": round(time.time() - start, 1),
        "threads": args.threads,
    }
    (output / "metrics.json").write_text(json.dumps(document, indent=1))
    write_summary(document, output)
    print(f"wrote {output / 'metrics.json'} and summary.md ({document['wall_seconds']} s)")


def write_summary(document: dict, output: Path):
    import pandas as pd

    frame = pd.DataFrame(document["results"])
    lines = [f"# {document['benchmark']}", "", f"Weights: {document['weights']}.", ""]
    lines += [f"Ratios are against **{document['reference']}**, on the same samples.", ""]
    if document.get("training_budget"):
        lines += ["| model | stage | steps | tokens | wall time (s) | final train loss |", "|---|---|---|---|---|---|"]
        for model, stages in document["training_budget"].items():
            lines += [
                f"| {model} | {stage} | {b['steps']} | {b['tokens']:,} | {b['wall_seconds']} | {b['final_train_loss']} |"
                for stage, b in stages.items()
            ]
        lines.append("")
    for protocol, description in document["protocols"].items():
        part = frame[frame["protocol"] == protocol].copy()
        part["cell"] = [
            f"{p:.2f} ({c:+.1%}; worst {w:+.1%})"
            for p, c, w in zip(part["perplexity"], part["change_vs_reference"], part["worst_sample"])
        ]
        table = part.pivot_table(index=["corpus", "length"], columns="model", values="cell", aggfunc="first")
        table = table[list(dict.fromkeys(part["model"]))].reset_index()
        lines += [f"## {protocol}: {description}", "", table.to_markdown(index=False), ""]
    plot_path = plot(frame, output, document["weights"])
    lines += [f"![perplexity vs length]({plot_path.name})", ""]
    if document.get("learning_curves"):
        curves = plot_learning_curves(document["learning_curves"], output)
        lines += ["Training loss per logged step (both stages; stage 2 starts where the vertical line is):", ""]
        lines += [f"![learning curves]({curves.name})", ""]
    if document["diagnostics"]:
        lines += ["## Diagnostics (first sample of the diagnostics length)", ""]
        for corpus, layouts in document["diagnostics"].items():
            positions = layouts.pop("per_position_in_segment", None)
            if positions:
                bins = len(next(iter(positions.values())))
                lines += [f"**{corpus}**: perplexity by position within a segment ({bins} bins, first bin = "
                          "the segment's first tokens; every segment but each sample's first):", "",
                          "| model | " + " | ".join(f"bin {i + 1}" for i in range(bins)) + " |",
                          "|---|" + "---|" * bins]  # fmt: skip
                lines += [f"| {m} | " + " | ".join(str(v) for v in values) + " |" for m, values in positions.items()]
                lines.append("")
            if not layouts:
                continue
            for layout, found in layouts.items():
                attention = found["attention_to_first_positions"]
                lines += [
                    f"**{corpus}, {layout}**: memory-embedding norm {found['memory_embedding_norm_mean']} (token "
                    f"embeddings {found['token_embedding_norm_mean']}); normalized retrieval-weight entropy "
                    f"{found['retrieval_weight_entropy_normalized_mean']}; attention of segment tokens on key "
                    f"positions 0 / 1: chunked {attention['chunked']['position_0']} / "
                    f"{attention['chunked']['position_1']}, HMT {attention['hmt']['position_0']} / "
                    f"{attention['hmt']['position_1']} (input norm at position 0: "
                    f"{attention['hmt']['input_norm_position_0']}).",
                    "",
                ]
            lines += ["| model | per-segment perplexity |", "|---|---|"]
            segments = next(iter(layouts.values()))["per_segment_perplexity"]
            lines += [f"| {m} | {' '.join(str(v) for v in p)} |" for m, p in segments.items()] + [""]
    (output / "summary.md").write_text("\n".join(lines), encoding="utf-8")


def learning_curve(path: str) -> dict:
    """`{"stage1": [[step, loss], ...], "stage2": ...}` from the trainer_state.json of a checkpoint's run."""
    run = Path(path).resolve()
    run = run.parent if run.name in ("stage1", "stage2", "backbone") else run
    curves = {}
    for stage in ("stage1", "stage2"):
        state = run / stage / "trainer_state.json"
        if state.is_file():
            history = json.loads(state.read_text())["log_history"]
            curves[stage] = [[entry["step"], entry["loss"]] for entry in history if "loss" in entry]
    return curves


def plot_learning_curves(curves: dict, output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    offset = 0
    for index, (model, stages) in enumerate(curves.items()):
        offset = stages["stage1"][-1][0] if stages.get("stage1") else 0
        points = [(s, v) for s, v in stages.get("stage1", [])] + [(s + offset, v) for s, v in stages.get("stage2", [])]
        if points:
            axis.plot(*zip(*points), label=model, color=f"C{index}")
    if offset:
        axis.axvline(offset, color="grey", linestyle=":")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("training loss (nats/token)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    path = output / "learning_curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot(frame, output: Path, weights: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = list(dict.fromkeys(frame["corpus"]))
    figure, axes = plt.subplots(2, len(corpora), figsize=(5 * len(corpora), 7), squeeze=False)
    for column, corpus in enumerate(corpora):
        for row, protocol in enumerate(PROTOCOLS):
            axis = axes[row][column]
            part = frame[(frame["corpus"] == corpus) & (frame["protocol"] == protocol)]
            for model, group in part.groupby("model", sort=False):
                axis.plot(group["length"], group["perplexity"], marker="o", label=model)
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_title(f"{corpus}, {protocol}", fontsize=9)
            axis.set_xlabel("sample length (tokens)")
            axis.set_ylabel("perplexity")
            axis.grid(True, alpha=0.3)
        axes[0][column].legend(fontsize=7)
    figure.suptitle("Held-out perplexity" + (" (UNTRAINED memory)" if "UNTRAINED" in weights else ""))
    figure.tight_layout()
    path = output / "perplexity_vs_length.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


if __name__ == "__main__":
    main()
