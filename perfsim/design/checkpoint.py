"""Checkpoints: storage profiles, checkpoint size per plan, save/load/snapshot times,
and the cost of reshaping a checkpoint between two parallel plans.

A checkpoint holds bf16 weights plus fp32 master weights and Adam m, v (2 + 12 B per
parameter, Rajbhandari'20 ZeRO sec. 3, as ``sharding`` counts them). With ZeRO >= 1 each
rank saves the shard its optimizer owns (Megatron distributed checkpoint, fully parallel
save); with ZeRO 0 the replicas are deduplicated and the state spread evenly.
"""

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from perfsim import api
from perfsim.errors import ConfigError
from perfsim.system.hardware import PROFILE_DIR, ClusterSpec
from perfsim.system.specio import resolve_profile
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.sharding import OPTIMIZER_STATE_BYTES, WEIGHT_BYTES, local_optimizer_params
from perfsim.system.specio import check_positive, check_type, from_dict
from perfsim.units import GBps_to_Bps

STORAGE_DIR = PROFILE_DIR / "storage"
STATE_BYTES = WEIGHT_BYTES + OPTIMIZER_STATE_BYTES


@dataclass(frozen=True, kw_only=True)
class StorageSpec:
    """Checkpoint storage: per-node client bandwidth, capped by the system's aggregate."""

    name: str
    description: str
    source: str
    write_bw_per_node_GBps: float
    read_bw_per_node_GBps: float
    aggregate_write_bw_GBps: float
    aggregate_read_bw_GBps: float
    assumed: tuple[str, ...] = field(default_factory=tuple)  # keys that are assumptions, not sourced

    def __post_init__(self):
        check_positive("storage", write_bw_per_node_GBps=self.write_bw_per_node_GBps,
                       read_bw_per_node_GBps=self.read_bw_per_node_GBps,
                       aggregate_write_bw_GBps=self.aggregate_write_bw_GBps,
                       aggregate_read_bw_GBps=self.aggregate_read_bw_GBps)
        numeric = {"write_bw_per_node_GBps", "read_bw_per_node_GBps", "aggregate_write_bw_GBps", "aggregate_read_bw_GBps"}
        for key in self.assumed:
            if key not in numeric:
                raise ConfigError(f"storage.assumed: {key!r} is not a number key ({', '.join(sorted(numeric))})")

    def write_Bps(self, num_nodes: int) -> float:
        return GBps_to_Bps(min(num_nodes * self.write_bw_per_node_GBps, self.aggregate_write_bw_GBps))

    def read_Bps(self, num_nodes: int) -> float:
        return GBps_to_Bps(min(num_nodes * self.read_bw_per_node_GBps, self.aggregate_read_bw_GBps))


def list_storage() -> list[str]:
    return sorted(p.stem for p in STORAGE_DIR.glob("*.toml"))


def load_storage(name_or_path: "str | Path | StorageSpec") -> StorageSpec:
    """A storage profile by name (perfsim/hardware_profiles/storage/NAME.toml) or path; strict keys."""
    if isinstance(name_or_path, StorageSpec):
        return name_or_path
    if isinstance(name_or_path, bool) or not isinstance(name_or_path, str | os.PathLike) or not str(name_or_path):
        raise ConfigError(f"storage: expected a storage profile name, path or StorageSpec, got {name_or_path!r}")
    path = resolve_profile("storage", name_or_path, STORAGE_DIR)
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"storage: cannot read {str(path)!r} ({exc.strerror})") from None
    return from_dict(StorageSpec, data, str(path))


@dataclass(frozen=True, kw_only=True)
class CheckpointSize:
    total_bytes: float  # one copy of the full training state
    per_rank_bytes: float  # the largest shard one rank saves

    def as_dict(self) -> dict:
        return {"total_bytes": self.total_bytes, "per_rank_bytes": self.per_rank_bytes}


def checkpoint_size(model: ModelSpec, plan: ParallelPlan) -> CheckpointSize:
    total = model.total_params() * STATE_BYTES
    if plan.zero == 0:
        return CheckpointSize(total_bytes=total, per_rank_bytes=total / plan.world_size)
    shard = max(local_optimizer_params(model, plan, s) for s in range(plan.pp)) * STATE_BYTES
    return CheckpointSize(total_bytes=total, per_rank_bytes=shard)


def checkpoint_times(size: CheckpointSize, cluster: ClusterSpec, storage: StorageSpec) -> dict:
    """Seconds to write and read one checkpoint over all of ``cluster``'s nodes, and to
    snapshot a rank's shard to host memory over its PCIe link (the blocking part of an
    asynchronous save)."""
    return {
        "write_s": size.total_bytes / storage.write_Bps(cluster.num_nodes),
        "read_s": size.total_bytes / storage.read_Bps(cluster.num_nodes),
        "snapshot_s": size.per_rank_bytes / GBps_to_Bps(cluster.node.pcie_bw_GBps),
    }


def reshard(model: ModelSpec, cluster: ClusterSpec, source: ParallelPlan, target: ParallelPlan,
            storage: StorageSpec) -> dict:
    """Time and memory to convert a checkpoint from ``source``'s layout to ``target``'s,
    run on the target's GPUs. Offline: read every source shard (each rank an equal slice),
    redistribute with one all-to-all over the target ranks, write the target shards.
    On load: each target rank reads exactly the bytes of its new shard from the source
    files (resharding loaders, e.g. PyTorch DCP) -- no write, no exchange."""
    check_type("model", model, ModelSpec, "a ModelSpec (perfsim.load_model)")
    check_type("cluster", cluster, ClusterSpec, "a ClusterSpec (perfsim.load_cluster)")
    check_type("source", source, ParallelPlan, "a ParallelPlan (perfsim.make_plan)")
    check_type("target", target, ParallelPlan, "a ParallelPlan (perfsim.make_plan)")
    check_type("storage", storage, StorageSpec, "a StorageSpec (checkpoint.load_storage)")
    gpus = target.world_size
    nodes = math.ceil(gpus / cluster.gpus_per_node)
    cl = api.load_cluster(cluster, nodes=nodes)
    src, dst = checkpoint_size(model, source), checkpoint_size(model, target)
    slice_bytes = src.total_bytes / gpus
    read_s = src.total_bytes / storage.read_Bps(nodes)
    write_s = dst.total_bytes / storage.write_Bps(nodes)
    a2a_s = 0.0
    if gpus > 1:
        a2a_s = api.collective("all_to_all", slice_bytes, gpus, cl)["time_us"] * 1e-6
    loaded = dst.per_rank_bytes * gpus if target.zero >= 1 else dst.total_bytes
    return {
        "source_gpus": source.world_size, "target_gpus": gpus, "target_nodes": nodes,
        "checkpoint_bytes": src.total_bytes, "source_shard_bytes": src.per_rank_bytes,
        "target_shard_bytes": dst.per_rank_bytes, "read_s": read_s, "redistribute_s": a2a_s, "write_s": write_s,
        "offline_s": read_s + a2a_s + write_s, "on_load_s": loaded / storage.read_Bps(nodes),
        "peak_memory_per_rank_bytes": slice_bytes + dst.per_rank_bytes,  # a read slice + the new shard
    }
