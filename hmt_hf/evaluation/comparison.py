"""Same-samples comparison of HMT with its baselines, sample by sample: does the memory help?

Every sample is a contiguous piece of the concatenated test documents (an EOS between documents), cut without
overlap and spread over the stream; every model scores the same samples. Two protocols come from the same forward
pass: `all_tokens` (every target 1..T-1) and `last_segment` (the paper's: the targets of the sample's last segment).
Perplexities are token-weighted over samples; `worst`/`best` are the extreme per-sample ratios to the reference.
Diagnostics explain a number: per-segment and per-position perplexity, attention on the first positions, memory
norms, retrieval-weight entropy. Used by `benchmarks/memory_quality.py` and `hmt-hf reproduce --preset`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .baselines import hmt_overrides
from .corpus import NAMED_CORPORA, EvalCorpus, load_texts, token_byte_lengths

PROTOCOLS = ("all_tokens", "last_segment")


def corpus_samples(corpus: str, data_root: str | None, tokenizer, length: int, count: int) -> list[torch.Tensor]:
    """Up to `count` non-overlapping `length`-token samples spread evenly over the corpus's test stream. `corpus` is
    an offline corpus name (read from `data_root/NAME`) or any source `load_texts` reads (a `prepare-data` folder,
    .txt files, .jsonl)."""
    texts, _ = load_texts(corpus, f"{data_root}/{corpus}" if data_root and corpus in NAMED_CORPORA else None)
    stream = EvalCorpus.from_texts(texts, tokenizer, source=corpus).token_ids
    available = len(stream) // length
    if available == 0:
        return []
    count = min(count, available)
    stride = (len(stream) - length) // max(count - 1, 1) if count > 1 else 0
    return [stream[i * stride : i * stride + length] for i in range(count)]


def standard_scorers(hmt, baseline=None) -> dict:
    """The comparison set of a trained HMT: HMT (paper and causal retrieval), its RMT mode, and the `baseline` backbone
    (default: the HMT's own backbone) chunked at the HMT's L (the reference, first), as a sliding window (4L context,
    stride L) and whole-context vanilla."""
    from .baselines import ChunkedTransformer, HMTScorer, SlidingWindowTransformer, VanillaTransformer

    length = hmt.config.segment_length
    source = "trained baseline" if baseline is not None else "the HMT's backbone"
    baseline = hmt.backbone if baseline is None else baseline
    return {
        f"chunked ({source}, L={length})": ChunkedTransformer(baseline, length),
        "HMT (paper retrieval)": HMTScorer(hmt, name="HMT paper", overrides={"retrieval_mode": "paper"}),
        "HMT (causal retrieval)": HMTScorer(hmt, name="HMT causal", overrides={"retrieval_mode": "causal"}),
        "RMT mode of the HMT (no sensory memory, no search)": HMTScorer(
            hmt, name="RMT", overrides={"use_memory_search": False, "use_sensory_memory": False}
        ),
        f"sliding window ({source}, {4 * length}/{length})": SlidingWindowTransformer(baseline, 4 * length, length),
        f"vanilla ({source}, its whole context)": VanillaTransformer(baseline),
    }


def token_nll(scorer, sample: torch.Tensor) -> torch.Tensor:
    """`(T,)` float64 NLL of targets 1..T-1 (position 0 holds 0)."""
    scores = scorer.score(sample[None], first_target=1)
    assert bool(scores.scored[0, 1:].all()), f"{scorer.name} left targets unscored"
    return scores.nll[0].double()


def protocol_nll(nll: torch.Tensor, segment_length: int) -> dict[str, torch.Tensor]:
    last_start = (len(nll) - 1) // segment_length * segment_length
    return {"all_tokens": nll[1:], "last_segment": nll[last_start + 1 :]}


def summarize(
    per_sample: dict[str, list[torch.Tensor]],
    reference: str,
    segment_length: int,
    sample_bytes: list[torch.Tensor] | None = None,
) -> list[dict]:
    """Rows `{model, protocol, perplexity, ratio, worst, best, per_sample}` against the `reference` model, plus
    `bits_per_byte` when `sample_bytes` (UTF-8 bytes of each sample's tokens, `(T,)` each) is given."""
    rows = []
    for model, nlls in per_sample.items():
        for protocol in PROTOCOLS:
            pieces = [protocol_nll(n, segment_length)[protocol] for n in nlls]
            if sample_bytes is not None:
                scored_bytes = sum(int(protocol_nll(b, segment_length)[protocol].sum()) for b in sample_bytes)
                bits = float(torch.cat(pieces).sum()) / (math.log(2) * max(scored_bytes, 1))
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
            if sample_bytes is not None:
                rows[-1]["bits_per_byte"] = round(bits, 4)
    return rows


def compare(
    scorers: dict,
    corpora: list[str],
    lengths: list[int],
    tokenizer,
    data_root: str,
    segment_length: int,
    num_samples: int = 3,
    reference: str | None = None,
    diagnostics_length: int | None = None,
    diagnostics_model=None,
    diagnostics_layouts: dict | None = None,
    log=print,
    max_tokens: int | None = None,
    bits_per_byte: bool = False,
) -> tuple[list[dict], dict]:
    """Score every `(corpus, length)` sample set with every scorer. Returns result rows (see [`summarize`]) and, at
    `diagnostics_length`, per-position perplexities and (with `diagnostics_model`, an HMT) memory diagnostics, once
    per `{label: HMTConfig overrides}` of `diagnostics_layouts` (default: the model as it is). `max_tokens` caps the
    samples of long lengths (at least one). `bits_per_byte` adds each row's bits per UTF-8 byte."""
    import time

    reference = reference or next(iter(scorers))
    results, diagnostics = [], {}
    for corpus in corpora:
        for length in lengths:
            count = num_samples if max_tokens is None else max(1, min(num_samples, max_tokens // length))
            samples = corpus_samples(corpus, data_root, tokenizer, length, count)
            if not samples:
                log(f"{corpus}: test split shorter than {length} tokens, skipped")
                continue
            per_sample = {}
            for name, scorer in scorers.items():
                began = time.time()
                per_sample[name] = [token_nll(scorer, sample) for sample in samples]
                log(f"{corpus} {length:>6} {name:40s} {time.time() - began:7.1f} s")
            sample_bytes = [token_byte_lengths(tokenizer, s)[0] for s in samples] if bits_per_byte else None
            for row in summarize(per_sample, reference, segment_length, sample_bytes):
                results.append({"corpus": corpus, "length": length, **row})
                log(f"  {row['protocol']:12s} {row['model']:40s} ppl {row['perplexity']:9.2f} "
                    f"{row['change_vs_reference']:+.1%} (worst {row['worst_sample']:+.1%}, "
                    f"best {row['best_sample']:+.1%})")  # fmt: skip
            if length == diagnostics_length:
                found = diagnostics.setdefault(corpus, {})
                found["per_position_in_segment"] = per_position(per_sample, segment_length)
                for label, overrides in (diagnostics_layouts or {"default": {}}).items():
                    if diagnostics_model is not None:
                        with hmt_overrides(diagnostics_model, **overrides):
                            found[label] = memory_diagnostics(diagnostics_model, samples[0], per_sample)
    return results, diagnostics


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
def attention_to_first_positions(model, sample: torch.Tensor, segment: int) -> dict:
    """Mean attention (over layers, heads and the segment's token queries) on key positions 0 and 1 when segment
    `segment` is decoded: by the chunked backbone, and in the HMT's layout with its real memory embedding. For scale,
    the HMT layout also gives the mean attention on one sensory-memory token (what a real token there receives)."""
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
            per_head = attention[..., 1].mean(-1)  # layers, heads
            result[name] = {
                "position_0": round(attention[..., 0].mean().item(), 4),
                "position_1": round(attention[..., 1].mean().item(), 4),
                "position_1_top_head": round(per_head.max().item(), 4),
                "position_1_top_head_index": list(divmod(int(per_head.argmax()), per_head.shape[1])),
                "input_norm_position_0": round(inputs[0].norm().item(), 2),
            }
            if name == "hmt" and len(sensory):
                sensory_keys = attention[..., first_token - len(sensory) : first_token]
                result[name]["sensory_token_mean"] = round(sensory_keys.mean().item(), 4)
        return result
    finally:
        backbone.set_attn_implementation(previous)


@torch.no_grad()
def ablations(model, sample: torch.Tensor, loss: float | None = None) -> dict:
    """All-token perplexity of `sample` as the model is (from its mean `loss` when the caller has it), with the memory
    slot's input zeroed (`P_n = 0` in every segment: what the memory embedding contributes), and without sensory
    memory (what the `k` tokens contribute)."""

    def perplexity(loss: float | None = None) -> float:
        if loss is None:
            loss = model(sample[None], labels=sample[None], logits_to_keep=1).loss.item()
        return round(math.exp(loss), 3)

    def zero_memory(module, args):
        return (args[0], torch.zeros_like(args[1]), *args[2:])

    result = {"as_trained": perplexity(loss)}
    hook = model.memory.memory_embedding_generator.register_forward_pre_hook(zero_memory)
    try:
        result["memory_slot_zeroed"] = perplexity()
    finally:
        hook.remove()
    with hmt_overrides(model, use_sensory_memory=False):
        result["no_sensory_memory"] = perplexity()
    return result


def _spread(vectors: torch.Tensor) -> float:
    """Mean distance of `vectors` `(n, d)` from their mean, relative to their mean norm: 0 when all are equal."""
    vectors = vectors.float()
    return round(float((vectors - vectors.mean(0)).norm(dim=-1).mean() / vectors.norm(dim=-1).mean()), 4)


@torch.no_grad()
def memory_similarity(model, sample: torch.Tensor, memories: torch.Tensor) -> dict:
    """How much the cached memory embeddings `memories` `(c, d)` of `sample` (oldest first, one per segment of the last
    `c` segments) differ: their spread around their mean (all but the oldest, which, when the cache holds every
    segment's memory, is the only one built from the learned initial memory), the cosine of consecutive keys `M W_k`
    (what the search compares), and the cosine of each later memory with the oldest. For scale, the spread of the
    final hidden state at the last token of the same segments when the backbone reads each segment alone: what a
    memory that summarized its segment could carry. Empty when fewer than three memories are cached."""
    length, cached = model.config.segment_length, memories.shape[0]
    segments = len(sample) // length
    if cached < 3 or segments < cached:
        return {}
    keys = torch.nn.functional.normalize(model.memory.memory_search.key_proj(memories[1:]).float(), dim=-1)
    unit = torch.nn.functional.normalize(memories.float(), dim=-1)
    hidden = model.backbone.base_model(sample[: segments * length].view(segments, length)).last_hidden_state
    return {
        "memory_spread": _spread(memories[1:]),
        "segment_last_token_spread": _spread(hidden[segments - cached + 1 :, -1]),
        "memory_key_cosine_consecutive_mean": round(float((keys[1:] * keys[:-1]).sum(-1).mean()), 4),
        "memory_cosine_to_first_mean": round(float((unit[1:] @ unit[0]).mean()), 4),
    }


@torch.no_grad()
def memory_diagnostics(model, sample: torch.Tensor, per_sample: dict) -> dict:
    """Per-segment losses of each model on `sample`, memory norms, how much the cached memory embeddings differ
    ([`memory_similarity`]: memories that do not differ cannot be told apart by the search), the retrieval weights (normalized entropy, the largest weight, how often it falls on the oldest cached
    memory), attention to 0/1."""
    length = model.config.segment_length
    out = model(sample[None], labels=sample[None], output_retrieval_weights=True, logits_to_keep=1)
    searches = [w[0][w[0] > 0] for w in out.retrieval_weights or () if int((w[0] > 0).sum()) > 1]
    entropies = [float(-(w * w.log()).sum()) / math.log(len(w)) for w in searches]
    search = model.memory.memory_search
    segments = len(sample) // length
    similarity = memory_similarity(model, sample, out.memory.memories[0])
    per_segment = {
        name: [round(math.exp(nlls[0][max(1, s * length) : (s + 1) * length].mean()), 2) for s in range(segments)]
        for name, nlls in per_sample.items()
    }
    return {
        "per_segment_perplexity": per_segment,
        "memory_embedding_norm_mean": round(out.memory.memories[0].norm(dim=-1).mean().item(), 2),
        "token_embedding_norm_mean": round(model.get_input_embeddings().weight.norm(dim=-1).mean().item(), 2),
        **similarity,
        "retrieval_weight_entropy_normalized_mean": round(sum(entropies) / len(entropies), 4) if entropies else None,
        "retrieval_max_weight_mean": round(sum(float(w.max()) for w in searches) / len(searches), 4)
        if searches
        else None,
        "retrieval_oldest_is_max_fraction": (
            round(sum(int(w.argmax()) == 0 for w in searches) / len(searches), 3) if searches else None
        ),
        "search_temperature": round(search.log_temperature.exp().item(), 3) if model.config.normalize_memory else None,
        "attention_to_first_positions": attention_to_first_positions(model, sample, min(4, segments - 1)),
        "perplexity_ablations": ablations(model, sample, loss=out.loss.item()),
    }


# ---------------------------------------------------------------------------------------------------- runs


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


def save(document: dict, output: str | Path) -> Path:
    """Write `metrics.json`, `summary.md` and the plots of a comparison document into `output`."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.json").write_text(json.dumps(document, indent=1))
    write_summary(document, output)
    return output / "summary.md"


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
                    f"embeddings {found['token_embedding_norm_mean']}); spread of the memory embeddings around "
                    f"their mean {found.get('memory_spread')} of their norm (a segment's last-token state, backbone "
                    f"alone: {found.get('segment_last_token_spread')}), cosine of consecutive search keys "
                    f"{found.get('memory_key_cosine_consecutive_mean')}, of later memories with the first "
                    f"{found.get('memory_cosine_to_first_mean')}; normalized retrieval-weight "
                    f"entropy {found['retrieval_weight_entropy_normalized_mean']} (largest weight "
                    f"{found.get('retrieval_max_weight_mean')}, on the oldest memory in "
                    f"{found.get('retrieval_oldest_is_max_fraction')} of the searches; search temperature "
                    f"{found.get('search_temperature')}); attention of segment tokens on key "
                    f"positions 0 / 1: chunked {attention['chunked']['position_0']} / "
                    f"{attention['chunked']['position_1']}, HMT {attention['hmt']['position_0']} / "
                    f"{attention['hmt']['position_1']} (strongest head on position 1: chunked "
                    f"{attention['chunked'].get('position_1_top_head')}, HMT {attention['hmt'].get('position_1_top_head')}"
                    f"; input norm at position 0: "
                    f"{attention['hmt']['input_norm_position_0']}; one sensory-memory token gets "
                    f"{attention['hmt'].get('sensory_token_mean')}).",
                    "",
                ]
                if "perplexity_ablations" in found:
                    ablated = found["perplexity_ablations"]
                    lines += [
                        f"Ablations on this sample (all tokens): perplexity {ablated['as_trained']} as trained, "
                        f"{ablated['memory_slot_zeroed']} with the memory slot zeroed, {ablated['no_sensory_memory']} "
                        "without sensory memory.",
                        "",
                    ]
            lines += ["| model | per-segment perplexity |", "|---|---|"]
            segments = next(iter(layouts.values()))["per_segment_perplexity"]
            lines += [f"| {m} | {' '.join(str(v) for v in p)} |" for m, p in segments.items()] + [""]
    (output / "summary.md").write_text("\n".join(lines), encoding="utf-8")


def plot(frame, output: Path, weights: str) -> Path:
    import matplotlib
    import matplotlib.ticker

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
            axis.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axis.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
            lengths = sorted(part["length"].unique())
            axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            axis.set_xticks(lengths, [f"{int(n):,}" for n in lengths])
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
