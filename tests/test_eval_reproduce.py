"""The reproduction suite end to end in a tiny configuration: every named experiment runs and writes a valid
metrics.json, summary.md, tables and plots; interrupted evaluations resume; runs are compared; the seed notebook's
workflow (BaselineEvaluator, HMTEvaluator, ResultLogger, ExperimentConfig) runs."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import make_hmt

from hmt_hf.cli import main as cli_main
from hmt_hf.evaluation import (
    ChunkedTransformer,
    HMTScorer,
    SlidingWindowTransformer,
    VanillaTransformer,
    make_samples,
)
from hmt_hf.evaluation.config import ExperimentConfig
from hmt_hf.evaluation.corpus import EvalCorpus, byte_level_tokenizer
from hmt_hf.evaluation.evaluator import BaselineEvaluator, HMTEvaluator, evaluate_scorer
from hmt_hf.evaluation.experiments import EXPERIMENTS, ModelSet, resolve_experiments
from hmt_hf.evaluation.reports import compare_runs
from hmt_hf.evaluation.results import ResultCache, ResultLogger, load_runs
from hmt_hf.evaluation.schema import SchemaError, validate_metrics

REPO = Path(__file__).resolve().parents[1]
PUBMEDQA = REPO / "tests" / "fixtures" / "zero_shot" / "pubmedqa_simple.jsonl"
TINY_FIELDS = {"segment_length": 16, "sensory_memory_size": 4, "num_memory_embeddings": 8}
TINY_FLAGS = [
    "--model", "tiny", "--segment-length", "16", "--sensory-memory-size", "4", "--num-memory-embeddings", "8",
    "--lengths", "32,64", "--long-length", "96", "--num-samples", "2", "--protocol", "both",
    "--sensory-sizes", "0,4,8", "--cache-sizes", "1,8", "--bptt-depths", "2,5",
    "--window-size", "48", "--window-stride", "16", "--vanilla-max-length", "64",
    "--efficiency-warmup", "1", "--efficiency-repeats", "2", "--no-progress", "--threads", "1",
]  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")


def write_documents(folder: Path) -> Path:
    """Twelve short real documents (paragraphs of this project's README; one byte-level token per byte), so test
    samples span several documents, as the paper's samples of concatenated articles do."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for index in range(12):
        (folder / f"doc{index:02d}.txt").write_text(text[index * 150 : (index + 1) * 150], encoding="utf-8")
    return folder


def write_training_run(folder: Path, model, losses: list[float], runtime: float, eval_loss: float):
    """A stage folder as examples/train_hmt.py leaves it: the model, Trainer's state and metrics, telemetry."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    history = [{"step": 10 * (i + 1), "loss": loss, "learning_rate": 1e-5} for i, loss in enumerate(losses)]
    history += [
        {"step": 10 * len(losses), "eval_loss": eval_loss},
        {"step": 10 * len(losses), "train_runtime": runtime},
    ]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 10 * len(losses), "log_history": history}))
    (folder / "train_results.json").write_text(json.dumps({"train_runtime": runtime, "epoch": 1.0}))
    (folder / "eval_results.json").write_text(json.dumps({"eval_loss": eval_loss, "perplexity": math.exp(eval_loss)}))
    telemetry = [{"step": h["step"], "loss": h["loss"], "peak_memory_mib": 100.0 + h["step"]} for h in history[:-2]]
    (folder / "telemetry.jsonl").write_text("\n".join(json.dumps(t) for t in telemetry) + "\n")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One `hmt-hf reproduce --experiments all` run in the tiny configuration, with checkpoints for the BPTT
    depths and training folders for two-stage vs single-stage."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("reproduce")
    data = write_documents(root / "docs")
    config = ExperimentConfig(model_name="tiny", **TINY_FIELDS)
    base = ModelSet(config).hmt  # the same random weights the run builds (same seed)
    for depth in (2, 5):
        base.save_pretrained(root / f"depth{depth}")
    write_training_run(root / "two" / "stage1", base, [5.6, 5.5], runtime=3.0, eval_loss=5.4)
    write_training_run(root / "two" / "stage2", base, [5.3, 5.1, 5.0], runtime=4.0, eval_loss=4.9)
    write_training_run(root / "single", base, [5.6, 5.4, 5.3, 5.2, 5.2], runtime=9.0, eval_loss=5.1)
    argv = [
        "reproduce", *TINY_FLAGS, "--data", str(data), "--experiments", "all", "--output-dir", str(root / "out"),
        "--checkpoint", f"bptt_depth=2={root / 'depth2'}", "--checkpoint", f"bptt_depth=5={root / 'depth5'}",
        "--training-run", f"two_stage={root / 'two'}", "--training-run", f"single_stage={root / 'single'}",
        "--pubmedqa-data", str(PUBMEDQA), "--pubmedqa-contexts", "2",
    ]  # fmt: skip
    start = time.perf_counter()
    code = cli_main(argv)
    seconds = time.perf_counter() - start
    torch.set_num_threads(threads)
    run_dir = root / "out" / "hmt_evaluation_001"
    return {"code": code, "root": root, "run_dir": run_dir, "argv": argv, "seconds": seconds, "data": data,
            "document": json.loads((run_dir / "metrics.json").read_text())}  # fmt: skip


def metric(document, experiment, model, name, **fields):
    rows = [
        m for m in document["metrics"]
        if m["experiment"] == experiment and m["model"] == model and m["metric"] == name
        and all(m[k] == v for k, v in fields.items())
    ]  # fmt: skip
    assert len(rows) == 1, (experiment, model, name, fields, rows)
    return rows[0]["value"]


def test_every_named_experiment_runs_and_writes_a_valid_run(full_run):
    assert full_run["code"] == 0
    document = full_run["document"]
    statuses = {e["name"]: e["status"] for e in document["experiments"]}
    assert statuses == {name: "complete" for name in EXPERIMENTS}, [
        (e["name"], e["reason"]) for e in document["experiments"] if e["status"] != "complete"
    ]
    assert document["status"] == "complete"
    validate_metrics(full_run["run_dir"] / "metrics.json")
    assert document["config"]["segment_length"] == 16 and document["seed"] == 42
    assert document["git"]["commit"] is None or len(document["git"]["commit"]) == 40
    assert {"torch", "transformers", "evaluate"} <= set(document["environment"]["libraries"])
    assert document["data"]["num_documents"] >= 2 and document["data"]["num_bytes"] > 0
    for record in document["metrics"]:
        assert record["unit"]
        if record["model"].startswith("HMT") and record["protocol"] is not None and record["metric"] == "perplexity":
            expected = None if record["variant"] in ("retrieval off", "no memory") else "paper"
            assert record["retrieval_mode"] == expected, record


def test_summary_tables_and_plots(full_run):
    run_dir = full_run["run_dir"]
    summary = (run_dir / "summary.md").read_text()
    for experiment in EXPERIMENTS.values():
        assert f"## {experiment.name} — paper {experiment.item_for(ExperimentConfig(dataset='x'))}" in summary
    for text in (
        "paper protocol: samples of test_length + L tokens",
        "all-token protocol",
        "retrieval_mode=**paper**",
        "untrained memory parameters",
        "were NOT scored",
        "forward FLOPs =",
    ):
        assert text in summary, text
    plots = sorted(p.name for p in (run_dir / "plots").glob("*.png"))
    for expected in (
        "ppl_vs_length_perplexity_vs_length.png",
        "retrieval_perplexity.png",
        "sensory_size_perplexity.png",
        "cache_size_perplexity.png",
        "bptt_depth_perplexity.png",
        "representation_length_perplexity.png",
        "efficiency_efficiency.png",
        "two_stage_training_curves.png",
    ):
        assert expected in plots
    for plot in plots:
        assert (run_dir / "plots" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{plot}" in summary
    latex = (run_dir / "tables" / "ppl_vs_length_last_segment_perplexity.tex").read_text()
    assert "\\begin{table}" in latex and "Sliding Window" in latex
    csv = (run_dir / "tables" / "ppl_vs_length.csv").read_text().splitlines()
    assert csv[0].startswith("experiment,paper_item,model,variant,metric,value,unit")


def test_perplexity_plots_are_log_scale_and_flag_untrained_memory(full_run, monkeypatch, tmp_path):
    """One runaway perplexity must not flatten the other lines (log y axis), and a report built on untrained memory
    says so in the plot title."""
    import json

    import matplotlib.axes
    import matplotlib.figure

    from hmt_hf.evaluation.reports import write_reports

    scales, titles = [], []
    set_yscale, suptitle = matplotlib.axes.Axes.set_yscale, matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(
        matplotlib.axes.Axes, "set_yscale", lambda self, v, **k: scales.append(v) or set_yscale(self, v, **k)
    )
    monkeypatch.setattr(
        matplotlib.figure.Figure, "suptitle", lambda self, t, **k: titles.append(t) or suptitle(self, t, **k)
    )
    document = json.loads((full_run["run_dir"] / "metrics.json").read_text())
    write_reports(tmp_path, document)
    perplexity_titles = [t for t in titles if "perplexity" in t]
    # Every experiment on the run's fresh HMT is flagged; the two read from checkpoints (weights unknown) are not.
    unflagged = sorted(t for t in perplexity_titles if "UNTRAINED memory" not in t)
    assert unflagged == ["bptt_depth: perplexity", "two_stage: perplexity"]
    assert len(perplexity_titles) > len(unflagged)
    assert scales.count("log") >= len(perplexity_titles)


def test_numbers_agree_across_experiments(full_run):
    document = full_run["document"]
    for protocol in ("last_segment", "all_tokens"):
        per_length = [
            metric(document, "ppl_vs_length", "HMT", "perplexity", protocol=protocol, sequence_length=n)
            for n in (32, 64)
        ]
        average = metric(document, "average_ppl", "HMT", "perplexity", protocol=protocol)
        assert average == pytest.approx(sum(per_length) / 2)
        # The ablation "no memory" is the chunked baseline; "retrieval on" / k=4 / N=8 / j=8 are the base HMT.
        at_64 = {"protocol": protocol, "sequence_length": 64}
        chunked = metric(document, "ppl_vs_length", "Chunked", "perplexity", **at_64)
        assert metric(document, "retrieval", "HMT", "perplexity", variant="no memory", **at_64) == pytest.approx(
            chunked
        )
        hmt = metric(document, "ppl_vs_length", "HMT", "perplexity", **at_64)
        for experiment, variant in (
            ("retrieval", "retrieval on"),
            ("sensory_size", "k=4"),
            ("cache_size", "N=8"),
            ("representation_length", "j=8"),
            ("bptt_depth", "depth=2"),
        ):
            assert metric(document, experiment, "HMT", "perplexity", variant=variant, **at_64) == pytest.approx(hmt)
        assert metric(document, "ppl_vs_length", "RMT", "perplexity", **at_64) != pytest.approx(hmt)
    # Vanilla keeps 64 tokens: 96 + 16 = 112-token inputs leave 48 targets unscored, and it says so.
    assert (
        metric(document, "long_input", "Vanilla", "num_unscored_tokens", protocol="all_tokens", sequence_length=96)
        == 2 * 48
    )
    assert (
        metric(document, "long_input", "Full Context", "perplexity", protocol="all_tokens", sequence_length=96)
        is not None
    )
    relative = metric(document, "average_ppl", "HMT", "relative_change", variant="vs Chunked", protocol="last_segment")
    assert relative == pytest.approx(
        100
        * (
            metric(document, "average_ppl", "HMT", "perplexity", protocol="last_segment")
            / metric(document, "average_ppl", "Chunked", "perplexity", protocol="last_segment")
            - 1
        )
    )


def test_efficiency_and_training_metrics(full_run):
    document = full_run["document"]
    for model in ("HMT", "RMT", "Chunked", "Sliding Window", "Vanilla", "Full Context"):
        p50 = metric(document, "efficiency", model, "latency_per_sample_ms_p50")
        p99 = metric(document, "efficiency", model, "latency_per_sample_ms_p99")
        assert 0 < p50 <= p99
        assert metric(document, "efficiency", model, "throughput") > 0
        assert metric(document, "efficiency", model, "peak_memory") > 0
    # HMT processes more positions per token than the chunked backbone (memory slots, sensory tokens, Eq. 1 passes).
    positions = {m: metric(document, "efficiency", m, "positions_per_token") for m in ("HMT", "RMT", "Chunked")}
    assert positions["Chunked"] == pytest.approx(1.0) and positions["HMT"] > positions["RMT"] > 1.0
    flops = {m: metric(document, "efficiency", m, "forward_flops_per_token") for m in ("HMT", "Chunked")}
    assert flops["HMT"] > flops["Chunked"] > 0
    hmt = ModelSet(ExperimentConfig(model_name="tiny", **TINY_FIELDS)).hmt
    assert (
        metric(document, "efficiency", "HMT", "memory_parameters")
        == hmt.memory_parameter_overhead()["memory_parameters"]
    )
    assert metric(document, "efficiency", "Chunked", "parameter_overhead") == 0
    # Two-stage vs single-stage, from the training folders.
    assert metric(document, "two_stage", "HMT", "train_runtime", variant="two_stage") == pytest.approx(7.0)
    assert metric(document, "two_stage", "HMT", "train_runtime", variant="single_stage") == pytest.approx(9.0)
    assert metric(document, "two_stage", "HMT", "final_eval_loss", variant="two_stage") == pytest.approx(4.9)
    assert metric(document, "two_stage", "HMT", "train_peak_memory", variant="two_stage") == pytest.approx(130.0)
    curve = next(s for s in document["series"] if s["model"] == "two_stage")
    assert curve["x"] == [10, 20, 30, 40, 50] and curve["y"] == [5.6, 5.5, 5.3, 5.1, 5.0]
    assert metric(document, "pubmedqa", "HMT", "long_answer_ppl", variant="contexts=2") > 1


def test_rerun_into_the_same_directory_reuses_every_sample(full_run):
    """Resuming a finished run scores nothing again (every sample comes from the cache) and reproduces every
    quality number exactly."""
    cache = full_run["run_dir"] / "cache" / "samples.jsonl"
    lines = cache.read_text().count("\n")
    argv = [*full_run["argv"]]
    argv[argv.index("--experiments") + 1] = "ppl_vs_length,retrieval"
    assert cli_main([*argv, "--run-dir", str(full_run["run_dir"]), "--resume"]) == 0
    assert cache.read_text().count("\n") == lines
    document = json.loads((full_run["run_dir"] / "metrics.json").read_text())
    before = {
        (m["experiment"], m["model"], m["variant"], m["metric"], m["protocol"], m["sequence_length"]): m["value"]
        for m in full_run["document"]["metrics"]
        if m["experiment"] in ("ppl_vs_length", "retrieval")
    }
    after = {
        (m["experiment"], m["model"], m["variant"], m["metric"], m["protocol"], m["sequence_length"]): m["value"]
        for m in document["metrics"]
        if m["experiment"] in ("ppl_vs_length", "retrieval")
    }
    assert before == after


def test_resume_refuses_other_settings(full_run):
    with pytest.raises(ValueError, match="other settings.*segment_length"):
        ResultLogger(
            "hmt_evaluation",
            ExperimentConfig(model_name="tiny", segment_length=8),
            run_dir=full_run["run_dir"],
            resume=True,
        )
    with pytest.raises(FileExistsError, match="resume=True"):
        ResultLogger("hmt_evaluation", ExperimentConfig(), run_dir=full_run["run_dir"])


def test_comparison_across_runs(full_run, tmp_path):
    argv = [*full_run["argv"]]
    argv[argv.index("--experiments") + 1] = "ppl_vs_length"
    assert cli_main([*argv, "--seed", "7"]) == 0
    second = full_run["root"] / "out" / "hmt_evaluation_002"
    comparison = (second / "comparison.md").read_text()  # written automatically next to the earlier run
    assert "hmt_evaluation_001" in comparison and "hmt_evaluation_002" in comparison
    assert "`seed`: 42 / 7" in comparison
    table, differing = compare_runs(load_runs([full_run["run_dir"], second]))
    assert list(differing) == ["experiments", "seed"]
    row = table.loc[("ppl_vs_length", "HMT", "—", "perplexity", "perplexity", "last_segment", 32)]
    assert row.notna().all() and row.iloc[0] != row.iloc[1]  # different random weights


# ---------------------------------------------------------------------------------------------------- resume
class InterruptingScorer(HMTScorer):
    """A real HMT scorer that raises KeyboardInterrupt on its `interrupt_at`-th sample, like Ctrl-C mid-run."""

    def __init__(self, model, interrupt_at, **kwargs):
        super().__init__(model, **kwargs)
        self.interrupt_at, self.calls = interrupt_at, 0

    def score(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return super().score(*args, **kwargs)


def test_interrupted_evaluation_resumes_from_its_cache(tmp_path):
    model = make_hmt()
    stream = torch.randint(3, 128, (400,), generator=torch.Generator().manual_seed(1))
    samples = make_samples(stream, 32, 8, num_samples=6)
    reference = evaluate_scorer(
        HMTScorer(model, name="HMT"), samples, ResultCache(tmp_path / "a.jsonl"), progress=False
    )
    interrupted = InterruptingScorer(model, interrupt_at=4, name="HMT")
    with pytest.raises(KeyboardInterrupt):
        evaluate_scorer(interrupted, samples, ResultCache(tmp_path / "b.jsonl"), progress=False)
    with open(tmp_path / "b.jsonl", "a") as handle:
        handle.write('{"key": "HMT|cut sho')  # a line cut short by the interruption is ignored
    resumed_scorer = InterruptingScorer(model, interrupt_at=0, name="HMT")
    resumed = evaluate_scorer(resumed_scorer, samples, ResultCache(tmp_path / "b.jsonl"), progress=False)
    assert resumed.num_computed == 3 and resumed_scorer.calls == 3  # samples 0-2 came from the cache
    assert resumed.metrics["perplexity"] == pytest.approx(reference.metrics["perplexity"], rel=1e-12)
    # Changed settings are never served from the cache.
    other = HMTScorer(model, name="HMT", overrides={"num_memory_embeddings": 1})
    assert evaluate_scorer(other, samples, ResultCache(tmp_path / "b.jsonl"), progress=False).num_computed == 6


@pytest.mark.slow
def test_killed_reproduce_process_resumes(tmp_path):
    """A real `hmt-hf reproduce` process killed mid-run (SIGKILL, no cleanup) resumes with --resume and gives the
    numbers of an uninterrupted run."""
    data = write_documents(tmp_path / "docs")
    flags = [
        *TINY_FLAGS,
        "--data",
        str(data),
        "--experiments",
        "ppl_vs_length",
        "--protocol",
        "last_segment",
        "--num-samples",
        "6",
        "--lengths",
        "64,96",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "hmt_hf.cli", "reproduce", *flags, "--output-dir"]
    process = subprocess.Popen(
        [*command, str(tmp_path / "killed")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    cache = tmp_path / "killed" / "hmt_evaluation_001" / "cache" / "samples.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not cache.exists() or cache.read_text().count("\n") < 8):
        assert process.poll() is None, "the run finished before it could be interrupted"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    partial = json.loads((cache.parent.parent / "metrics.json").read_text())
    assert partial["status"] == "running" and not partial["metrics"]
    done_before = cache.read_text().count("\n")
    run_dir = cache.parent.parent
    resumed = subprocess.run(
        [*command, str(tmp_path / "killed"), "--run-dir", str(run_dir), "--resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    total = 2 * 6 * 6  # lengths x samples x models
    assert cache.read_text().count("\n") == total and done_before < total
    assert cli_main(["reproduce", *flags, "--output-dir", str(tmp_path / "clean")]) == 0
    values = [
        {(m["model"], m["metric"], m["sequence_length"]): m["value"] for m in
         json.loads((d / "metrics.json").read_text())["metrics"]}
        for d in (run_dir, tmp_path / "clean" / "hmt_evaluation_001")
    ]  # fmt: skip
    assert values[0] == pytest.approx(values[1], rel=1e-9)


# ---------------------------------------------------------------------------------------------------- schema
def good_document(tmp_path) -> dict:
    logger = ResultLogger("schema", ExperimentConfig(model_name="tiny"), output_dir=tmp_path)
    logger.log_metric(
        "ppl_vs_length",
        "HMT",
        "perplexity",
        12.5,
        protocol="last_segment",
        retrieval_mode="paper",
        sequence_length=2048,
        num_samples=3,
        num_tokens=765,
    )
    logger.log_experiment("ppl_vs_length", "Fig. 2", ("Figure 4",), seconds=1.5)
    logger.save()
    return json.loads((logger.exp_dir / "metrics.json").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("run_id"), "run_id"),
        (lambda d: d["metrics"][0].update(value="12.5"), "value"),
        (lambda d: d["metrics"][0].update(protocol="first_segment"), "protocol"),
        (lambda d: d["metrics"][0].pop("unit"), "unit"),
        (lambda d: d.update(schema_version="hmt_hf.metrics/0"), "schema_version"),
        (lambda d: d["experiments"][0].update(status="done"), "status"),
        (lambda d: d["metrics"][0].update(extra=1), "extra"),
        (lambda d: d["metrics"][0].update(value=float("nan")), "finite"),
    ],
)
def test_schema_rejects_invalid_documents(tmp_path, change, message):
    document = good_document(tmp_path)
    validate_metrics(document)
    change(document)
    with pytest.raises(SchemaError, match=message):
        validate_metrics(document)


def test_logger_refuses_metric_without_unit(tmp_path):
    logger = ResultLogger("units", output_dir=tmp_path)
    with pytest.raises(ValueError, match="no default unit"):
        logger.log_metric("x", "HMT", "mystery", 1.0)
    assert logger.log_metric("x", "HMT", "mystery", 1.0, unit="widgets")["unit"] == "widgets"


def test_experiment_names_resolve():
    assert [e.name for e in resolve_experiments(["fig2", "Table 8", "figure 12"])] == [
        "ppl_vs_length", "sensory_size", "two_stage"]  # fmt: skip
    assert [e.name for e in resolve_experiments(["Table 7"])] == [
        "sensory_size", "cache_size", "bptt_depth", "representation_length", "efficiency"]  # fmt: skip
    with pytest.raises(ValueError, match="Unknown experiment 'table99'"):
        resolve_experiments(["table99"])


# ---------------------------------------------------------------------------------------------------- seed workflow
def test_seed_notebook_workflow(tmp_path):
    """The evaluation notebook's workflow, with its names, end to end on a tiny model."""
    hmt_model = make_hmt(segment_length=8)
    backbone = hmt_model.backbone
    vanilla_model = VanillaTransformer(backbone, max_length=32, truncation_strategy="tail")
    sliding_model = SlidingWindowTransformer(backbone, window_size=16, stride=8)
    evaluator = BaselineEvaluator(
        models={"HMT": hmt_model, "Vanilla": vanilla_model, "Sliding Window": sliding_model}, progress=False
    )
    stream = torch.randint(3, 128, (600,), generator=torch.Generator().manual_seed(2))
    results_fig4 = evaluator.compare_long_context(test_dataset=stream, sequence_lengths=[16, 48], num_samples=3)
    assert set(results_fig4) == {"HMT", "Vanilla", "Sliding Window"}
    assert all(isinstance(results_fig4[m][n], float) for m in results_fig4 for n in (16, 48))
    with pytest.warns(UserWarning, match="Length 4096 left out"):
        evaluator.compare_long_context(test_dataset=stream, sequence_lengths=[4096], num_samples=1)

    loader = torch.utils.data.DataLoader([{"input_ids": stream[i : i + 40]} for i in range(0, 160, 40)], batch_size=2)
    wikitext_results = evaluator.evaluate_all_models(loader, max_batches=2)
    for metrics in wikitext_results.values():
        assert metrics["num_scored_tokens"] == 4 * 39 - (8 * 4 if metrics is wikitext_results["Vanilla"] else 0)
        assert math.isfinite(metrics["perplexity"]) and metrics["loss"] == pytest.approx(
            math.log(metrics["perplexity"])
        )

    efficiency_results = evaluator.compare_efficiency(loader, num_warmup=1, num_measure=2)
    assert efficiency_results["speedup"]["Vanilla"] == pytest.approx(1.0)
    for name in ("HMT", "Vanilla", "Sliding Window"):
        assert efficiency_results[name]["tokens_per_second"] > 0
        assert efficiency_results[name]["seconds_per_batch"] > 0

    hmt_evaluator = HMTEvaluator(hmt_model, progress=False)
    ablation_results = {
        "no_memory": hmt_evaluator.evaluate_perplexity(loader, use_memory=False, max_batches=2),
        "full_hmt": hmt_evaluator.evaluate_perplexity(loader, use_memory=True, max_batches=2),
    }
    chunked = evaluate_scorer(
        ChunkedTransformer(backbone, 8), [s for s in make_samples(stream[:160], 32, 8, "all_tokens")], progress=False
    )
    assert chunked.metrics["num_scored_tokens"] == 4 * 39
    assert ablation_results["no_memory"]["perplexity"] == pytest.approx(chunked.metrics["perplexity"], rel=1e-5)

    config = ExperimentConfig(
        name="complete_evaluation",
        model_name="tiny",
        dataset="random",
        segment_length=8,
        num_memory_embeddings=3,
        sensory_memory_size=3,
        batch_size=1,
        learning_rate=1e-5,
        seed=42,
        paper_table="All Tables + Figure 4",
    )
    logger = ResultLogger(
        experiment_name="hmt_full_evaluation", config=config, auto_increment=True, output_dir=tmp_path
    )
    BaselineEvaluator(
        models={"HMT": hmt_model, "Vanilla": vanilla_model}, logger=logger, progress=False
    ).compare_long_context(stream, [16, 48], num_samples=2)
    report = logger.generate_report(save_name="comprehensive_evaluation_report.md")
    assert report == logger.exp_dir / "comprehensive_evaluation_report.md" and logger.exp_dir.name.endswith("_001")
    assert "perplexity" in report.read_text()
    assert ResultLogger("hmt_full_evaluation", config, output_dir=tmp_path).exp_dir.name.endswith("_002")


def test_corpus_from_datasets_and_token_lists():
    from datasets import Dataset

    tokenizer = byte_level_tokenizer()
    corpus = EvalCorpus.from_texts(["ab", "cde"], tokenizer)
    assert corpus.token_ids.tolist() == [97, 98, 256, 99, 100, 101, 256] and corpus.document_starts == [0, 3]
    from hmt_hf.evaluation.corpus import as_corpus

    dataset = as_corpus(Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]]}))
    assert dataset.token_ids.tolist() == [1, 2, 3, 4, 5] and dataset.byte_lengths is None
    assert as_corpus([[1, 2], [3]]).document_starts == [0, 2]
    with pytest.raises(ValueError, match="tokenizer"):
        as_corpus(["some text"])


def test_example_script_lists_the_experiments(capsys, monkeypatch):
    import runpy

    monkeypatch.setattr(sys, "argv", ["reproduce_paper.py", "--experiments", "list"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "examples" / "reproduce_paper.py"), run_name="__main__")
    assert exit_info.value.code == 0
    listing = capsys.readouterr().out
    assert (
        all(name in listing for name in EXPERIMENTS) and "Table 8" in listing and "also accepted: Table 5" in listing
    )


def test_reproduce_flags_are_the_experiment_config(tmp_path):
    """`hmt-hf reproduce` parses `ExperimentConfig` with HfArgumentParser: the aliases, comma lists, repeated
    KEY=VALUE flags, a --config file under the flags, and one JSON file for everything."""
    from hmt_hf.cli import parse

    config, args = parse([
        "reproduce", "--model", "tiny", "--data", "books", "--lengths", "1024,2048", "--protocol", "both",
        "--checkpoint", "bptt_depth=2=/a", "--checkpoint", "retrieval=off=/b", "--training-run", "two_stage=s1,s2",
        "--baselines", "sliding,hmt", "--segment-length", "64", "--no-progress", "--resume",
    ])  # fmt: skip
    assert (config.model_name, config.dataset, config.segment_length) == ("tiny", "books", 64)
    assert config.sequence_lengths == [1024, 2048]
    assert config.protocols == ["last_segment", "all_tokens"] and config.baselines == ["sliding_window", "hmt"]
    assert config.variant_checkpoints == {"bptt_depth=2": "/a", "retrieval=off": "/b"}
    assert config.training_runs == {"two_stage": ["s1", "s2"]} and not args.progress and args.resume

    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(ExperimentConfig(model_name="tiny", num_samples=7,
                                                 variant_checkpoints={"bptt_depth=5": "/c"}).to_dict()))  # fmt: skip
    config, _ = parse(["reproduce", "--config", str(saved), "--num-samples", "2", "--checkpoint", "bptt_depth=2=/a"])
    assert (config.model_name, config.num_samples) == ("tiny", 2)
    assert config.variant_checkpoints == {"bptt_depth=5": "/c", "bptt_depth=2": "/a"}

    both = tmp_path / "run.json"
    both.write_text(json.dumps({"model_name": "tiny", "sequence_lengths": [64], "output_dir": "o", "fail_fast": True}))
    config, args = parse(["reproduce", str(both)])
    assert (config.sequence_lengths, args.output_dir, args.fail_fast) == ([64], "o", True)
    assert ExperimentConfig().fingerprint() == ExperimentConfig.from_dict(ExperimentConfig().to_dict()).fingerprint()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model", "/no/such/folder"], "--model /no/such/folder: no such folder"),
        (["--model", "tiny", "--data", "/no/such/texts.txt"], "--data /no/such/texts.txt: no such file or folder"),
        (["--model", "tiny", "--data", "wiki", "--data-dir", "/no/such/dir"], "hmt-hf prepare-data wiki"),
        (["--model", "tiny", "--checkpoint", "bptt_depth=2=/no/such/ckpt"], "--checkpoint bptt_depth=2"),
        (["--model", "tiny", "--lengths", "2k,8k"], "give comma-separated integers"),
        (["--model", "tiny", "--protocol", "every"], "--protocol 'every' is invalid"),
        (["--model", "tiny", "--checkpoint", "nokey"], "give KEY=VALUE"),
    ],
)
def test_bad_reproduce_input_fails_fast_with_one_line(tmp_path, capsys, flags, message):
    """A path that cannot work is reported in one line, before any model loads, and leaves no run folder behind."""
    start = time.perf_counter()
    code = cli_main(["reproduce", *flags, "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert time.perf_counter() - start < 5
