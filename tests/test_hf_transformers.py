"""Hugging Face import of configs as the `transformers` package writes them today (5.x):
each config is built with transformers' own config class and saved with save_pretrained,
so field renames (Qwen3MoeConfig's ``num_local_experts``, DeepseekV3Config's
``num_nextn_predict_layers``) are what a user's download holds. The imported spec must
equal the preset built from the published shapes; unknown model types are refused by name."""

import dataclasses

import pytest

from perfsim.errors import ConfigError
from perfsim.model.io import from_hf_config, load_model
from perfsim.model.spec import ModelSpec
from perfsim.system.specio import to_dict

transformers = pytest.importorskip("transformers")

# Published shapes (the models' config.json on the Hub), as constructor arguments.
CONFIGS = {
    "llama3.1-8b": ("LlamaConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_hidden_layers=32,
        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)),
    "mixtral-8x7b": ("MixtralConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_hidden_layers=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000)),
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_hidden_layers=48, num_experts=128, num_experts_per_tok=8,
        decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936, tie_word_embeddings=False)),
    "deepseek-v3": ("DeepseekV3Config", dict(
        hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_attention_heads=128,
        num_key_value_heads=128, num_hidden_layers=61, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, first_k_dense_replace=3, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280)),
    "olmoe-1b-7b": ("OlmoeConfig", dict(
        hidden_size=2048, intermediate_size=1024, num_attention_heads=16, num_key_value_heads=16,
        num_hidden_layers=16, num_experts=64, num_experts_per_tok=8, vocab_size=50304)),
}
EXCLUDED = {"name", "source"} | {f.name for f in dataclasses.fields(ModelSpec) if f.name.startswith("published_")}


def _structure(spec: ModelSpec) -> dict:
    return {k: v for k, v in to_dict(spec).items() if k not in EXCLUDED}


def _saved(tmp_path, name: str, cls: str, kwargs: dict):
    folder = tmp_path / name
    getattr(transformers, cls)(**kwargs).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_transformers_config_matches_the_preset(tmp_path, name):
    cls, kwargs = CONFIGS[name]
    imported, preset = load_model(_saved(tmp_path, name, cls, kwargs)), load_model(name)
    assert _structure(imported) == _structure(preset)
    assert imported.total_params() == preset.total_params()


def test_qwen3_moe_writes_num_local_experts_and_is_accepted(tmp_path):
    cls, kwargs = CONFIGS["qwen3-30b-a3b"]
    written = getattr(transformers, cls)(**kwargs).to_dict()
    assert written.get("num_local_experts") == 128  # the transformers 5.x name
    assert from_hf_config(written, "q").num_experts == 128


@pytest.mark.parametrize("name, layers, experts", [("gpt-oss-120b", 36, 128), ("gpt-oss-20b", 24, 32)])
def test_gpt_oss_config_imports_as_its_preset_with_alternating_sliding_windows(name, layers, experts):
    """transformers' GptOssConfig (num_local_experts, as Mixtral writes it) is GPT-OSS by its
    model_type: its layer_types (sliding, full, sliding, ...) become a 128-token window on every
    other layer, and the rest of the structure is the preset's."""
    config = transformers.GptOssConfig(num_hidden_layers=layers, num_local_experts=experts).to_dict()
    spec, preset = from_hf_config(config, name), load_model(name)
    assert (spec.sliding_window, spec.full_attention_every) == (128, 2)
    assert [spec.attention_window(i) for i in range(4)] == [128, 0, 128, 0]
    assert _structure(spec) == _structure(preset) and spec.total_params() == preset.total_params()


def test_unknown_model_type_is_refused_even_with_familiar_keys():
    config = transformers.Qwen3NextConfig().to_dict()
    with pytest.raises(ConfigError, match=r"model_type 'qwen3_next'"):
        from_hf_config(config, "next")


def test_layer_types_perfsim_cannot_model_are_refused_by_field():
    cls, kwargs = CONFIGS["llama3.1-8b"]
    config = getattr(transformers, cls)(**kwargs).to_dict()
    config |= {"layer_types": ["sliding_attention", "full_attention"] * 16, "sliding_window": 4096}
    assert from_hf_config(config, "x").full_attention_every == 2  # every other layer windowed: modelled
    for types, match in ((["chunked_attention", "full_attention"] * 16, r"'layer_types'.*'chunked_attention'"),
                         (["full_attention", "sliding_attention"] * 16, r"'layer_types' must list .* every N-th"),
                         (["sliding_attention"] * 31, r"'layer_types' must list one entry per layer")):
        with pytest.raises(ConfigError, match=match):
            from_hf_config({**config, "layer_types": types}, "x")
    with pytest.raises(ConfigError, match="'sliding_window'"):
        from_hf_config({**config, "sliding_window": 0}, "x")


def test_a_config_without_model_type_is_recognised_by_its_keys():
    cls, kwargs = CONFIGS["qwen3-30b-a3b"]
    config = getattr(transformers, cls)(**kwargs).to_dict()
    del config["model_type"]
    spec, preset = _structure(from_hf_config(config, "q")), _structure(load_model("qwen3-30b-a3b"))
    # the q/k norm is a property of the model type (Qwen3Attention), not of any config key
    assert spec.pop("qk_norm") is False and preset.pop("qk_norm") is True
    assert spec == preset


def test_qk_norm_follows_the_model_type():
    for name, expected in (("qwen3-30b-a3b", True), ("llama3.1-8b", False), ("mixtral-8x7b", False)):
        cls, kwargs = CONFIGS[name]
        assert from_hf_config(getattr(transformers, cls)(**kwargs).to_dict(), name).qk_norm is expected
        assert load_model(name).qk_norm is expected
