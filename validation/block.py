"""One transformer block (pre-norm, causal GQA attention, MoE or dense SwiGLU MLP),
forward + backward with the project's Triton kernels, measured on a GPU and compared
with ``perfsim.simulate`` of the same block on the same GPU's profile.

    python -m validation.block --model zaya1-base --cluster h200-ib --mbs 2 --seq 4096

The prediction is the sum of perfsim's layer-0 compute spans (forward + backward) of a
1-layer copy of the model on 1 GPU: the block alone, without embedding, LM head, loss
or optimizer. Routing is forced balanced (round-robin) in the timed run, which is what
perfsim's default uniform routing assumes; the router still runs.
"""

import argparse
import dataclasses
import sys
from types import SimpleNamespace

import perfsim
from validation.env import EnvironmentProblem, setup


def init_params(model, device, dtype, seed: int = 0) -> dict:
    """Weights [in, out] (as perfsim's Linear: y = x @ W), scaled 1/sqrt(in)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)

    def weight(*shape):
        w = torch.randn(shape, generator=gen, device=device) / shape[-2] ** 0.5
        return w.to(dtype).requires_grad_()
    h = model.hidden_size
    p = {lin.name: weight(lin.in_features, lin.out_features) for lin in model.attention_linears()}
    p["attn_norm"] = torch.ones(h, device=device, dtype=dtype, requires_grad=True)
    p["mlp_norm"] = torch.ones(h, device=device, dtype=dtype, requires_grad=True)
    if model.is_moe:
        p.update({lin.name: weight(lin.in_features, lin.out_features) for lin in model.router_linears()})
        up, down = model.mlp_linears(model.expert_ffn_hidden_size, prefix="expert")
        p["expert_up"] = weight(model.num_experts, up.in_features, up.out_features)
        p["expert_down"] = weight(model.num_experts, down.in_features, down.out_features)
        if model.shared_ffn_hidden_size:
            p.update({lin.name: weight(lin.in_features, lin.out_features)
                      for lin in model.mlp_linears(model.shared_ffn_hidden_size, prefix="shared")})
    else:
        p.update({lin.name: weight(lin.in_features, lin.out_features) for lin in model.mlp_linears(model.ffn_hidden_size)})
    return p


def torch_ops():
    """Reference implementations of the kernel ops in plain torch (for tests)."""
    import torch
    import torch.nn.functional as F

    def grouped(x, w, counts):
        parts = torch.split(x, counts.tolist())
        return torch.cat([xe @ w[e] for e, xe in enumerate(parts)]) if x.shape[0] else x.new_zeros(0, w.shape[2])

    def swiglu(h):
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    def rmsnorm(x, w, eps=1e-6):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return SimpleNamespace(linear=lambda x, w: x @ w, grouped_linear=grouped, swiglu=swiglu, rmsnorm=rmsnorm,
                           attention=attention)


def kernel_ops():
    from validation import ops
    return SimpleNamespace(linear=ops.linear, grouped_linear=ops.grouped_linear, swiglu=ops.swiglu,
                           rmsnorm=ops.rmsnorm, attention=ops.attention)


def _mlp(ops, p, x, prefix):
    return ops.linear(ops.swiglu(ops.linear(x, p[f"{prefix}_up"])), p[f"{prefix}_down"])


def _moe(model, ops, p, x, balanced: bool):
    import torch

    logits = x
    for lin in model.router_linears():
        logits = ops.linear(logits, p[lin.name])
    probs = torch.softmax(logits.float(), dim=-1)
    t, k, e = x.shape[0], model.top_k, model.num_experts
    weights, experts = torch.topk(probs, k, dim=-1)
    if balanced:  # token i's j-th choice -> expert (i*k + j) mod E: uniform loads
        experts = (torch.arange(t * k, device=x.device) % e).view(t, k)
        weights = probs.gather(1, experts)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.bincount(flat, minlength=e)
    up = ops.grouped_linear(x[token], p["expert_up"], counts)
    down = ops.grouped_linear(ops.swiglu(up), p["expert_down"], counts)
    gate = weights.reshape(-1)[order].to(down.dtype)[:, None]
    y = torch.zeros_like(x).index_add(0, token, down * gate)
    if model.shared_ffn_hidden_size:
        y = y + _mlp(ops, p, x, "shared")
    return y


def block_forward(model, ops, p, x, balanced: bool = False):
    """x [B, S, hidden] -> [B, S, hidden]."""
    b, s, h = x.shape
    heads, kv, d = model.num_heads, model.num_kv_heads, model.head_dim
    xf = x.reshape(b * s, h)
    qkv = ops.linear(ops.rmsnorm(xf, p["attn_norm"]), p["qkv"])
    q, k, v = qkv.split([heads * d, kv * d, kv * d], dim=-1)
    q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
    o = ops.attention(q, k, v).transpose(1, 2).reshape(b * s, heads * d)
    x2 = xf + ops.linear(o, p["attn_out"])
    hn = ops.rmsnorm(x2, p["mlp_norm"])
    y = _moe(model, ops, p, hn, balanced) if model.is_moe else _mlp(ops, p, hn, "mlp")
    return (x2 + y).view(b, s, h)


def one_layer(model):
    if model.attention.value != "gqa":
        raise EnvironmentProblem(f"model {model.name}: only GQA attention blocks are implemented (got {model.attention.value})")
    return dataclasses.replace(model, num_layers=1, num_dense_layers=0)


def predicted_block_s(model, cluster: str, mbs: int, seq: int) -> dict:
    """perfsim's layer-0 compute time (forward, backward) on one GPU of ``cluster``."""
    report = perfsim.simulate(one_layer(model), cluster, gpus=1, mbs=mbs, gbs=mbs, seq=seq, check_memory=False)
    out = {"F": 0.0, "B": 0.0}
    for span in report.spans:
        if span.layer == 0 and span.stream == "compute" and span.phase in out:
            out[span.phase] += span.end_s - span.start_s
    return out


def measure_block_s(model, mbs: int, seq: int, repeats: int) -> tuple[float, float]:
    """Median (forward, forward+backward) seconds of the block on the GPU."""
    import torch

    from validation.timing import time_fn

    p = init_params(model, "cuda", torch.bfloat16)
    x = torch.randn(mbs, seq, model.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    ops = kernel_ops()

    def fwd():
        with torch.no_grad():
            block_forward(model, ops, p, x, balanced=True)

    def fwd_bwd():
        block_forward(model, ops, p, x, balanced=True).backward(dy)
    return (time_fn(fwd, gpu=True, repeats=repeats).median_s, time_fn(fwd_bwd, gpu=True, repeats=repeats).median_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.block", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zaya1-base")
    ap.add_argument("--cluster", default="h200-ib", help="profile of the GPU the block runs on")
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    try:
        runtime = setup(require_gpu=True)
        model = perfsim.load_model(args.model)
        one_layer(model)
        setup_ok = runtime.device_name
    except (EnvironmentProblem, perfsim.PerfsimError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    predicted = predicted_block_s(model, args.cluster, args.mbs, args.seq)
    fwd_s, total_s = measure_block_s(model, args.mbs, args.seq, args.repeats)
    pred_total = predicted["F"] + predicted["B"]
    print(f"# {model.name} block, mbs {args.mbs} seq {args.seq}, on {setup_ok} vs perfsim profile {args.cluster}")
    for name, meas, pred in (("forward", fwd_s, predicted["F"]), ("backward", total_s - fwd_s, predicted["B"]),
                             ("fwd+bwd", total_s, pred_total)):
        print(f"{name:9s} measured {meas * 1e3:8.3f} ms  predicted {pred * 1e3:8.3f} ms  signed error {100 * (pred - meas) / meas:+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
