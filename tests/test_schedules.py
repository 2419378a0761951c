"""Pipeline schedules: every pass exactly once, backward after its forward, the
1F1B warm-up of Narayanan'21 (PipeDream-Flush), and a valid interleaved order."""

from collections import Counter

import pytest

from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.schedules import BWD, FWD, stage_layers, stage_order

CASES = [  # (pp, vpp, m, schedule)
    (1, 1, 1, "1f1b"),
    (1, 1, 4, "1f1b"),
    (2, 1, 1, "1f1b"),
    (4, 1, 2, "1f1b"),
    (4, 1, 8, "1f1b"),
    (8, 1, 32, "1f1b"),
    (4, 1, 8, "gpipe"),
    (2, 2, 4, "interleaved"),
    (4, 2, 8, "interleaved"),
    (4, 4, 16, "interleaved"),
    (8, 2, 8, "interleaved"),
]


def plan(pp, vpp, m, schedule) -> ParallelPlan:
    return ParallelPlan(pp=pp, vpp=vpp, gbs=m, mbs=1, dp=1, seq=1024, schedule=schedule)


@pytest.mark.parametrize("pp, vpp, m, schedule", CASES)
def test_every_pass_exactly_once(pp, vpp, m, schedule):
    p = plan(pp, vpp, m, schedule)
    expected = Counter((ph, mb, c) for ph in (FWD, BWD) for mb in range(m) for c in range(vpp))
    for stage in range(pp):
        assert Counter(stage_order(p, stage)) == expected


@pytest.mark.parametrize("pp, vpp, m, schedule", CASES)
def test_backward_after_its_forward(pp, vpp, m, schedule):
    p = plan(pp, vpp, m, schedule)
    for stage in range(pp):
        order = stage_order(p, stage)
        pos = {item: i for i, item in enumerate(order)}
        for mb in range(m):
            for c in range(vpp):
                assert pos[(FWD, mb, c)] < pos[(BWD, mb, c)]


def _warmup(order) -> int:
    return next(i for i, (ph, _, _) in enumerate(order) if ph == BWD)


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 2), (8, 32)])
def test_1f1b_warmup_count(pp, m):
    """Stage s runs pp-s-1 warm-up forwards, then alternates one forward, one backward."""
    p = plan(pp, 1, m, "1f1b")
    for stage in range(pp):
        order = stage_order(p, stage)
        warm = min(pp - stage - 1, m)
        assert _warmup(order) == min(warm + 1, m)
        steady = order[warm:warm + 2 * (m - warm)]
        assert [ph for ph, _, _ in steady] == [FWD, BWD] * (m - warm)
        assert all(ph == BWD for ph, _, _ in order[warm + 2 * (m - warm):])


def test_1f1b_in_flight_bounded_by_depth():
    """PipeDream-Flush holds at most pp - stage microbatches' activations."""
    pp, m = 4, 16
    p = plan(pp, 1, m, "1f1b")
    for stage in range(pp):
        live = peak = 0
        for ph, _, _ in stage_order(p, stage):
            live += 1 if ph == FWD else -1
            peak = max(peak, live)
        assert peak == pp - stage


def test_gpipe_all_forwards_first():
    order = stage_order(plan(4, 1, 8, "gpipe"), 1)
    assert [ph for ph, _, _ in order] == [FWD] * 8 + [BWD] * 8


def test_forwards_and_backwards_in_microbatch_order_1f1b():
    order = stage_order(plan(4, 1, 8, "1f1b"), 0)
    assert [mb for ph, mb, _ in order if ph == FWD] == list(range(8))
    assert [mb for ph, mb, _ in order if ph == BWD] == list(range(8))


@pytest.mark.parametrize("pp, vpp, m", [(2, 2, 4), (4, 2, 8), (4, 4, 16)])
def test_interleaved_megatron_warmup(pp, vpp, m):
    """Megatron: warm-up = (pp - stage - 1) * 2 + (vpp - 1) * pp forwards."""
    p = plan(pp, vpp, m, "interleaved")
    for stage in range(pp):
        order = stage_order(p, stage)
        assert _warmup(order) == min((pp - stage - 1) * 2 + (vpp - 1) * pp, m * vpp) + 1


@pytest.mark.parametrize("pp, vpp, m", [(2, 2, 4), (4, 2, 8), (4, 4, 16)])
def test_interleaved_chunks_forward_in_order(pp, vpp, m):
    """A microbatch's chunk c forward comes before its chunk c+1 forward on every stage,
    and backward runs the chunks in reverse."""
    p = plan(pp, vpp, m, "interleaved")
    for stage in range(pp):
        pos = {item: i for i, item in enumerate(stage_order(p, stage))}
        for mb in range(m):
            for c in range(vpp - 1):
                assert pos[(FWD, mb, c)] < pos[(FWD, mb, c + 1)]
                assert pos[(BWD, mb, c + 1)] < pos[(BWD, mb, c)]


def test_vpp_without_interleaved_schedule_still_interleaves():
    p = plan(2, 2, 4, "1f1b")
    assert Counter(c for _, _, c in stage_order(p, 0)) == {0: 8, 1: 8}


@pytest.mark.parametrize("layers, pp, vpp", [(8, 1, 1), (8, 2, 1), (8, 2, 2), (32, 4, 2), (40, 4, 1)])
def test_stage_layers_partition(layers, pp, vpp):
    held = [l for s in range(pp) for c in range(vpp) for l in stage_layers(layers, pp, vpp, s, c)]
    assert sorted(held) == list(range(layers))


def test_stage_layers_chunk_major_round_robin():
    # pp=2, vpp=2, 8 layers: virtual stages 0..3 hold 2 layers each; stage 0 holds vs 0 and 2
    assert list(stage_layers(8, 2, 2, 0, 0)) == [0, 1]
    assert list(stage_layers(8, 2, 2, 1, 0)) == [2, 3]
    assert list(stage_layers(8, 2, 2, 0, 1)) == [4, 5]
    assert list(stage_layers(8, 2, 2, 1, 1)) == [6, 7]
