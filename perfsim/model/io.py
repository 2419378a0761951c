"""Model loading: TOML presets in ``perfsim/model/presets/`` and Hugging Face ``config.json`` import.

Recognised Hugging Face families (by ``model_type``, else by their distinctive keys):
Llama-style dense, Mixtral, Qwen2-MoE / Qwen3-MoE, DeepSeek V2 / V3, OLMoE and GPT-OSS (its
alternating sliding-window layers from ``layer_types``). Small tensors ModelSpec has no place
for (q/k norm weights, qkv biases, Qwen2-MoE's shared-expert gate, DeepSeek's router bias,
GPT-OSS's attention sinks and biases) are left out; they are < 0.05% of any preset.
"""

import logging
import tomllib
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from perfsim.errors import ConfigError
from perfsim.model.spec import AttentionKind, ModelSpec
from perfsim.system.specio import from_dict, load_json, read_text

log = logging.getLogger(__name__)

def _preset_files() -> dict[str, Any]:
    folder = resources.files("perfsim.model") / "presets"
    return {f.name.removesuffix(".toml"): f for f in folder.iterdir() if f.name.endswith(".toml")}


def list_models() -> list[str]:
    """Names of the bundled model presets, sorted."""
    return sorted(_preset_files())


_LOADED: dict[tuple, ModelSpec] = {}


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset name, a path to a preset ``.toml``, or a path to a Hugging Face config.json.
    An unchanged file is parsed once (ModelSpec is immutable)."""
    text = str(name_or_path)
    key = (text, _stat(_preset_files().get(text) or Path(text)))
    if key[1] is None:
        return _load_model(text)
    if key not in _LOADED:
        if len(_LOADED) > 64:
            _LOADED.clear()
        _LOADED[key] = _load_model(text)
    return _LOADED[key]


def _stat(path) -> tuple | None:
    try:
        st = Path(str(path)).stat()
    except (OSError, ValueError):
        return None
    return (st.st_mtime_ns, st.st_size)


def _load_model(text: str) -> ModelSpec:
    presets = _preset_files()
    if text in presets:
        return _spec_from_toml(presets[text].read_text(), f"preset {text}")
    path = Path(text)
    if path.suffix == ".toml":
        return _spec_from_toml(_read(path), str(path))
    if path.suffix == ".json" or path.is_dir():
        return _load_hf(path / "config.json" if path.is_dir() else path)
    raise ConfigError(f"unknown model {text!r}: not a preset name or a .toml/.json path (presets: {', '.join(sorted(presets))})")


def _read(path: Path) -> str:
    return read_text(path, "model file")


def _spec_from_toml(text: str, where: str) -> ModelSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML ({exc})") from None
    for key, value in data.items():  # counts and sizes: a negative one would shrink the model
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"{where}: {key} must be >= 0, got {value!r}")
    return from_dict(ModelSpec, data, where)


def _load_hf(path: Path) -> ModelSpec:
    config = load_json(_read(path), str(path))
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(config).__name__}")
    name = path.parent.name or path.stem
    try:
        return from_hf_config(config, name)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


# ---- Hugging Face config.json -> ModelSpec ------------------------------------------------


def _get(config: dict, key: str, default: Any = ..., kind: type = int) -> Any:
    """``config[key]`` checked to be of ``kind``; ``default`` when absent (or null)."""
    value = config.get(key)
    if value is None:
        if default is ...:
            raise ConfigError(f"missing required Hugging Face field {key!r}")
        return default
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise ConfigError(f"Hugging Face field {key!r} must be {kind.__name__}, got {value!r}")
    if kind is int and value < 0:
        raise ConfigError(f"Hugging Face field {key!r} must be >= 0, got {value!r}")
    return value


def _check_shape(config: dict) -> None:
    """Field types ``from_hf_config`` branches on, and a head_dim it can derive."""
    for key in ("model_type", "hidden_act"):
        if key in config and not isinstance(config[key], str):
            raise ConfigError(f"Hugging Face field {key!r} must be a string, got {config[key]!r}")
    kinds = config.get("layer_types")
    if kinds is not None and not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise ConfigError(f"Hugging Face field 'layer_types' must be a list of strings, got {kinds!r}")
    heads, hidden = _get(config, "num_attention_heads"), _get(config, "hidden_size")
    if heads < 1:
        raise ConfigError(f"Hugging Face field 'num_attention_heads' must be >= 1, got {heads!r}")
    if config.get("head_dim") is None and "kv_lora_rank" not in config and hidden % heads:
        raise ConfigError(f"Hugging Face field 'hidden_size' ({hidden}) is not divisible by num_attention_heads "
                          f"({heads}); give head_dim")


def _get_any(config: dict, keys: tuple[str, ...], default: Any = ..., kind: type = int) -> Any:
    """The first of ``keys`` present (transformers renamed some fields between releases:
    Qwen3MoeConfig writes ``num_local_experts`` where 4.x wrote ``num_experts``)."""
    for key in keys:
        if config.get(key) is not None:
            return _get(config, key, default, kind)
    if default is ...:
        raise ConfigError(f"missing required Hugging Face field {keys[0]!r} (or {', '.join(map(repr, keys[1:]))})")
    return default


NUM_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")


ATTENTION_LAYERS = ("full_attention", "sliding_attention")  # the layer_types ModelSpec models


def _attention_layers(config: dict) -> dict:
    """transformers lists each layer's attention (``layer_types``): full causal and sliding
    window layers, the full ones every N-th (``full_attention_every``) or none, are
    ModelSpec's ``sliding_window`` / ``full_attention_every``; other kinds or patterns are
    refused by field."""
    types = config.get("layer_types") or []
    if not isinstance(types, list):
        raise ConfigError(f"Hugging Face field 'layer_types' must be a list, got {types!r}")
    kinds = sorted({k for k in types if k not in ATTENTION_LAYERS}, key=str)
    if kinds:
        raise ConfigError(f"Hugging Face field 'layer_types' has {', '.join(map(repr, kinds))} layers; "
                          "perfsim models full causal and sliding-window attention only")
    if "sliding_attention" not in types:
        return {}
    full = [i for i, k in enumerate(types) if k == "full_attention"]
    every = full[0] + 1 if full else 0
    if len(types) != _get(config, "num_hidden_layers") or any(
            (k == "full_attention") != bool(every and (i + 1) % every == 0) for i, k in enumerate(types)):
        raise ConfigError("Hugging Face field 'layer_types' must list one entry per layer, a full-attention layer "
                          "every N-th and sliding-window layers between (or only sliding-window layers)")
    window = _get(config, "sliding_window")
    if window < 1:
        raise ConfigError(f"Hugging Face field 'sliding_window' must be a positive integer, got {window!r}")
    return {"sliding_window": window, "full_attention_every": every}


def _common(config: dict, name: str) -> dict:
    heads = _get(config, "num_attention_heads")
    hidden = _get(config, "hidden_size")
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swiglu"):
        raise ConfigError(f"Hugging Face field 'hidden_act' must be silu (gated MLP), got {act!r}")
    return {
        "name": name,
        "source": f"Hugging Face config.json ({config.get('model_type', 'unknown model_type')})",
        "num_layers": _get(config, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": _get(config, "num_key_value_heads", heads),
        "head_dim": _get(config, "head_dim", hidden // heads if hidden % heads == 0 else 0),
        "vocab_size": _get(config, "vocab_size"),
        "tied_embeddings": _get(config, "tie_word_embeddings", False, bool),
    }


def _llama(config: dict) -> dict:
    return {"ffn_hidden_size": _get(config, "intermediate_size")}


def _mixtral(config: dict) -> dict:
    return {
        "ffn_hidden_size": 0,
        "num_experts": _get_any(config, ("num_local_experts", "num_experts")),
        "top_k": _get(config, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _get(config, "intermediate_size"),
    }


def _olmoe(config: dict) -> dict:
    return {
        "ffn_hidden_size": 0,
        "num_experts": _get_any(config, NUM_EXPERTS),
        "top_k": _get(config, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _get(config, "intermediate_size"),
    }


def _qwen_moe(config: dict) -> dict:
    num_layers = _get(config, "num_hidden_layers")
    num_dense = _qwen_dense_prefix(config, num_layers)
    shared = _get(config, "shared_expert_intermediate_size", 0)
    return {
        "ffn_hidden_size": _get(config, "intermediate_size") if num_dense else 0,
        "num_experts": _get_any(config, NUM_EXPERTS),
        "top_k": _get(config, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _get(config, "moe_intermediate_size"),
        "num_shared_experts": 1 if shared else 0,
        "shared_expert_ffn_hidden_size": shared,
        "num_dense_layers": num_dense,
    }


def _qwen_dense_prefix(config: dict, num_layers: int) -> int:
    """Qwen-MoE layer i is MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    step = _get(config, "decoder_sparse_step", 1)
    mlp_only = config.get("mlp_only_layers") or []
    if step < 1 or not isinstance(mlp_only, list):
        raise ConfigError(f"Hugging Face fields decoder_sparse_step={step!r}, mlp_only_layers={mlp_only!r} are invalid")
    dense = [i for i in range(num_layers) if i in mlp_only or (i + 1) % step]
    if dense != list(range(len(dense))):
        raise ConfigError(
            f"Hugging Face dense layers {dense} (decoder_sparse_step={step}, mlp_only_layers={mlp_only}) "
            "are not a prefix of the stack; ModelSpec only models the first k layers as dense"
        )
    return len(dense)


def _deepseek(config: dict) -> dict:
    layer_freq = _get(config, "moe_layer_freq", 1)
    if layer_freq != 1:
        raise ConfigError(f"Hugging Face field 'moe_layer_freq' must be 1 (ModelSpec has no interleaved MoE), got {layer_freq!r}")
    heads = _get(config, "num_attention_heads")
    fields = {
        "num_kv_heads": heads,
        "head_dim": _get(config, "qk_nope_head_dim"),
        "ffn_hidden_size": _get(config, "intermediate_size"),
        "attention": AttentionKind.MLA,
        "q_lora_rank": _get(config, "q_lora_rank", 0),
        "kv_lora_rank": _get(config, "kv_lora_rank"),
        "qk_rope_head_dim": _get(config, "qk_rope_head_dim"),
        "v_head_dim": _get(config, "v_head_dim"),
    }
    if _get(config, "num_nextn_predict_layers", 0):
        log.info("ignoring the multi-token-prediction layers (not part of the main model's count)")
    if not _get(config, "n_routed_experts", 0):
        return fields
    return fields | {
        "num_experts": _get(config, "n_routed_experts"),
        "top_k": _get(config, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _get(config, "moe_intermediate_size"),
        "num_shared_experts": _get(config, "n_shared_experts", 0),
        "num_dense_layers": _get(config, "first_k_dense_replace", 0),
    } | _group_limit(config)


def _group_limit(config: dict) -> dict:
    """DeepSeek's group-limited routing (``topk_method`` group_limited_greedy in V2,
    noaux_tc in V3, the only one V3 has, so its default when the field is absent, as
    transformers' DeepseekV3Config writes it): experts from ``topk_group`` of ``n_group``
    groups; plain ``greedy`` (V2-Lite) has none."""
    method = config.get("topk_method") or ("noaux_tc" if config.get("model_type") == "deepseek_v3" else "greedy")
    groups, picked = _get(config, "n_group", 0) or 0, _get(config, "topk_group", 0) or 0
    if method not in ("group_limited_greedy", "noaux_tc") or groups <= 1 or picked >= groups:
        return {}
    return {"expert_groups": groups, "topk_groups": picked}


FAMILIES: dict[str, Callable[[dict], dict]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "mixtral": _mixtral,
    "gpt_oss": _mixtral,  # num_local_experts, num_experts_per_tok, intermediate_size per expert
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "olmoe": _olmoe,
}


# model types whose attention normalises q and k (RMSNorm) before rotary: HF Qwen3Attention
# (q_norm / k_norm over head_dim), OlmoeAttention (q_norm / k_norm over the q and k widths)
QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "olmoe"})


def _family(config: dict) -> Callable[[dict], dict]:
    """By ``model_type`` (an unknown one is an error naming it: gpt_oss is not Mixtral);
    only a config without ``model_type`` is recognised by its distinctive keys."""
    model_type = config.get("model_type")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if model_type is not None:
        raise ConfigError(f"unsupported model_type {model_type!r} (supported: {', '.join(sorted(FAMILIES))})")
    if "kv_lora_rank" in config:
        return _deepseek
    if "moe_intermediate_size" in config and any(k in config for k in NUM_EXPERTS):
        return _qwen_moe
    if "num_local_experts" in config:
        return _mixtral
    if "num_experts" in config:
        return _olmoe
    return _llama


def from_hf_config(config: dict, name: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` dict."""
    try:
        _check_shape(config)
        family = _family(config)
        attention = _attention_layers(config)
        qk_norm = {"qk_norm": True} if config.get("model_type") in QK_NORM_TYPES else {}
        return ModelSpec(**(_common(config, name) | family(config) | qk_norm | attention))
    except ConfigError as exc:
        raise ConfigError(f"Hugging Face config {name!r}: {exc}") from None
