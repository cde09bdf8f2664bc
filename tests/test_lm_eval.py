"""The lm-evaluation-harness backend `"hmt"` (`hmt_hf.evaluation.lm_eval_backend.HMTLM`), offline.

A tiny random HMT (backbone: 128 positions, L = 8) and the BPE of tests/fixtures/zero_shot; local lm-eval tasks
(YAML + jsonl in a tmp dir): a multiple-choice task whose contexts run up to ~4x the backbone's positions, and a
loglikelihood_rolling task whose longest document is ~5x. What lm-eval reports must equal the package's own scorers.
Offline: conftest sets HF_HUB_OFFLINE before anything imports `datasets`, which then stays offline too.
"""

import json
import math
import os
import sys

import lm_eval
import pytest
import torch
import yaml
from conftest import SMALL_HMT
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from tiny_backbones import fixture_tokenizer, tiny_config
from transformers import AutoModelForCausalLM

from hmt_hf import HMTForCausalLM
from hmt_hf.evaluation import HMTScorer
from hmt_hf.evaluation.lm_eval_backend import HMTLM, ScorerLM, lm_for, main
from hmt_hf.evaluation.zero_shot import ContinuationScorer, get_task

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "zero_shot")
BACKBONE_POSITIONS = 128  # tiny_config's max_position_embeddings


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return fixture_tokenizer()


@pytest.fixture(scope="module")
def hmt(tokenizer):
    """Default retrieval_mode="paper": the mode where dropping the last token or padding on the right would show."""
    torch.manual_seed(0)
    config = tiny_config("llama", vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1)
    return HMTForCausalLM.from_backbone(AutoModelForCausalLM.from_config(config), **SMALL_HMT).eval()


def _lines(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as file:
        return [json.loads(line) for line in file]


ABSTRACTS = " ".join(" ".join(row["contexts"]) for row in _lines("pubmedqa_simple.jsonl"))
# PIQA-schema rows: the fixture's three (3-5 segments), and two whose question follows ~2x and ~4x the backbone's
# positions of text.
MC_ROWS = _lines("piqa.jsonl") + [
    {"goal": f"{ABSTRACTS * 2} What did the trial of preschool classes measure?", "label": 1,
     "sol1": "Sleep onset.", "sol2": "Vocabulary scores after six months."},
    {"goal": f"{ABSTRACTS} Answer yes or no: were screens used before bed?", "label": 0,
     "sol1": "yes", "sol2": "no"},
]  # fmt: skip
DOCUMENTS = ["Shared reading is recommended.", ABSTRACTS, ABSTRACTS * 3]


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory):
    """Two local lm-eval tasks: `hmt_test_mc` (PIQA's prompt) and `hmt_test_rolling` (documents' perplexity)."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, rows in (("mc", MC_ROWS), ("docs", [{"text": text} for text in DOCUMENTS])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = {"dataset_path": "json", "test_split": "test"}
    tasks = {
        "hmt_test_mc": {
            "dataset_kwargs": {"data_files": {"test": str(folder / "mc.jsonl")}},
            "output_type": "multiple_choice",
            "doc_to_text": "Question: {{goal}}\nAnswer:",
            "doc_to_choice": "{{[sol1, sol2]}}",
            "doc_to_target": "label",
            "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        },
        "hmt_test_rolling": {
            "dataset_kwargs": {"data_files": {"test": str(folder / "docs.jsonl")}},
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}, {"metric": "bits_per_byte"}],
        },
    }
    for name, config in tasks.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({"task": name, **common, **config}))
    return folder


@pytest.fixture(scope="module")
def task_manager(task_folder):
    return TaskManager(include_path=str(task_folder), include_defaults=False)


def evaluate(model, task_manager, task, **kwargs):
    out = lm_eval.simple_evaluate(model=model, tasks=[task], task_manager=task_manager, bootstrap_iters=0, **kwargs)
    samples = sorted(out["samples"][task], key=lambda sample: sample["doc_id"])
    return out["results"][task], samples


@pytest.fixture(scope="module")
def package_mc(hmt, tokenizer):
    """The package's own scorer, one row at a time, every candidate from scratch; accuracies by hand."""
    scorer = ContinuationScorer(hmt, tokenizer, batch_size=1, share_context_memory=False, progress=False)
    predictions = []
    for index, row in enumerate(MC_ROWS):
        example = get_task("piqa").build(row, index)
        scores = scorer.score([(example.context, " " + choice) for choice in example.choices])
        predictions.append(
            {
                "label": example.label,
                "logprobs": [score.logprob for score in scores],
                "is_greedy": [score.is_greedy for score in scores],
                "chars": [len(choice) for choice in example.choices],
            }
        )

    def accuracy(divisors):
        hits = [
            max(range(len(p["logprobs"])), key=lambda i: p["logprobs"][i] / divisors(p)[i]) == p["label"]
            for p in predictions
        ]
        return sum(hits) / len(hits)

    return {
        "predictions": predictions,
        "acc": accuracy(lambda p: [1] * len(p["logprobs"])),
        "acc_norm": accuracy(lambda p: p["chars"]),
    }


@torch.no_grad()
def one_pass_logprob(model, tokenizer, context, continuation):
    """Sum of log p(continuation) from one plain forward pass over the whole text (lm-eval's tokenisation)."""
    context_ids = tokenizer(context)["input_ids"]
    ids = tokenizer(context + continuation)["input_ids"]
    log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return sum(float(log_probs[t - 1, ids[t]]) for t in range(len(context_ids), len(ids)))


def test_hmt_is_registered_beside_the_stock_backends():
    assert get_model("hmt") is HMTLM
    assert get_model("hf") is HFLM  # registering "hmt" first must not hide lm-eval's own models


def test_multiple_choice_through_lm_eval_equals_the_package_scorer(hmt, tokenizer, task_manager, package_mc):
    context_lengths = [len(tokenizer(f"Question: {row['goal']}\nAnswer:")["input_ids"]) for row in MC_ROWS]
    assert max(context_lengths) > 3 * BACKBONE_POSITIONS and min(context_lengths) < 5 * SMALL_HMT["segment_length"]
    results, samples = evaluate(HMTLM(pretrained=hmt, tokenizer=tokenizer, batch_size=3), task_manager, "hmt_test_mc")

    assert [sample["doc_id"] for sample in samples] == list(range(len(MC_ROWS)))
    for sample, expected, row in zip(samples, package_mc["predictions"], MC_ROWS):
        logprobs = [logprob for logprob, _ in sample["filtered_resps"]]
        assert logprobs == pytest.approx(expected["logprobs"], abs=1e-5)
        assert [greedy for _, greedy in sample["filtered_resps"]] == expected["is_greedy"]
        # Independently of ContinuationScorer: one forward pass of HMT over the whole text.
        context = f"Question: {row['goal']}\nAnswer:"
        direct = [one_pass_logprob(hmt, tokenizer, context, " " + row[f"sol{i}"]) for i in (1, 2)]
        assert logprobs == pytest.approx(direct, abs=1e-5)
    assert results["acc,none"] == pytest.approx(package_mc["acc"])
    assert results["acc_norm,none"] == pytest.approx(package_mc["acc_norm"])

    # The long rows are long enough that cutting them to the backbone's positions changes their scores.
    truncated = ContinuationScorer(hmt, tokenizer, max_length=BACKBONE_POSITIONS, progress=False)
    for sample, row, length in zip(samples, MC_ROWS, context_lengths):
        if length > BACKBONE_POSITIONS:
            cut = truncated.score([(f"Question: {row['goal']}\nAnswer:", " " + row["sol1"])])[0]
            assert cut.truncated_tokens > 0 and abs(cut.logprob - sample["filtered_resps"][0][0]) > 1e-4


def test_model_name_and_model_args_load_a_saved_checkpoint(hmt, tokenizer, task_manager, package_mc, tmp_path):
    hmt.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    results, samples = evaluate(
        "hmt", task_manager, "hmt_test_mc", model_args=f"pretrained={tmp_path}", batch_size=2, device="cpu"
    )
    for sample, expected in zip(samples, package_mc["predictions"]):
        assert [logprob for logprob, _ in sample["filtered_resps"]] == pytest.approx(expected["logprobs"], abs=1e-5)
    assert results["acc,none"] == pytest.approx(package_mc["acc"])


def test_hmt_lm_eval_command_runs_lm_eval_with_the_backend(
    hmt, tokenizer, task_folder, package_mc, tmp_path, monkeypatch
):
    """`hmt-lm-eval` is lm-eval's own command line with "hmt" registered."""
    hmt.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    arguments = f"run --model hmt --model_args pretrained={tmp_path / 'model'} --tasks hmt_test_mc --device cpu"
    arguments += f" --include_path {task_folder} --batch_size 4 --output_path {tmp_path / 'out'}"
    monkeypatch.setattr(sys, "argv", ["hmt-lm-eval", *arguments.split()])
    main()
    (path,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(path.read_text())["results"]["hmt_test_mc"]
    assert results["acc,none"] == pytest.approx(package_mc["acc"])
    assert results["acc_norm,none"] == pytest.approx(package_mc["acc_norm"])


def test_rolling_loglikelihood_reads_each_document_in_one_pass(hmt, tokenizer, task_manager):
    token_counts = [len(tokenizer(text)["input_ids"]) for text in DOCUMENTS]
    assert max(token_counts) > 2 * BACKBONE_POSITIONS
    results, samples = evaluate(HMTLM(pretrained=hmt, tokenizer=tokenizer), task_manager, "hmt_test_rolling")

    # The package's scorer (scoring.py interface), one segment per call with the memory carried, and one plain
    # forward call over the whole document: lm-eval's rolling convention is log p(every token | BOS, earlier ones).
    scorer = HMTScorer(hmt, segments_per_call=1)
    expected = []
    for sample, text in zip(samples, DOCUMENTS):
        ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(text)["input_ids"]]])
        reference = -float(scorer.score(ids).nll_sum()[0])
        with torch.no_grad():
            log_probs = torch.log_softmax(hmt(ids).logits[0, :-1].double(), -1)
        assert reference == pytest.approx(float(log_probs.gather(-1, ids[0, 1:, None]).sum()), abs=1e-4)
        assert sample["filtered_resps"][0] == pytest.approx(reference, abs=1e-4)
        expected.append(reference)

    total = sum(expected)
    num_bytes = sum(len(text.encode("utf-8")) for text in DOCUMENTS)
    num_words = sum(len(text.split()) for text in DOCUMENTS)
    assert results["bits_per_byte,none"] == pytest.approx(-total / num_bytes / math.log(2), rel=1e-6)
    assert results["byte_perplexity,none"] == pytest.approx(math.exp(-total / num_bytes), rel=1e-6)
    assert results["word_perplexity,none"] == pytest.approx(math.exp(-total / num_words), rel=1e-6)


def test_stock_hf_backend_cuts_hmt_inputs_to_the_backbone_context(hmt, tokenizer):
    """What `--model hf` does with an HMT, and `"hmt"` does not: contexts and rolling windows of 128 tokens."""
    stock = HFLM(pretrained=hmt, tokenizer=tokenizer, batch_size=1)
    ours = HMTLM(pretrained=hmt, tokenizer=tokenizer)
    assert stock.max_length == BACKBONE_POSITIONS and ours.max_length > 10**15
    row = MC_ROWS[3]
    request = (f"Question: {row['goal']}\nAnswer:", " " + row["sol2"])
    exact = one_pass_logprob(hmt, tokenizer, *request)
    instance = [Instance("loglikelihood", {}, request, 0)]
    (stock_score, _), (our_score, _) = stock.loglikelihood(instance)[0], ours.loglikelihood(instance)[0]
    assert our_score == pytest.approx(exact, abs=1e-5)
    assert abs(stock_score - exact) > 1e-3

    document = [Instance("loglikelihood_rolling", {}, (DOCUMENTS[2],), 0)]
    stock_rolling, our_rolling = stock.loglikelihood_rolling(document)[0], ours.loglikelihood_rolling(document)[0]
    assert abs(stock_rolling - our_rolling) > 1e-3


def test_generate_until_reads_whole_prompts_in_batches(hmt, tokenizer):
    lm = HMTLM(pretrained=hmt, tokenizer=tokenizer, batch_size=3)
    prompts = ["Question: Is the moon larger than the earth?\nAnswer:", MC_ROWS[3]["goal"], "Shared"]
    kwargs = {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False}
    generated = lm.generate_until(
        [Instance("generate_until", {}, (p, dict(kwargs)), i) for i, p in enumerate(prompts)]
    )
    for prompt, text in zip(prompts, generated):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        alone = hmt.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        assert text == tokenizer.decode(alone[0, ids.shape[1] :], skip_special_tokens=True).split("\n\n")[0]
    assert len(tokenizer(prompts[1])["input_ids"]) > BACKBONE_POSITIONS


def test_unsupported_settings_are_refused(hmt, tokenizer):
    with pytest.raises(ValueError, match="max_length"):
        HMTLM(pretrained=hmt, tokenizer=tokenizer, max_length=64)
    with pytest.raises(ValueError, match="auto"):
        HMTLM(pretrained=hmt, tokenizer=tokenizer, batch_size="auto")
    with pytest.raises(TypeError, match="not an HMTForCausalLM"):
        HMTLM(pretrained=hmt.backbone, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="at least one"):
        ContinuationScorer(hmt, tokenizer, progress=False).score_encoded([([5, 6], [])])


def test_an_empty_continuation_scores_zero_like_hflm(hmt, tokenizer):
    lm = HMTLM(pretrained=hmt, tokenizer=tokenizer)
    context = tokenizer("The cat sat on the mat.")["input_ids"]
    empty, scored = lm._loglikelihood_tokens([(None, context, []), (None, context, context[:2])], disable_tqdm=True)
    assert empty == (0.0, True)
    expected = ContinuationScorer(hmt, tokenizer, progress=False).score_encoded([(context, context[:2])])[0]
    assert scored == (expected.logprob, expected.is_greedy) and scored[0] < 0


def test_lm_for_picks_the_backend_of_a_loaded_model(hmt, tokenizer):
    """HMT → HMTLM, a transformers LM → lm-eval's HFLM, the rest (baselines, options those lack) → ScorerLM."""
    from hmt_hf.evaluation.baselines import VanillaTransformer

    vanilla = VanillaTransformer(hmt.backbone, max_length=64)
    picks = {
        "hmt": lm_for(hmt, tokenizer),
        "hmt_without_memory": lm_for(hmt, tokenizer, model_kwargs={"use_memory": False}),
        "backbone": lm_for(hmt.backbone, tokenizer),
        "hmt_cut": lm_for(hmt, tokenizer, max_length=64),
        "backbone_kwargs": lm_for(hmt.backbone, tokenizer, model_kwargs={"use_cache": False}),
        "baseline": lm_for(vanilla, tokenizer),
    }
    assert {name: type(lm).__name__ for name, lm in picks.items()} == {
        "hmt": "HMTLM",
        "hmt_without_memory": "HMTLM",
        "backbone": "HFLM",
        "hmt_cut": "ScorerLM",
        "backbone_kwargs": "ScorerLM",
        "baseline": "ScorerLM",
    }
    assert picks["hmt_without_memory"].scorer.model_kwargs == {"use_memory": False}
    assert picks["backbone"].max_length == BACKBONE_POSITIONS and picks["hmt_cut"].max_length == 64
    with pytest.raises(ValueError, match="batch_size=0 must be an int >= 1"):
        lm_for(hmt, tokenizer, batch_size=0)
    with pytest.raises(ValueError, match="max_length=1 must be 'model', None or an int >= 2"):
        lm_for(hmt, tokenizer, max_length=1)
    scorer_lm = picks["baseline"]
    assert isinstance(scorer_lm, ScorerLM)
    with pytest.raises(NotImplementedError, match="loglikelihood requests only"):
        scorer_lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("text",), 0)])
    with pytest.raises(NotImplementedError, match="loglikelihood requests only"):
        scorer_lm.generate_until([Instance("generate_until", {}, ("text", {}), 0)])
