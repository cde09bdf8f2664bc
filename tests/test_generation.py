"""generate() with rolling memory: consistency with the forward pass, padding, beams, sampling, refusals."""

import pytest
import torch
from conftest import make_hmt

PROMPT, NEW = 13, 20  # L=8: the open prompt segment fills at 16, then rollovers at 16, 24 and 32 while decoding


def greedy(model, ids, **kwargs):
    return model.generate(
        ids,
        max_new_tokens=NEW,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        **kwargs,
    )


@pytest.mark.parametrize("model_type", ["llama", "bloom", "gemma", "gpt2", "opt"])
@torch.no_grad()
def test_causal_greedy_generation_equals_the_teacher_forced_forward(model_type):
    model = make_hmt(model_type, retrieval_mode="causal")
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    out = greedy(model, ids)
    forced = model(out.sequences).logits[0, PROMPT - 1 : -1]
    torch.testing.assert_close(torch.cat(out.logits), forced, atol=1e-4, rtol=0)
    assert torch.equal(forced.argmax(-1), out.sequences[0, PROMPT:])


@torch.no_grad()
def test_prompt_ten_times_longer_than_the_backbone_context():
    model = make_hmt("llama", retrieval_mode="causal")
    prompt = 10 * model.config.text_config.max_position_embeddings + 5
    ids = torch.randint(3, 128, (1, prompt), generator=torch.Generator().manual_seed(1))
    out = greedy(model, ids)
    forced = model(out.sequences).logits[0, prompt - 1 : -1]
    torch.testing.assert_close(torch.cat(out.logits), forced, atol=1e-4, rtol=0)
    assert out.sequences.shape == (1, prompt + NEW)


@torch.no_grad()
def test_prefill_logits_equal_the_forward_pass_in_paper_mode():
    """A prompt segment whose first j tokens are known reads them (Eq. 1) exactly as the forward pass does."""
    model = make_hmt("llama", retrieval_mode="paper")
    ids = torch.randint(3, 128, (2, 29))
    torch.testing.assert_close(model(ids, use_cache=True).logits, model(ids).logits, atol=1e-5, rtol=0)


@torch.no_grad()
def test_paper_mode_segments_opened_while_decoding_use_the_causal_query():
    """A segment opened during decoding has no tokens yet, so its query reads the j tokens before it: from a
    one-token prompt (no prompt segment to close), paper-mode decoding equals causal-mode decoding."""
    ids = torch.randint(3, 128, (1, 1))
    paper, causal = make_hmt("llama", retrieval_mode="paper"), make_hmt("llama", retrieval_mode="causal")
    torch.testing.assert_close(torch.cat(greedy(paper, ids).logits), torch.cat(greedy(causal, ids).logits))


@torch.no_grad()
def test_left_padded_batch_equals_each_prompt_alone():
    """Prompts of different lengths roll segments over at different steps."""
    model = make_hmt("llama", retrieval_mode="causal")
    long, short = torch.randint(3, 128, (1, 13)), torch.randint(3, 128, (1, 6))
    batch = torch.cat([long, torch.cat([torch.zeros(1, 7, dtype=torch.long), short], 1)])
    mask = torch.cat([torch.ones(1, 13), torch.cat([torch.zeros(1, 7), torch.ones(1, 6)], 1)]).long()
    together = greedy(model, batch, attention_mask=mask)
    for row, prompt in enumerate((long, short)):
        alone = greedy(model, prompt)
        assert torch.equal(together.sequences[row, 13:], alone.sequences[0, prompt.shape[1] :])
        torch.testing.assert_close(
            torch.stack([step[row] for step in together.logits]), torch.cat(alone.logits), atol=1e-4, rtol=0
        )


@torch.no_grad()
def test_beam_search_scores_match_the_forward_pass_so_memory_follows_the_beams():
    model = make_hmt("llama", retrieval_mode="causal")
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    out = model.generate(
        ids,
        max_new_tokens=NEW,
        num_beams=3,
        num_return_sequences=2,
        do_sample=False,
        length_penalty=0.0,
        early_stopping=False,
        return_dict_in_generate=True,
        output_scores=True,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert out.sequences.shape == (2, PROMPT + NEW)
    for sequence, score in zip(out.sequences, out.sequences_scores):
        log_probs = model(sequence[None]).logits[0, PROMPT - 1 : -1].log_softmax(-1)
        expected = log_probs.gather(1, sequence[PROMPT:, None]).sum()
        torch.testing.assert_close(score, expected, atol=1e-3, rtol=0)


@torch.no_grad()
def test_sampling_is_deterministic_under_a_seed_and_returns_the_requested_sequences():
    model = make_hmt("llama")
    ids = torch.randint(3, 128, (2, PROMPT))
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        runs.append(model.generate(ids, max_new_tokens=NEW, do_sample=True, num_return_sequences=3, pad_token_id=0))
    assert runs[0].shape == (6, PROMPT + NEW)
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, "prompt is empty"),
        ({"max_new_tokens": -1}, r"max_new_tokens=-1 must be >= 0"),
        ({"cache_implementation": "static"}, r"cache_implementation='static' is not supported"),
        ({"prompt_lookup_num_tokens": 3}, "assisted decoding"),
    ],
)
def test_unsupported_generation_requests_are_refused(kwargs, message):
    kwargs = {"input_ids": torch.ones(1, 4, dtype=torch.long), **kwargs}
    with pytest.raises(ValueError, match=message):
        make_hmt("llama").generate(**kwargs)
