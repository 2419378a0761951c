"""Collective sweep with torch.distributed (NCCL on NVIDIA, RCCL on AMD via the same
'nccl' backend), written as rccl-tests / nccl-tests logs that ``perfsim calibrate
--rccl-log`` and ``perfsim.calibration.readers.read_rccl_log`` read.

    torchrun --nproc_per_node 8 -m validation.collective_sweep --op all_reduce --out logs/
    (multi-node: torchrun --nnodes N --node_rank R --rdzv_endpoint HOST:PORT ...)

Per size: warm-up, then ``--iters`` back-to-back calls timed together (CUDA events),
out-of-place and in-place; the time printed is the maximum over ranks of the mean per
call (rccl-tests prints one rank's view; the slowest rank is what a step waits for).
algbw = size / time; busbw = algbw x factor (rccl-tests doc/PERFORMANCE.md):
all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all (n-1)/n, broadcast 1.
``size`` is the whole buffer as rccl-tests counts it (all_gather: the gathered output).
The gloo backend works on CPU for testing the log format; its times are not GPU numbers.
"""

import argparse
import os
import socket
import sys
import time
from dataclasses import dataclass

BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
TYPE_NAMES = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}


@dataclass(frozen=True, kw_only=True)
class Point:
    size_bytes: int
    count: int
    oop_us: float
    ip_us: float


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    rank: int
    host: str
    device: int
    name: str
    pid: int = 0


def format_row(op: str, point: Point, ranks: int, dtype: str) -> str:
    """One data line in rccl-tests' column layout."""
    cols = [f"{point.size_bytes:>12}", f"{point.count:>13}", f"{TYPE_NAMES.get(dtype, dtype):>9}",
            f"{REDOP.get(op, 'none'):>7}", f"{0 if op == 'broadcast' else -1:>7}"]
    for us in (point.oop_us, point.ip_us):
        algbw = point.size_bytes / us / 1e3 if us > 0 else 0.0  # bytes/us -> GB/s (1e9 B/s)
        cols += [f"{us:>8.2f}", f"{algbw:>7.2f}", f"{algbw * BUSBW[op](ranks):>7.2f}", f"{0:>6}"]
    return " ".join(cols)


def format_log(op: str, points: list[Point], ranks: list[RankInfo], dtype: str, *, warmup: int, iters: int,
               graph: bool = False, note: str = "") -> str:
    """A whole rccl-tests style log: banner, device list, column header, rows, summary."""
    sizes = [p.size_bytes for p in points] or [0]
    lines = [f"# Collective test starting: {op}_perf",
             f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: 2(factor) warmup iters: "
             f"{warmup} iters: {iters} agg iters: 1 validation: 0 graph: {int(graph)}", "#", "# Using devices"]
    lines += [f"#  Rank {r.rank:>2} Group  0 Pid {r.pid:>6} on {r.host:>10} device {r.device:>2} [0000:00:00] {r.name}"
              for r in ranks]
    if note:
        lines.append(f"# source: {note}")
    lines += ["#", f"#{'out-of-place':>62}{'in-place':>34}",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    lines += [format_row(op, p, len(ranks), dtype) for p in points]
    big = [p for p in points if p.oop_us > 0]
    avg = sum(p.size_bytes / p.oop_us / 1e3 * BUSBW[op](len(ranks)) for p in big) / max(1, len(big))
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:.4f}", "#"]
    return "\n".join(lines) + "\n"


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, s = [], max(1, min_bytes)
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out


def _buffers(op: str, count: int, world: int, dtype, device):
    import torch

    per = max(1, count // world)
    if op in ("all_gather", "reduce_scatter"):
        small, big = torch.ones(per, dtype=dtype, device=device), torch.ones(per * world, dtype=dtype, device=device)
        return (small, big) if op == "all_gather" else (big, small)
    return torch.ones(count, dtype=dtype, device=device), torch.empty(count, dtype=dtype, device=device)


def _call(op: str, src, dst, in_place: bool):
    import torch.distributed as dist

    if op == "all_reduce":
        (dist.all_reduce(src) if in_place else (dst.copy_(src), dist.all_reduce(dst)))
    elif op == "all_gather":
        dist.all_gather_into_tensor(dst, src)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(dst, src)
    elif op == "all_to_all":
        dist.all_to_all_single(dst, src)
    elif op == "broadcast":
        dist.broadcast(src if in_place else dst, 0)


def time_op(op: str, size: int, dtype, device, warmup: int, iters: int, in_place: bool) -> float:
    """Mean seconds per call on this rank, the max over ranks."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    count = max(world, size // torch.tensor([], dtype=dtype).element_size())
    src, dst = _buffers(op, count, world, dtype, device)
    for _ in range(warmup):
        _call(op, src, dst, in_place)
    _sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        _call(op, src, dst, in_place)
    _sync(device)
    mean = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return mean.item()


def _sync(device):
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize()


def _rank_infos(device) -> list[RankInfo]:
    import torch
    import torch.distributed as dist

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (gloo)"
    mine = RankInfo(rank=dist.get_rank(), host=socket.gethostname(), device=device.index or 0, name=name, pid=os.getpid())
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def sweep(op: str, byte_sizes: list[int], dtype_name: str, warmup: int, iters: int) -> str | None:
    """Run the sweep on every rank; rank 0 gets the log text, the others None."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    if dist.get_backend() == "gloo":
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    ranks = _rank_infos(device)
    points = []
    for size in byte_sizes:
        count = max(len(ranks), size // torch.tensor([], dtype=dtype).element_size())
        oop = time_op(op, size, dtype, device, warmup, iters, in_place=False)
        ip = time_op(op, size, dtype, device, warmup, iters, in_place=True)
        points.append(Point(size_bytes=count * torch.tensor([], dtype=dtype).element_size(), count=count,
                            oop_us=oop * 1e6, ip_us=ip * 1e6))
    if dist.get_rank() != 0:
        return None
    note = f"validation/collective_sweep.py torch {torch.__version__} backend {dist.get_backend()}"
    return format_log(op, points, ranks, dtype_name, warmup=warmup, iters=iters, note=note)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.collective_sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=sorted(BUSBW), default="all_reduce")
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--dtype", choices=sorted(TYPE_NAMES), default="float32")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl", help="nccl = NCCL or RCCL; gloo = CPU, format tests only")
    ap.add_argument("--out", required=True, help="folder for <op>.log (rank 0 writes)")
    args = ap.parse_args(argv)
    if "WORLD_SIZE" not in os.environ:
        print("error: run under torchrun (e.g. torchrun --nproc_per_node 8 -m validation.collective_sweep ...)", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("error: validation needs torch: pip install -e '.[validation]'", file=sys.stderr)
        return 2
    if args.backend == "nccl" and not torch.cuda.is_available():
        print("error: no GPU: the nccl backend needs CUDA/ROCm devices (use --backend gloo to test the log format)", file=sys.stderr)
        return 2
    dist.init_process_group(args.backend)
    try:
        text = sweep(args.op, sizes(args.min_bytes, args.max_bytes), args.dtype, args.warmup, args.iters)
    finally:
        dist.destroy_process_group()
    if text is not None:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"{args.op}.log")
        with open(path + ".tmp", "w") as handle:
            handle.write(text)
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
