"""How fast perfsim simulates: wall time of the SimPy engine and of the closed-form
estimate on the reference runs (median of several repeats), through the public API,
with the figures measured before the closed form was merged (commit 1721bd4) beside.

    .venv/bin/python validation/bench_simulate.py [--repeat 5]

``estimate`` warm: the same plan again, profiles given by name (the targets: <= 2 ms);
cold: a model and cluster the process has not seen (<= 10 ms).
"""

import argparse
import dataclasses
import statistics
import time

import perfsim

# median wall ms on the project's 2-core CI-class machine before the merge (commit 1721bd4,
# the graph-lowering closed form), measured with this script's method; for the before/after.
BEFORE_MS = {"llama3.1-70b tp8 dp8 estimate": 50.2, "llama3.1-70b tp8 dp8 simulate": 2011.0,
             "zaya1 estimate": 21.2, "zaya1 simulate": 39.7}
SEVENTY_B = dict(tp=8, dp=8, gbs=256, seq=8192)

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


def bench_estimate(repeat: int) -> None:
    """Warm and cold closed-form estimates of Llama-3.1-70B tp8 dp8 gbs256 seq8192 on 64 MI300X."""
    warm_s, report = median_wall_s(lambda: perfsim.estimate("llama3.1-70b", "mi300x-pollara", nodes=8, **SEVENTY_B),
                                   repeat)
    colds = []
    for i in range(repeat):  # a renamed model and a rebuilt cluster: nothing memoised applies
        model = dataclasses.replace(perfsim.load_model("llama3.1-70b"), name=f"cold-{i}")
        cluster = dataclasses.replace(perfsim.load_cluster("mi300x-pollara", nodes=8))
        colds.append(median_wall_s(lambda: perfsim.estimate(model, cluster, **SEVENTY_B), 1)[0])
    des_s, des = median_wall_s(lambda: perfsim.simulate("llama3.1-70b", "mi300x-pollara", nodes=8, **SEVENTY_B),
                               max(1, repeat // 2))
    print("llama3.1-70b, 8 nodes (64 GPUs), tp8 dp8 gbs256 seq8192")
    print(f"  estimate warm {warm_s * 1e3:9.2f} ms wall   (before: {BEFORE_MS['llama3.1-70b tp8 dp8 estimate']} ms)"
          f"   step {report.step_time_s:.4f} s")
    print(f"  estimate cold {statistics.median(colds) * 1e3:9.2f} ms wall")
    print(f"  engine (des)  {des_s * 1e3:9.1f} ms wall   (before: {BEFORE_MS['llama3.1-70b tp8 dp8 simulate']} ms)"
          f"   step {des.step_time_s:.4f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per estimator; the median is shown")
    args = parser.parse_args()
    print(f"perfsim {perfsim.__version__}: median wall time of {args.repeat} runs (inputs loaded once)")
    for name, knobs in RUNS.items():
        bench(name, knobs, args.repeat)
    print(f"  (before, zaya1: estimate {BEFORE_MS['zaya1 estimate']} ms, engine {BEFORE_MS['zaya1 simulate']} ms)")
    bench_estimate(args.repeat)


if __name__ == "__main__":
    main()
