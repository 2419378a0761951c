"""Input files for the fuzz corpus: binary and UTF-16 files, broken measurement logs,
model and profile files with one field mutated (written fresh under a temporary folder)."""

import json
import tomllib
from pathlib import Path

import tomli_w

from perfsim.system.hardware import dump_cluster, load_cluster

RCCL_HEADER = """# Collective test starting: all_reduce_perf
# nThread 1 nGpus 8 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
{ranks}#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""
RANKS = "".join(f"#  Rank {d:2d} Group  0 Pid  100 on  host0 device {d} [0000:0{d}:00] AMD Instinct MI300X\n"
                for d in range(8))


def rccl_row(size: int, time_us: str, bus: str = "1.00") -> str:
    return f"{size:>12} {size // 4:>12}     float     sum      -1 {time_us:>8} {bus:>7} {bus:>7}      0 {time_us:>8} {bus:>7} {bus:>7}      0\n"


def rccl_log(times: list[str], buses: list[str] | None = None, sizes: list[str] | None = None) -> str:
    buses = buses or ["1.00"] * len(times)
    rows = [rccl_row(1024 << i, t, b) for i, (t, b) in enumerate(zip(times, buses))]
    if sizes:
        rows = [r.replace(str(1024 << i), s, 1) for i, (r, s) in enumerate(zip(rows, sizes))]
    return RCCL_HEADER.format(ranks=RANKS) + "".join(rows)


GOOD_TIMES = ["20.00", "21.00", "23.00", "27.00", "35.00", "51.00"]
KERNEL_HEADER = "kind,dtype,m,n,k,time_us,device\n"

HF_LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
            "num_key_value_heads": 4, "intermediate_size": 4096, "vocab_size": 32000, "hidden_act": "silu"}
PRESET = {"name": "fuzz-dense", "source": "test", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
          "num_kv_heads": 4, "head_dim": 64, "ffn_hidden_size": 4096, "vocab_size": 32000}


# label -> (field, value, expected outcome, what the error must name)
HF_MUTATIONS = {
    "model_type_list": ("model_type", ["llama"], "error", "model_type"),
    "model_type_dict": ("model_type", {"a": 1}, "error", "model_type"),
    "heads_0": ("num_attention_heads", 0, "error", "num_attention_heads"),
    "layers_1e9": ("num_hidden_layers", 10 ** 9, "error", "num_layers"),
    "layers_1e30": ("num_hidden_layers", 10 ** 30, "error", "num_layers"),
    "hidden_4097": ("hidden_size", 4097, "error", "hidden_size"),
    "vocab_neg": ("vocab_size", -5, "error", "vocab_size"),
    "ffn_float": ("intermediate_size", 1.5, "error", "intermediate_size"),
    "tie_str": ("tie_word_embeddings", "32", "error", "tie_word_embeddings"),
    "act_list": ("hidden_act", ["silu"], "error", "hidden_act"),
    "kv_heads_3": ("num_key_value_heads", 3, "error", "num_kv_heads"),
    "layers_1e4": ("num_hidden_layers", 10_000, "any", ""),
    "layer_types_str": ("layer_types", "sliding_attention", "error", "layer_types"),
    "layer_types_short": ("layer_types", ["sliding_attention", "full_attention"], "error", "layer_types"),
    "layer_types_chunked": ("layer_types", ["chunked_attention"] * 4, "error", "chunked_attention"),
    "layer_types_no_window": ("layer_types", ["sliding_attention", "full_attention"] * 2, "error", "sliding_window"),
}
PRESET_MUTATIONS = {
    "shared_neg": ("num_shared_experts", -1, "error", "num_shared_experts"),
    "q_lora_neg": ("q_lora_rank", -1, "error", "q_lora_rank"),
    "rope_neg": ("qk_rope_head_dim", -1, "error", "qk_rope_head_dim"),
    "router_neg": ("router_hidden_size", -1, "error", "router_hidden_size"),
    "tied_str": ("tied_embeddings", "32", "error", "tied_embeddings"),
    "layers_1e6": ("num_layers", 10 ** 6, "error", "num_layers"),
    "layers_1e4": ("num_layers", 10_000, "any", ""),
    "experts_1": ("num_experts", 1, "error", "num_experts"),
    "head_dim_0": ("head_dim", 0, "error", "head_dim"),
    "cf_inf": ("capacity_factor", float("inf"), "error", "capacity_factor"),
    "cf_nan": ("capacity_factor", float("nan"), "error", "capacity_factor"),
    "name_int": ("name", 5, "error", "name"),
    "layers_float": ("num_layers", 4.0, "error", "num_layers"),
    "window_neg": ("sliding_window", -128, "error", "sliding_window"),
    "window_nan": ("sliding_window", float("nan"), "error", "sliding_window"),
    "window_huge": ("sliding_window", 10 ** 12, "any", ""),
    "full_every_alone": ("full_attention_every", 2, "error", "full_attention_every"),
}


def _deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def cluster_dict() -> dict:
    return tomllib.loads(dump_cluster(load_cluster("mi300x-pollara")))


STACKS = ("megatron-primus", "maxtext", "nemo", "torchtitan")  # the shipped profiles with every table set


def stack_dict(name: str) -> dict:
    """A shipped software-stack profile as the TOML a user would copy and edit."""
    from perfsim.system.stacks import STACK_DIR

    return tomllib.loads((STACK_DIR / f"{name}.toml").read_text(encoding="utf-8"))


def mutated_cluster(path: Path, dotted: str, value) -> Path:
    data = cluster_dict()
    *parents, key = dotted.split(".")
    table = data
    for p in parents:
        table = table[p]
    table[key] = value
    path.write_text(tomli_w.dumps(data))
    return path


def make_files(tmp: Path) -> dict[str, Path]:
    """Every named input the corpus refers to as ``{name}``."""
    f: dict[str, Path] = {}

    def put(name: str, content: str | bytes) -> None:
        path = tmp / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content, encoding="utf-8")
        f[name.replace(".", "_").replace("-", "_")] = path

    binary = bytes(range(256)) * 4
    put("binary.json", binary)
    put("binary.toml", binary)
    put("binary.csv", binary)
    put("binary.log", binary)
    put("utf16.toml", "name = 'x'\n".encode("utf-16"))
    put("good.json", json.dumps(HF_LLAMA))
    put("deep.json", _deep_json(100_000))
    put("deep_obj.json", '{"a":' * 5000 + "1" + "}" * 5000)
    for label, (key, value, _, _) in HF_MUTATIONS.items():
        put(f"hf_{label}.json", json.dumps(HF_LLAMA | {key: value}))
    for label, (key, value, _, _) in PRESET_MUTATIONS.items():
        put(f"preset_{label}.toml", tomli_w.dumps(PRESET | {key: value}))
    put("good.log", rccl_log(GOOD_TIMES))
    put("nan_time.log", rccl_log(["nan"] + GOOD_TIMES[1:], ["nan"] + ["1.00"] * 5))
    put("nan_times.log", rccl_log(["nan", "nan"] + GOOD_TIMES[2:], ["0"] * 6))
    put("inf_time.log", rccl_log(["inf"] + GOOD_TIMES[1:], ["inf"] + ["1.00"] * 5))
    put("tiny_times.log", rccl_log(["1e-300"] * 6, ["1e300"] * 6))
    put("unicode_size.log", rccl_log(GOOD_TIMES, sizes=["١٠٢٤"]))  # Arabic-Indic digits
    put("huge.log", rccl_log(GOOD_TIMES) + rccl_row(1024, "20.00") * 200_000)  # 200k rows: refused, not parsed
    info = "host0:100:100 [0] NCCL INFO NCCL_{} set by environment to {}\n"
    put("algo_bogus.log", info.format("ALGO", "Hypercube") + rccl_log(GOOD_TIMES))
    put("algo_conflict.log", info.format("ALGO", "Ring") + info.format("ALGO", "Tree") + rccl_log(GOOD_TIMES))
    put("algo_nvls.log", info.format("ALGO", "NVLS") + rccl_log(GOOD_TIMES))  # no NVSwitch on an MI300X node
    put("algo_nvlstree.log", info.format("ALGO", "NVLSTree") + rccl_log(GOOD_TIMES))  # nor NVLS across its nodes
    put("algo_list.log", info.format("ALGO", "ring,tree") + info.format("PROTO", "^LL128") + rccl_log(GOOD_TIMES))
    put("algo_ring.log", info.format("ALGO", "allreduce:Ring") + info.format("PROTO", "Simple") + rccl_log(GOOD_TIMES))
    put("kernels.csv", KERNEL_HEADER + "gemm,bf16,4096,4096,4096,200.0,MI300X\n")
    put("kernels_nan.csv", KERNEL_HEADER + "gemm,bf16,4096,4096,4096,nan,MI300X\n")
    put("histogram_binary.json", binary)
    put("histogram_nan.json", json.dumps([1.0, float("nan")]).replace("NaN", "NaN"))
    return f


def profile_files(tmp: Path) -> dict[str, Path]:
    """Cluster profiles with one value mutated (``{prof_<name>}``)."""
    cases = {
        "launch_inf": ("gpu.kernel_launch_us", float("inf")),
        "bf16_inf": ("gpu.peak_tflops.bf16", float("inf")),
        "bf16_nan": ("gpu.peak_tflops.bf16", float("nan")),
        "coll_latency_inf": ("collectives.launch_latency_us", float("inf")),
        "coll_latency_nan": ("collectives.launch_latency_us", float("nan")),
        "gpn_huge": ("node.gpus_per_node", 10 ** 9),
        "gpn_1000": ("node.gpus_per_node", 1000),
        "hbm_bw_inf": ("gpu.hbm_bw_GBps", float("inf")),
        "nic_inf": ("fabric.nic_bw_Gbps", float("inf")),
        "nodes_huge": ("num_nodes", 10 ** 12),
        "gpu_name_list": ("gpu.name", ["x"]),
        "group_short": ("node.group_gpus", [2, 4]),  # no group_link_efficiency beside it
        "group_eff_nan": ("node.group_link_efficiency", [float("nan")]),
    }
    out = {}
    for name, (dotted, value) in cases.items():
        out[f"prof_{name}"] = mutated_cluster(tmp / f"prof_{name}.toml", dotted, value)
    # the NaN efficiency beside a well-formed GPU count (both keys set)
    data = tomllib.loads(out["prof_group_eff_nan"].read_text())
    data["node"]["group_gpus"] = [2]
    out["prof_group_eff_nan"].write_text(tomli_w.dumps(data))
    return out
