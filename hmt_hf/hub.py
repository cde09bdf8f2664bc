"""Model cards for HMT checkpoints: Hub metadata (`library_name`, `pipeline_tag`, `base_model`, `model-index`) and
a README that says how the model was configured, trained and evaluated."""

from __future__ import annotations

from importlib import resources

from huggingface_hub import EvalResult, ModelCard, ModelCardData

TEMPLATE = "model_card.md"


def create_model_card(
    model,
    repo_id: str,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    eval_results: list[dict] | None = None,
    training_text: str | None = None,
    evaluation_text: str | None = None,
    license: str | None = None,
    tags: list[str] | None = None,
) -> ModelCard:
    """A [`huggingface_hub.ModelCard`] for an [`HMTForCausalLM`] (save it with `card.save(path / "README.md")` or
    `card.push_to_hub(repo_id)`).

    Args:
        model: the HMT the card describes (its config and parameter counts fill the configuration table).
        repo_id: where the checkpoint lives (`user/name` or a local folder), used in the usage snippet.
        base_model: the backbone's Hub id (`config.text_config._name_or_path` when not given).
        datasets: Hub ids of the training data.
        eval_results: dicts with `dataset_name`, `metric_type` (e.g. "perplexity"), `metric_value`, and optionally
            `dataset_type` (defaults to the name), `dataset_split`, `dataset_config`, `metric_name`; they become the
            card's `model-index`. Say in `metric_name` how a number was measured (protocol, retrieval mode).
        training_text / evaluation_text: Markdown for the card's sections; the card says plainly when they are absent.
    """
    config = model.config
    base_model = base_model or getattr(config.text_config, "_name_or_path", None) or None
    overhead = model.memory_parameter_overhead()
    model_name = repo_id.rstrip("/").split("/")[-1]
    results = [
        EvalResult(
            task_type="text-generation",
            dataset_type=result.get("dataset_type", result["dataset_name"]),
            dataset_name=result["dataset_name"],
            dataset_split=result.get("dataset_split"),
            dataset_config=result.get("dataset_config"),
            metric_type=result["metric_type"],
            metric_value=result["metric_value"],
            metric_name=result.get("metric_name"),
        )
        for result in eval_results or []
    ]
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        base_model=base_model,
        datasets=datasets,
        license=license,
        tags=list(dict.fromkeys(["hmt", "long-context", "memory", "custom_code", *(tags or [])])),
        model_name=model_name,
        eval_results=results or None,
    )
    template = resources.files("hmt_hf").joinpath("templates", TEMPLATE).read_text(encoding="utf-8")
    return ModelCard.from_template(
        card_data,
        template_str=template,
        model_name=model_name,
        repo_id=repo_id,
        base_model=base_model or "a custom backbone",
        base_model_url=f"https://huggingface.co/{base_model}" if base_model else "#",
        backbone_type=config.text_config.model_type,
        backbone_parameters=f"{overhead['backbone_parameters']:,}",
        segment_length=config.segment_length,
        representation_length=config.representation_length,
        sensory_memory_size=config.sensory_memory_size,
        num_memory_embeddings=config.num_memory_embeddings,
        memory_search_dim=config.search_dim,
        use_memory_search=config.use_memory_search,
        use_sensory_memory=config.use_sensory_memory,
        retrieval_mode=config.retrieval_mode,
        attention_sink=config.attention_sink,
        normalize_memory=config.normalize_memory,
        memory_readout=config.memory_readout,
        memory_parameters=f"{overhead['memory_parameters']:,}",
        memory_percent=f"{overhead['overhead_percent']:.2f}",
        training_text=training_text or "Not documented: the memory parameters may be untrained.",
        evaluation_text=evaluation_text or "No evaluation recorded for this checkpoint.",
    )
