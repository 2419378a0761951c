"""Which shapes each suite sweeps: a generic grid, or the shapes a model's layers use.

From a model (public perfsim API only): every Linear of the attention, router and MLP /
expert blocks at T = mbs x seq tokens, forward (T x in -> out), dgrad (T x out -> in)
and wgrad (in x T -> out); the grouped expert GEMMs at T x top_k routed tokens, balanced,
skewed and with empty experts; causal GQA attention at the model's heads; and copy /
triad from 1 MiB to 1 GiB per array.
"""

import perfsim
from validation.cases import Case, attention_case, gemm_case, grouped_case, membound_case, memory_case
from validation.library import ATTENTION_BACKENDS

SUITES = ("gemm", "moe", "attention", "memory")
GRID_CUBES = (256, 512, 1024, 2048, 4096, 8192)
ODD_GEMMS = ((4095, 4097, 4096), (1000, 3000, 2000), (8192, 1, 4096), (129, 8192, 4096))


def gemm_grid(dtypes: tuple[str, ...], backend: str = "triton") -> list[Case]:
    cases = [gemm_case(c, c, c, dt, "cube", backend) for dt in dtypes for c in GRID_CUBES]
    return cases + [gemm_case(m, n, k, dt, "odd", backend) for dt in dtypes for m, n, k in ODD_GEMMS]


def model_linears(model) -> list:
    lins = list(model.attention_linears())
    if model.is_moe:
        lins += model.router_linears()
        if model.shared_ffn_hidden_size:
            lins += model.mlp_linears(model.shared_ffn_hidden_size, prefix="shared")
    if model.num_mlp_layers:
        lins += model.mlp_linears(model.ffn_hidden_size)
    return lins


def gemm_from_model(model, tokens: int, dtypes: tuple[str, ...], backend: str = "triton") -> list[Case]:
    cases = []
    for dt in dtypes:
        for lin in model_linears(model):
            i, o = lin.in_features, lin.out_features
            cases += [gemm_case(tokens, o, i, dt, f"{model.name} {lin.name} fwd", backend),
                      gemm_case(tokens, i, o, dt, f"{model.name} {lin.name} dgrad", backend),
                      gemm_case(i, o, tokens, dt, f"{model.name} {lin.name} wgrad", backend)]
    return cases


def skewed_counts(total: int, groups: int, empty: int = 0) -> list[int]:
    """Deterministic uneven split: weights 1/(rank+1) (Zipf s=1) over the non-empty groups,
    the last ``empty`` groups get no tokens; sums exactly to ``total``."""
    live = groups - empty
    weights = [1.0 / (r + 1) for r in range(live)]
    counts = [int(total * w / sum(weights)) for w in weights]
    counts[0] += total - sum(counts)
    return counts + [0] * empty


def moe_cases(num_experts: int, routed: int, hidden: int, width: int, gated: bool, dtype: str, tag: str,
              backend: str = "triton") -> list[Case]:
    up = width * (2 if gated else 1)
    cases = []
    splits = {"balanced": [routed // num_experts] * num_experts,
              "zipf": skewed_counts(routed, num_experts),
              "zipf+empty": skewed_counts(routed, num_experts, empty=max(1, num_experts // 4))}
    for name, counts in splits.items():
        cases.append(grouped_case(counts, up, hidden, dtype, f"{tag} expert_up {name}", backend))
        cases.append(grouped_case(counts, hidden, width, dtype, f"{tag} expert_down {name}", backend))
    return cases


TOKENS_PER_EXPERT = (16, 64, 256, 1024, 4096)


def moe_tokens_sweep(dtype: str, backend: str = "triton", experts: int = 64, hidden: int = 2048,
                     width: int = 1408) -> list[Case]:
    """Balanced grouped GEMMs of a fine-grained MoE layer (64 experts, DeepSeek-V2-Lite's
    widths) at 16 to 4,096 tokens per expert: how per-FLOP speed falls as experts starve."""
    cases = []
    directions = ("fwd", "bwd") if backend == "torch" else ("fwd",)  # the library's backward: dgrad + wgrad
    for tpe in TOKENS_PER_EXPERT:
        counts = [tpe] * experts
        for d in directions:
            cases.append(grouped_case(counts, 2 * width, hidden, dtype, f"tpe{tpe} expert_up balanced", backend, d))
            cases.append(grouped_case(counts, hidden, width, dtype, f"tpe{tpe} expert_down balanced", backend, d))
    return cases


MEMBOUND_SHAPES = {"fp8_cast": ((2048, 2048), (8192, 4096), (16384, 8192)), "permute": ((2048, 2048), (16384, 4096), (65536, 4096)),
                   "router": ((8192, 64), (65536, 128)), "topk": ((8192, 64), (65536, 128)),
                   "rmsnorm": ((2048, 2048), (8192, 4096), (16384, 8192)), "swiglu": ((2048, 4096), (8192, 28672))}


def membound_sweep() -> list[Case]:
    """The torch backend's memory-bound kernels of a step at a few LLM sizes (validation.library.MEMBOUND)."""
    return [membound_case(kernel, r, c) for kernel, sizes in MEMBOUND_SHAPES.items() for r, c in sizes]


def _sdpas(backend: str) -> tuple[str, ...]:
    """The SDPA kernels an attention case runs: each of the library's on the torch backend; the
    Triton backend has one flash kernel (the label is unused there)."""
    return ATTENTION_BACKENDS if backend == "torch" else ("flash",)


def attention_cases(heads: int, kv_heads: int, head_dim: int, tokens: int, seqs=(1024, 2048, 4096, 8192),
                    backend: str = "triton") -> list[Case]:
    """Causal GQA attention at ``tokens`` per batch; the torch backend once per SDPA kernel."""
    return [attention_case(max(1, tokens // s), heads, kv_heads, s, head_dim, direction, backend=backend, sdpa=sdpa)
            for s in seqs for direction in ("fwd", "bwd") for sdpa in _sdpas(backend)]


def memory_sweep(backend: str = "triton") -> list[Case]:
    return [memory_case(kernel, (1 << 20) * mib, backend) for kernel in ("copy", "triad") for mib in (1, 8, 64, 512, 1024)]


def build(suite: str, model_name: str | None, tokens: int, dtypes: tuple[str, ...], backend: str = "triton") -> list[Case]:
    """The cases of one suite, generic or for ``model_name``, on the Triton kernels or the libraries."""
    model = perfsim.load_model(model_name) if model_name else None
    if suite == "gemm":
        return gemm_from_model(model, tokens, dtypes, backend) if model else gemm_grid(dtypes, backend)
    if suite == "moe":
        if model and model.is_moe:
            routed = tokens * model.top_k
            return moe_cases(model.num_experts, routed, model.hidden_size, model.expert_ffn_hidden_size,
                             model.gated_mlp, dtypes[0], model.name, backend)
        return moe_cases(8, 2 * tokens, 4096, 14336, True, dtypes[0], "mixtral-like", backend) + \
            moe_tokens_sweep(dtypes[0], backend)
    if suite == "attention":
        if model and model.attention.value == "gqa":
            return attention_cases(model.num_heads, model.num_kv_heads, model.head_dim, tokens, backend=backend)
        return attention_cases(32, 8, 128, tokens, backend=backend) + \
            attention_cases(16, 16, 64, tokens, seqs=(2048, 8192), backend=backend)
    if suite == "memory":
        return memory_sweep(backend) + (membound_sweep() if backend == "torch" and not model else [])
    raise ValueError(f"suite {suite!r} is not one of {', '.join(SUITES)}")


def interpreter_cases(suite: str, backend: str = "triton") -> list[Case]:
    """Tiny shapes for a correctness pass without a GPU (Triton interpreter, or torch on the CPU)."""
    if suite == "gemm":
        return [gemm_case(37, 29, 53, dt, "odd", backend) for dt in ("bf16", "fp16", "fp8")] + \
            [gemm_case(32, 32, 32, "bf16", "cube", backend)]
    if suite == "moe":
        return moe_cases(4, 40, 32, 24, True, "bf16", "tiny", backend)
    if suite == "attention":
        return [attention_case(1, 4, 2, 33, 16, d, backend=backend, sdpa=b) for d in ("fwd", "bwd") for b in _sdpas(backend)]
    if suite == "memory":
        tiny = [membound_case(k, 64, 128) for k in ("fp8_cast", "permute", "router", "topk")] if backend == "torch" else []
        return [memory_case(k, 4 * 1000, backend) for k in ("copy", "triad")] + tiny
    raise ValueError(f"suite {suite!r} is not one of {', '.join(SUITES)}")
