"""Hypothesis strategies, one per input surface: CLI argument lists, API argument values,
Hugging Face config.json dicts, cluster profile dicts and rccl-tests / kernel CSV text."""

import math

from hypothesis import strategies as st

from fuzz_inputs import GOOD_TIMES, HF_LLAMA, STACKS, cluster_dict, rccl_log, stack_dict

# numbers where validation goes wrong: zero, negatives, huge, NaN, inf, fractions, tiny
EDGE_INTS = st.sampled_from([0, 1, 2, 3, 7, 8, 16, -1, -8, 2 ** 31, 10 ** 20])
EDGE_FLOATS = st.sampled_from([0.0, -0.0, 1e-300, 0.5, 1.0, 1.0000001, 2.0, 1e30, -1.0, math.nan, math.inf, -math.inf])
NUMBER_TEXT = st.one_of(EDGE_INTS.map(str), EDGE_FLOATS.map(repr), st.sampled_from(["", "x", "1e", "٣", "0x10", "8M", "1T"]))
JSON_SCALARS = st.one_of(st.none(), st.booleans(), EDGE_INTS, EDGE_FLOATS.filter(math.isfinite),
                         st.text(max_size=6))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                           max_leaves=6)
ANY_VALUE = st.one_of(JSON_VALUES, EDGE_FLOATS, st.just(object()))

SIM_FLAGS = ("--tp", "--pp", "--vpp", "--dp", "--ep", "--etp", "--cp", "--zero", "--mbs", "--gbs", "--seq",
             "--nodes", "--gpus", "--seed", "--capacity-factor", "--gpu-variability", "--overlap-cu-share",
             "--routing-skew", "--routing-concentration", "--grad-bucket-size", "--dispatch-compute-units",
             "--pipeline-flushes")
SIM_CHOICES = {"--dtype": ["bf16", "fp8", "fp32", ""], "--recompute": ["none", "full", "x"],
               "--schedule": ["1f1b", "gpipe", "interleaved", "zb-h1", "?"],
               "--fp8-recipe": ["delayed", "current", "mxfp8", ""],
               "--first-stage-layers": ["1", "0", "40", "-1", "x"],
               "--routing": ["uniform", "blocked", "blocked:2", "zipf", "zipf:1.5", "zipf:nan", "dirichlet:0.3",
                             "dirichlet:-1", "nope"],
               "--model": ["llama3.1-8b", "olmoe-1b-7b", "mixtral-8x7b", "deepseek-v2-lite", "gpt-oss-20b", "nope"],
               "--recompute-modules": ["mla_up_proj", "shared_experts", "moe_act,layernorm", "mla_up_proj,mlp",
                                       "core_attn,core_attn", ",", "nope"],
               "--cluster": ["mi300x-pollara", "h100-ib", "nope"],
               "--dispatch": ["alltoall", "deepep", "mori", "nope"]}


@st.composite
def simulate_argv(draw) -> list[str]:
    """``perfsim simulate`` with a few numeric flags set to edge values (closed form: fast)."""
    argv = ["simulate", "--model", draw(st.sampled_from(SIM_CHOICES["--model"])), "--engine", "analytic",
            "--gbs", draw(st.sampled_from(["8", "16", "64", "8", "0", "-8", "1e3", "99999999999999999999"])),
            "--seq", draw(st.sampled_from(["1024", "2048", "1024", "0", "nan"]))]
    argv += ["--nodes", draw(st.sampled_from(["1", "1", "2", "0", "1e20"]))]
    for flag in draw(st.lists(st.sampled_from(SIM_FLAGS), max_size=3, unique=True)):
        argv += [flag, draw(st.one_of(st.sampled_from(["1", "2", "4", "8", "0.1"]), NUMBER_TEXT))]
    for flag in draw(st.lists(st.sampled_from(sorted(set(SIM_CHOICES) - {"--model"})), max_size=2, unique=True)):
        argv += [flag, draw(st.sampled_from(SIM_CHOICES[flag]))]
    return argv + draw(st.sampled_from([[], [], ["--shared-expert-overlap"]]))


MEGATRON_FLAGS = ("tensor-model-parallel-size", "pipeline-model-parallel-size", "micro-batch-size",
                  "global-batch-size", "seq-length", "moe-expert-capacity-factor", "ddp-bucket-size",
                  "num-layers-per-virtual-pipeline-stage", "context-parallel-size", "expert-model-parallel-size",
                  "fp8-recipe", "account-for-loss-in-pipeline-split", "fp8-param-gather",
                  "moe-token-dispatcher-type", "moe-deepep-num-sms", "recompute-modules")


@st.composite
def command_argv(draw) -> list[str]:
    """collective, sizing, goodput, search and moe-width with edge values in their flags."""
    kind = draw(st.sampled_from(["collective", "sizing", "goodput", "search", "moe-width", "megatron"]))
    value = lambda: draw(NUMBER_TEXT)  # noqa: E731
    if kind == "megatron":
        flags = draw(st.lists(st.sampled_from(MEGATRON_FLAGS), min_size=1, max_size=3, unique=True))
        text = " ".join(f"--{f} {value()}" for f in flags)
        return ["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--gbs", "8", "--seq", "1024", "--engine",
                "analytic", "--megatron-args", text]
    if kind == "collective":
        return ["collective", "--op", draw(st.sampled_from(["all_reduce", "all_to_all", "x"])), "--gpus",
                draw(st.sampled_from(["8", "16", "0", value()])), "-b", draw(st.sampled_from(["8", "1M", value()])),
                "-e", draw(st.sampled_from(["64M", value()])), "-f", draw(st.sampled_from(["2", "4", value()]))]
    if kind == "sizing":
        flag = draw(st.sampled_from(["--align", "--window", "--min-gain", "--seq", "--mbs", "--tp", "--ep", "--nodes"]))
        return ["sizing", "--model", draw(st.sampled_from(["llama3.1-8b", "olmoe-1b-7b"])), flag, value()]
    if kind == "goodput":
        flag = draw(st.sampled_from(["--restart-s", "--interval-s", "--run-days", "--mtbf-gpu-hours", "--seed",
                                     "--gbs", "--nodes"]))
        mc = draw(st.sampled_from([[], ["--monte-carlo", "5"], ["--monte-carlo", value()]]))
        return ["goodput", "--model", "llama3.1-8b", "--engine", "analytic", "--nodes", "2", "--mtbf-node-hours",
                draw(st.sampled_from(["100", "0.5", value()])), flag, value(), *mc]
    if kind == "search":
        flag = draw(st.sampled_from(["--max-tp", "--max-pp", "--max-mbs", "--top", "--max-memory", "--usd-per-gpu-hour",
                                     "--tp", "--zero"]))
        switches = draw(st.lists(st.sampled_from(["--no-overlap", "--no-param-prefetch", "--no-clip-grad",
                                                  "--dispatch-fp8", "--fp8-recipe=current", "--fp8-params",
                                                  "--shared-expert-overlap"]),
                                  max_size=2, unique=True))
        dtype = draw(st.sampled_from([[], ["--dtype", "fp8"]]))
        return ["search", "--model", "llama3.1-8b", "--gpus", draw(st.sampled_from(["8", "4-8", "8,x", "0-8", "9-3"])),
                "--gbs", "16", "--seq", "1024", "--executor", "serial", "--confirm", "0", flag, value(), *switches, *dtype]
    flag = draw(st.sampled_from(["--active-params", "--total-params", "--batch", "--context", "--align", "--experts"]))
    return ["moe-width", "--active-params", "1e9", "--experts", "8", "--top-k", "2", flag, value()]


@st.composite
def hf_config(draw) -> dict:
    """The small Llama config with one or two fields replaced or added."""
    config = dict(HF_LLAMA)
    keys = sorted(config) + ["head_dim", "num_local_experts", "num_experts", "num_experts_per_tok",
                             "moe_intermediate_size", "kv_lora_rank", "n_shared_experts", "layer_types"]
    for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=2, unique=True)):
        config[key] = draw(st.one_of(JSON_VALUES, EDGE_INTS))
    return config


def _leaves(table: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        out += _leaves(value, path) if isinstance(value, dict) else [path]
    return out


CLUSTER_LEAVES = _leaves(cluster_dict())


@st.composite
def cluster_mutation(draw) -> tuple[str, object]:
    """(dotted key, value) for one leaf of the self-contained mi300x-pollara profile."""
    return draw(st.sampled_from(CLUSTER_LEAVES)), draw(st.one_of(EDGE_FLOATS, EDGE_INTS, JSON_VALUES))


STACK_LEAVES = {name: _leaves(stack_dict(name)) for name in STACKS}
DELETE = object()  # a mutation that removes the key


@st.composite
def stack_mutation(draw) -> tuple[str, str, object]:
    """(shipped stack, dotted key, value) for one leaf of a software-stack profile; the value
    may be DELETE (the key left out), an edge number, a JSON value or an unknown key's."""
    name = draw(st.sampled_from(STACKS))
    key = draw(st.one_of(st.sampled_from(STACK_LEAVES[name]), st.sampled_from(["overlap.nope", "nope", "fp8.x"])))
    value = draw(st.one_of(st.just(DELETE), st.booleans(), EDGE_FLOATS, EDGE_INTS, JSON_VALUES,
                           st.sampled_from(["", "deepep", "capacity", "dropless", "per-pass", "none", "aiter_v3"])))
    return name, key, value


@st.composite
def rccl_text(draw) -> str:
    """An rccl-tests log whose time and busbw cells are edge values."""
    cells = st.one_of(st.sampled_from(GOOD_TIMES), EDGE_FLOATS.map(lambda v: f"{v:.6g}"), st.sampled_from(["nan", "-", "N/A"]))
    times = draw(st.lists(cells, min_size=1, max_size=6))
    buses = draw(st.lists(cells, min_size=len(times), max_size=len(times)))
    sizes = draw(st.one_of(st.none(), st.lists(st.sampled_from(["1024", "-5", "٣٤", "1e3", "0"]),
                                               min_size=1, max_size=len(times))))
    return rccl_log(times, buses, sizes)


@st.composite
def kernel_csv_text(draw) -> str:
    """A kernel CSV whose shape and time cells are edge numbers, and whose kind, groups,
    direction and pricing label are drawn from valid and invalid values together (a grouped
    row timed forward and backward as a training step, a forward-only label on a backward
    row, ...)."""
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        m, n, k = (draw(NUMBER_TEXT.filter(lambda t: "," not in t)) if draw(st.booleans()) else "4096" for _ in range(3))
        time_us = draw(NUMBER_TEXT.filter(lambda t: "," not in t)) if draw(st.booleans()) else "200.0"
        kind = draw(st.sampled_from(["gemm", "grouped_gemm", "attention", "x"]))
        batch = draw(st.sampled_from(["", "8", "128", "0", "-1", "x"]))
        direction = draw(st.sampled_from(["", "fwd", "bwd", "fwd_bwd", "both"]))
        label = draw(st.sampled_from(["", "sum_loss", "moe_mlp", "moe_stage", "cast", "zz"]))
        rows.append(f"{kind},bf16,{m},{n},{k},{batch},{direction},{label},{time_us},MI300X\n")
    return "kind,dtype,m,n,k,batch,direction,kernel,time_us,device\n" + "".join(rows)
