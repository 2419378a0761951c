"""How fast perfsim simulates: wall time of the SimPy engine and of the closed-form
estimate on the reference runs (median of several repeats), through the public API.

    .venv/bin/python validation/bench_simulate.py [--repeat 5]
"""

import argparse
import statistics
import time

import perfsim

RUNS = {
    "zaya1-base, 128 nodes x 8 MI300X (1,024 GPUs), dp1024 zero1 gbs2048 seq4096": dict(
        model="zaya1-base", cluster="mi300x-pollara", nodes=128, dp=1024, zero=1, mbs=1, gbs=2048, seq=4096),
    "mixtral-8x22b, 8 nodes (64 GPUs), pp4 ep8 gbs256 seq4096": dict(
        model="mixtral-8x22b", cluster="mi300x-pollara", nodes=8, pp=4, ep=8, mbs=1, gbs=256, seq=4096),
}


def median_wall_s(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench(name: str, knobs: dict, repeat: int) -> None:
    knobs = dict(knobs)
    model, cluster = perfsim.load_model(knobs.pop("model")), perfsim.load_cluster(knobs.pop("cluster"))
    des_s, des = median_wall_s(lambda: perfsim.simulate(model, cluster, **knobs), repeat)
    ana_s, ana = median_wall_s(lambda: perfsim.estimate(model, cluster, **knobs), repeat)
    print(name)
    print(f"  engine (des)  {des_s * 1e3:9.1f} ms wall   step {des.step_time_s:.4f} s  MFU {des.mfu:.1%}  ops {len(des.spans)}")
    print(f"  analytic      {ana_s * 1e3:9.1f} ms wall   step {ana.step_time_s:.4f} s  MFU {ana.mfu:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per estimator; the median is shown")
    args = parser.parse_args()
    print(f"perfsim {perfsim.__version__}: median wall time of {args.repeat} runs (inputs loaded once)")
    for name, knobs in RUNS.items():
        bench(name, knobs, args.repeat)


if __name__ == "__main__":
    main()
