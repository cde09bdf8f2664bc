"""Reports of a run directory from its `metrics.json`: `summary.md`, CSV and LaTeX tables, PNG plots, and the
comparison of several runs. pandas builds the tables (`DataFrame.to_latex` needs jinja2), matplotlib (Agg) the plots.

The layout of each experiment's section follows its metrics: several input lengths give a PPL-vs-length table and
plot (one line per model); one length with variants gives a table and ablation bars; efficiency metrics give an
efficiency table and bars; series give training curves.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from .scoring import FLOPS_FORMULA, PROTOCOL_DESCRIPTIONS

QUALITY_METRICS = ("perplexity", "bits_per_byte", "top_1_accuracy", "top_5_accuracy")
EFFICIENCY_METRICS = (
    "throughput",
    "latency_per_sample_ms_p50",
    "latency_per_sample_ms_p95",
    "latency_per_sample_ms_p99",
    "latency_per_step_ms_p50",
    "latency_per_step_ms_p95",
    "latency_per_step_ms_p99",
    "peak_memory",
    "forward_flops_per_token",
    "positions_per_token",
    "parameters",
    "memory_parameters",
    "parameter_overhead",
    "speedup",
)
_TABLE_COLUMNS = (
    "perplexity",
    "bits_per_byte",
    "top_1_accuracy",
    "top_5_accuracy",
    "loss",
    "num_scored_tokens",
    "num_unscored_tokens",
    "relative_change",
)


def _frame(document: dict):
    import pandas as pd

    frame = pd.DataFrame(document["metrics"])
    if frame.empty:
        return frame
    frame["row"] = [f"{m} [{v}]" if isinstance(v, str) else m for m, v in zip(frame["model"], frame["variant"])]
    return frame


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("_") or "x"


def _format(value, metric: str = "") -> str:
    if value is None or value != value:  # None or NaN
        return "—"
    if isinstance(value, str):
        return value
    if metric in ("parameters", "memory_parameters", "num_scored_tokens", "num_unscored_tokens") or (
        float(value).is_integer() and abs(value) >= 1000
    ):
        return f"{int(value):,}"
    if metric == "forward_flops_per_token":
        return f"{value:.3e}"
    if "accuracy" in metric:
        return f"{value:.4f}"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:,.1f}"


_DESCRIPTION_KEYS = (
    "method",
    "chunk_length",
    "window_size",
    "stride",
    "max_length",
    "truncation_strategy",
    "use_memory",
    "segment_length",
    "representation_length",
    "sensory_memory_size",
    "num_memory_embeddings",
    "use_memory_search",
    "use_sensory_memory",
    "retrieval_mode",
    "variant",
    "step",
    "weights",
)


def _describe(description: dict) -> str:
    """The settings of a model that explain its numbers, in one line."""
    return ", ".join(f"{k}={description[k]}" for k in _DESCRIPTION_KEYS if description.get(k) is not None)


def markdown_table(frame, index_label: str = "") -> str:
    """A pipe table (pandas `to_markdown`) of a (pivoted) DataFrame, values formatted per column metric name."""
    cells = frame.copy()
    cells.columns = [str(c) for c in frame.columns]
    for column, original in zip(cells.columns, frame.columns):
        cells[column] = [_format(value, str(original).split(" ")[0]) for value in frame[original]]
    cells.index = [str(index) for index in frame.index]
    cells.index.name = index_label or (frame.index.name or "")
    return cells.to_markdown(tablefmt="pipe", disable_numparse=True)


def _unit(frame, metric: str) -> str:
    units = frame.loc[frame["metric"] == metric, "unit"]
    return units.iloc[0] if len(units) else ""


# ---------------------------------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_panels(
    panels: list[tuple[str, object, str]], kind: str, path: Path, title: str, log_y: bool = False
) -> Path | None:
    """One figure, one panel per `(panel title, rows of one metric, y label)`: `kind="lines"` draws the metric vs
    input length, one line per model (and variant); `kind="bars"` one bar per model (and variant). `log_y` draws
    the y axis in log scale (perplexities: one outlier then cannot flatten the other lines)."""
    panels = [(name, data[data["value"].notna()], label) for name, data, label in panels]
    panels = [panel for panel in panels if not panel[1].empty]
    if not panels:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(panels), figsize=(max(5.5 * len(panels), 6), 4.2), squeeze=False)
    for index, (axis, (name, data, label)) in enumerate(zip(axes[0], panels)):
        if kind == "lines":
            for row, group in data.groupby("row", sort=False):
                group = group.sort_values("sequence_length")
                axis.plot(group["sequence_length"], group["value"], marker="o", label=row)
            axis.set_xscale("log")
            lengths = sorted(data["sequence_length"].unique())
            axis.set_xticks(lengths, [f"{int(n):,}" for n in lengths])
            axis.minorticks_off()
            axis.set_xlabel("input length (tokens)")
            axis.legend(fontsize=7)
        else:
            data = data.drop_duplicates("row", keep="last")
            axis.bar(range(len(data)), data["value"], color=f"C{index}")
            axis.set_xticks(range(len(data)))
            axis.set_xticklabels(data["row"], rotation=30, ha="right", fontsize=7)
        if log_y:
            axis.set_yscale("log")
        axis.set_title(name, fontsize=9)
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_series(series: list[dict], path: Path, title: str) -> Path | None:
    """Training curves: one line per (model, curve)."""
    if not series:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for curve in series:
        points = [(x, y) for x, y in zip(curve["x"], curve["y"]) if y is not None]
        if points:
            axis.plot(*zip(*points), label=f"{curve['model']}: {curve['name']}")
    axis.set_xlabel(series[0]["x_label"])
    axis.set_ylabel(f"{series[0]['y_label']} ({series[0]['unit']})" if series[0]["unit"] else series[0]["y_label"])
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# ---------------------------------------------------------------------------------------------------- tables
def _write_table(frame, folder: Path, stem: str, caption: str) -> tuple[Path, Path]:
    csv_path, tex_path = folder / f"{stem}.csv", folder / f"{stem}.tex"
    frame.to_csv(csv_path)
    formatted = frame.copy()
    for column in formatted.columns:
        formatted[column] = [_format(v, str(column).split(" ")[0]) for v in formatted[column]]
    formatted.to_latex(tex_path, caption=caption, label=f"tab:{_slug(stem)}", escape=True)
    return csv_path, tex_path


def _experiment_tables(frame, experiment: str, folder: Path):
    """`[(title, DataFrame, kind)]` of one experiment: PPL-vs-length pivots, a variant table, an efficiency
    table."""
    tables = []
    data = frame[frame["experiment"] == experiment]
    for protocol, part in data.groupby(data["protocol"].fillna("—"), sort=False):
        protocol_label = "" if protocol == "—" else f", {protocol}"
        quality = part[part["metric"].isin(_TABLE_COLUMNS)]
        lengths = quality["sequence_length"].dropna().unique()
        if len(lengths) > 1:
            for metric in QUALITY_METRICS:
                metric_rows = quality[quality["metric"] == metric]
                if metric_rows.empty:
                    continue
                pivot = metric_rows.pivot_table(
                    index="row", columns="sequence_length", values="value", aggfunc="last", sort=False, dropna=False
                )
                pivot.columns = [f"{metric} @ {int(c)}" for c in pivot.columns]
                pivot.index.name = "model"
                tables.append(
                    (
                        f"{metric} ({_unit(part, metric)}) by input length{protocol_label}",
                        pivot,
                        f"{protocol}_{metric}",
                    )
                )
        elif not quality.empty:
            pivot = quality.pivot_table(
                index="row", columns="metric", values="value", aggfunc="last", sort=False, dropna=False
            )
            order = [m for m in _TABLE_COLUMNS if m in pivot.columns]
            pivot = pivot[order]
            length = f" at input length {int(lengths[0])}" if len(lengths) == 1 else ""
            pivot.columns = [f"{m} ({_unit(part, m)})" for m in pivot.columns]
            pivot.index.name = "model"
            tables.append((f"Quality{length}{protocol_label}", pivot, f"{protocol}_quality"))
        efficiency = part[part["metric"].isin(EFFICIENCY_METRICS)]
        if not efficiency.empty:
            pivot = efficiency.pivot_table(
                index="row", columns="metric", values="value", aggfunc="last", sort=False, dropna=False
            )
            pivot = pivot[[m for m in EFFICIENCY_METRICS if m in pivot.columns]]
            pivot.columns = [f"{m} ({_unit(part, m)})" for m in pivot.columns]
            pivot.index.name = "model"
            lengths = efficiency["sequence_length"].dropna().unique()
            length = f" at input length {int(lengths[0])}" if len(lengths) == 1 else ""
            tables.append((f"Efficiency{length}", pivot, "efficiency"))
        other = part[~part["metric"].isin([*_TABLE_COLUMNS, *EFFICIENCY_METRICS])]
        if not other.empty:
            other = other.copy()
            several_lengths = other["sequence_length"].dropna().nunique() > 1
            other["column"] = [
                f"{m} ({_unit(part, m)})" + (f" @ {int(n)}" if several_lengths and n == n and n is not None else "")
                for m, n in zip(other["metric"], other["sequence_length"])
            ]
            pivot = other.pivot_table(
                index="row", columns="column", values="value", aggfunc="last", sort=False, dropna=False
            )
            pivot.index.name = "model"
            tables.append((f"Results{protocol_label}", pivot, f"{protocol}_results"))
    return tables


def write_reports(run_dir: str | os.PathLike, document: dict, summary_name: str = "summary.md") -> Path:
    """Write `summary.md`, `tables/*.csv|.tex` and `plots/*.png` for the run in `run_dir`."""
    run_dir = Path(run_dir)
    tables_dir, plots_dir = run_dir / "tables", run_dir / "plots"
    tables_dir.mkdir(exist_ok=True)
    plots_dir.mkdir(exist_ok=True)
    frame = _frame(document)
    if not frame.empty:
        frame.drop(columns=["row"]).to_csv(tables_dir / "all_metrics.csv", index=False)

    lines = [f"# {document['name']} — run `{document['run_id']}`", ""]
    environment = document["environment"]
    git = document["git"]
    commit = (git["commit"] or "unknown")[:12] + (" (uncommitted changes)" if git["dirty"] else "")
    lines += [
        f"- status: **{document['status']}**; created {document['created_at']}, updated {document['updated_at']}",
        f"- git commit: `{commit}`; seed {document['seed']}; config fingerprint `{document['config_fingerprint']}`",
        f"- device: {environment['device'].get('type')} ({environment['device'].get('name')}); python "
        f"{environment['python']}; " + ", ".join(f"{k} {v}" for k, v in environment["libraries"].items()),
    ]
    if document.get("data"):
        data = document["data"]
        lines.append(
            f"- data: {data.get('source')} — {data.get('num_tokens', 0):,} tokens, {data.get('num_documents')} "
            f"documents" + (f", {data['num_bytes']:,} bytes" if data.get("num_bytes") else "")
        )
    lines += [
        "",
        "## What was run",
        "",
        "| experiment | paper item | status | time (s) | note |",
        "|---|---|---|---|---|",
    ]
    for entry in document["experiments"]:
        lines.append(
            f"| {entry['name']} | {entry['paper_item']} | {entry['status']} | {_format(entry['seconds'])} | "
            f"{entry['reason'] or ''} |"
        )
    lines += ["", "## How the numbers were produced", ""]
    protocols = sorted({p for p in frame.get("protocol", []) if isinstance(p, str)}) if not frame.empty else []
    for protocol in protocols:
        lines.append(f"- **{protocol}**: {PROTOCOL_DESCRIPTIONS[protocol]}.")
    modes = sorted({m for m in frame.get("retrieval_mode", []) if isinstance(m, str)}) if not frame.empty else []
    for mode in modes:
        rows = sorted(set(frame.loc[frame["retrieval_mode"] == mode, "row"]))
        leak = (
            "the query reads the segment's own first j tokens (Eq. 1 exactly), so predictions of those tokens can "
            "depend on later tokens of the same segment"
            if mode == "paper"
            else "the query reads the j tokens before the segment: no prediction depends on a later token"
        )
        lines.append(f"- retrieval_mode=**{mode}** ({leak}): {', '.join(rows)}.")
    if not frame.empty and frame["metric"].eq("forward_flops_per_token").any():
        lines.append(f"- {FLOPS_FORMULA}.")
    if not frame.empty:
        unscored = frame[(frame["metric"] == "num_unscored_tokens") & (frame["value"] > 0)]
        for _, row in unscored.iterrows():
            length = (
                "" if row["sequence_length"] != row["sequence_length"] else f", length {int(row['sequence_length'])}"
            )
            lines.append(
                f"- **{row['row']}** in {row['experiment']} ({row['protocol']}{length}): "
                f"{int(row['value']):,} requested tokens were NOT scored (truncated away); its perplexity covers "
                "only the tokens it kept."
            )
    for note in document["notes"]:
        lines.append(f"- {note}")

    experiments = [e["name"] for e in document["experiments"]]
    if not frame.empty:
        experiments += [e for e in frame["experiment"].unique() if e not in experiments]
    for experiment in experiments:
        entry = next((e for e in document["experiments"] if e["name"] == experiment), None)
        title = experiment if entry is None else f"{experiment} — paper {entry['paper_item']}"
        lines += ["", f"## {title}", ""]
        if entry is not None and entry["status"] != "complete":
            lines.append(f"*{entry['status']}*: {entry['reason']}")
        if frame.empty or experiment not in set(frame["experiment"]):
            series = [s for s in document["series"] if s["experiment"] == experiment]
            if not series:
                continue
        part = frame[frame["experiment"] == experiment] if not frame.empty else frame
        weights = sorted({w for w in part.get("weights", []) if isinstance(w, str)}) if not part.empty else []
        if weights:
            lines += ["Weights:", "", *(f"- {w}" for w in weights), ""]
        described = {
            k.split(" / ", 1)[1]: v for k, v in document["models"].items() if k.startswith(f"{experiment} / ")
        }
        if described:
            lines += ["Models:", ""]
            lines += [f"- `{name}`: {_describe(description)}" for name, description in described.items()]
            lines.append("")
        for caption, table, kind in _experiment_tables(frame, experiment, tables_dir) if not part.empty else []:
            stem = f"{_slug(experiment)}_{_slug(kind)}"
            _write_table(table, tables_dir, stem, f"{experiment}: {caption}")
            lines += [f"**{caption}** (`tables/{stem}.csv`, `tables/{stem}.tex`)", "", markdown_table(table), ""]
        if not part.empty:
            part.drop(columns=["row"]).to_csv(tables_dir / f"{_slug(experiment)}.csv", index=False)
            ppl = part[(part["metric"] == "perplexity") & part["protocol"].notna()]
            panels = [(protocol, rows, "perplexity") for protocol, rows in ppl.groupby("protocol", sort=False)]
            untrained = any("untrained" in w for w in weights)
            caveat = " (UNTRAINED memory)" if untrained else ""
            if ppl["sequence_length"].dropna().nunique() > 1:
                path = plot_panels(
                    panels,
                    "lines",
                    plots_dir / f"{_slug(experiment)}_perplexity_vs_length.png",
                    f"{experiment}: perplexity vs input length{caveat}",
                    log_y=True,
                )
            elif ppl["row"].nunique() > 1:
                path = plot_panels(
                    panels,
                    "bars",
                    plots_dir / f"{_slug(experiment)}_perplexity.png",
                    f"{experiment}: perplexity{caveat}",
                    log_y=True,
                )
            else:
                path = None
            if path is not None:
                lines += [f"![{experiment}]({path.relative_to(run_dir)})", ""]
            if part["metric"].isin(EFFICIENCY_METRICS).any():
                panels = [
                    (f"{m} ({_unit(part, m)})", part[part["metric"] == m], m)
                    for m in ("throughput", "latency_per_sample_ms_p50", "peak_memory", "forward_flops_per_token")
                ]
                path = plot_panels(panels, "bars", plots_dir / f"{_slug(experiment)}_efficiency.png", experiment)
                if path is not None:
                    lines += [f"![efficiency]({path.relative_to(run_dir)})", ""]
        series = [s for s in document["series"] if s["experiment"] == experiment]
        if series:
            path = plot_series(
                series, plots_dir / f"{_slug(experiment)}_training_curves.png", f"{experiment}: training curves"
            )
            if path is not None:
                lines += [f"![training curves]({path.relative_to(run_dir)})", ""]

    lines += ["", "## Configuration", "", "```json", json.dumps(document["config"], indent=2), "```", ""]
    summary = run_dir / summary_name
    summary.write_text("\n".join(lines), encoding="utf-8")
    return summary


# ---------------------------------------------------------------------------------------------------- comparison
def compare_runs(documents: Sequence[dict]):
    """A DataFrame with one row per (experiment, model, variant, metric, protocol, length) and one column per run,
    plus the config keys that differ between the runs (numbers from different settings are not comparable).
    `documents`: validated `metrics.json` contents (`results.load_runs`)."""
    import pandas as pd

    frames = []
    for document in documents:
        frame = pd.DataFrame(document["metrics"])
        if not frame.empty:
            frame["run"] = document["run_id"]
            frames.append(frame)
    keys = ["experiment", "model", "variant", "metric", "unit", "protocol", "sequence_length"]
    if not frames:
        return pd.DataFrame(columns=keys), {}
    frame = pd.concat(frames, ignore_index=True)
    for key in keys:
        frame[key] = frame[key].astype(object).where(frame[key].notna(), "—")
    table = frame.pivot_table(index=keys, columns="run", values="value", aggfunc="last", sort=False)
    configs = [d["config"] for d in documents]
    differing = {
        key: [c.get(key) for c in configs]
        for key in sorted(set().union(*configs))
        if len({json.dumps(c.get(key), sort_keys=True, default=str) for c in configs}) > 1
    }
    return table, differing


def write_comparison(documents: Sequence[dict], output_prefix: str | os.PathLike) -> Path:
    """Write `<output_prefix>.csv` and `<output_prefix>.md` comparing the runs' validated `metrics.json` documents;
    returns the markdown path."""
    table, differing = compare_runs(documents)
    prefix = Path(output_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(prefix.with_suffix(".csv"))
    lines = ["# Comparison of runs", "", "Runs: " + ", ".join(f"`{d['run_id']}`" for d in documents), ""]
    if differing:
        lines += ["Settings that differ between these runs (their numbers are not directly comparable):", ""]
        lines += [
            f"- `{key}`: " + " / ".join(json.dumps(v, default=str) for v in values)
            for key, values in differing.items()
        ]
        lines.append("")
    quality = table[table.index.get_level_values("metric").isin([*QUALITY_METRICS, "throughput", "peak_memory"])]
    if not quality.empty:
        flat = quality.copy()
        flat.index = [" / ".join(str(v) for v in index if v != "—") for index in flat.index]
        flat.columns = [str(c) for c in flat.columns]
        lines += [markdown_table(flat, "experiment / model / variant / metric / unit / protocol / length"), ""]
    path = prefix.with_suffix(".md")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
