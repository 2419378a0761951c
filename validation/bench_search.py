"""How fast the plan search runs (a benchmark, not a unit test), through the public API.

For each reference run it prints two figures:
  * the closed-form ranking rate: plans that divide and fit, pruned and costed per
    CPU-second of one core (``executor='serial'``, no lower-bound cut, no engine runs);
  * the whole search as a user runs it: default executor (a process pool over the
    machine's cores), lower-bound cut on, the leaders confirmed on the engine.

    .venv/bin/python validation/bench_search.py [--only zaya1|deepseek] [--workers N]
"""

import argparse
import os
import time

import perfsim

RUNS = {
    "zaya1": ("ZAYA1-base on 1,024 MI300X (gbs 2048 x seq 4096)",
              dict(model="zaya1-base", gpus=1024, gbs=2048, seq=4096)),
    "deepseek": ("DeepSeek-V3 (671B MoE) on 2,048 MI300X (gbs 4096 x seq 4096)",
                 dict(model="deepseek-v3", gpus=2048, gbs=4096, seq=4096)),
}


def bench(title: str, knobs: dict, workers: int | None) -> None:
    knobs = dict(knobs)
    model = perfsim.load_model(knobs.pop("model"))
    t0 = time.perf_counter()  # first, while every cache is cold (the pool's workers start empty)
    full = perfsim.search(model, "mi300x-pollara", workers=workers, **knobs)
    wall = time.perf_counter() - t0
    rate = perfsim.search(model, "mi300x-pollara", executor="serial", confirm=0, bound=False, **knobs)
    win = full.rows[0]
    print(title)
    print(f"  enumerated {rate.enumerated:,}; divide {rate.valid:,}; divide and fit {rate.costed:,} "
          f"({rate.sweep_cpu_s:.1f} CPU-s on 1 core, cold caches)")
    print(f"  analytic ranking: {rate.valid_per_s_per_core:,.0f} valid plans/s/core (memory-checked, costed when "
          f"they fit); {rate.plans_per_s_per_core:,.0f} costed plans/s/core")
    print(f"  full search  {wall:.1f} s wall on {full.executor} ({full.workers} workers): sweep {full.sweep_wall_s:.1f} s, "
          f"engine confirmation {full.confirm_wall_s:.1f} s")
    print(f"  winner {perfsim.plan.parallel.ParallelPlan(**win.plan).describe()} {win.plan['schedule']}: "
          f"{win.tokens_per_s_per_gpu:,.0f} tok/s/GPU, MFU {win.mfu:.1%} ({win.estimator})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(RUNS), help="run one reference search")
    parser.add_argument("--workers", type=int, help="pool size for the full search (default: all cores)")
    args = parser.parse_args()
    print(f"perfsim {perfsim.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for key, (title, knobs) in RUNS.items():
        if args.only in (None, key):
            bench(title, knobs, args.workers)


if __name__ == "__main__":
    main()
