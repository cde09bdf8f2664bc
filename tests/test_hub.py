"""Model cards: Hub metadata (model-index from eval results) and a README that describes the HMT."""

import yaml
from conftest import make_hmt

from hmt_hf.hub import create_model_card


def test_model_card_metadata_and_text(tmp_path):
    model = make_hmt(retrieval_mode="causal")
    model.config.text_config._name_or_path = "HuggingFaceTB/SmolLM2-135M"
    card = create_model_card(
        model,
        repo_id="someone/hmt-smollm2",
        datasets=["emozilla/pg19"],
        eval_results=[
            {"dataset_name": "pg19", "metric_type": "perplexity", "metric_value": 31.5, "dataset_split": "test",
             "metric_name": "Perplexity (all tokens, causal retrieval)"},
        ],
        training_text="Two stages on PG-19.",
    )  # fmt: skip
    card.save(tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    metadata = yaml.safe_load(text.split("---")[1])
    assert metadata["library_name"] == "transformers" and metadata["pipeline_tag"] == "text-generation"
    assert metadata["base_model"] == "HuggingFaceTB/SmolLM2-135M" and "hmt" in metadata["tags"]
    result = metadata["model-index"][0]["results"][0]
    assert result["metrics"][0] == {
        "type": "perplexity", "value": 31.5, "name": "Perplexity (all tokens, causal retrieval)"
    }  # fmt: skip
    assert result["dataset"]["split"] == "test"
    assert "| `segment_length` (L) | 8 |" in text and "`causal`" in text
    assert 'from_pretrained("someone/hmt-smollm2", trust_remote_code=True)' in text
    assert "Two stages on PG-19." in text and "No evaluation recorded" in text
    overhead = model.memory_parameter_overhead()
    assert f"{overhead['memory_parameters']:,}" in text


def test_push_refuses_a_folder_that_is_not_an_hmt_checkpoint_before_any_network_call(tmp_path, capsys):
    import json

    from hmt_hf.cli import main

    assert main(["push", "--model_name_or_path", str(tmp_path / "none"), "--repo_id", "user/x"]) == 2
    assert "no checkpoint there (no config.json)" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["push", "--model_name_or_path", str(tmp_path), "--repo_id", "user/x"]) == 2
    assert "is not an HMT checkpoint; convert it with `hmt-hf convert`" in capsys.readouterr().err
