"""Plan validation names the bad knob and its value; rank placement follows Megatron order."""

import re

import pytest
from conftest import tiny_dense, tiny_moe

from perfsim.errors import ConfigError
from perfsim.plan.parallel import (
    ParallelPlan,
    Recompute,
    Schedule,
    check_plan,
    derive_dp,
    group_shape,
    group_shapes,
)


def plan(**knobs) -> ParallelPlan:
    return ParallelPlan(**{"gbs": 64, "seq": 4096, **knobs})


def raises(match: str):
    return pytest.raises(ConfigError, match=match)


# ---- construction-time checks ---------------------------------------------------------


@pytest.mark.parametrize("key", ["tp", "pp", "vpp", "dp", "ep", "etp", "cp", "mbs", "gbs", "seq"])
@pytest.mark.parametrize("value", [0, -3, 1.5, True])
def test_non_positive_knob_names_key_and_value(key, value):
    with raises(rf"plan\.{key} .*{re.escape(repr(value))}"):
        plan(**{key: value})


@pytest.mark.parametrize("zero", [-1, 4, "1"])
def test_bad_zero_stage(zero):
    with raises(rf"plan\.zero .*{re.escape(repr(zero))}"):
        plan(zero=zero)


def test_bad_dtype():
    with raises(r"plan\.dtype .*'fp4'"):
        plan(dtype="fp4")


def test_bad_recompute():
    with raises(r"plan\.recompute .*'some'"):
        plan(recompute="some")


def test_bad_schedule():
    with raises(r"plan\.schedule .*'zb'"):
        plan(schedule="zb")


def test_strings_become_enums():
    p = plan(recompute="selective", schedule="gpipe")
    assert p.recompute is Recompute.SELECTIVE and p.schedule is Schedule.GPIPE


def test_gbs_not_divisible_by_mbs_times_dp():
    with raises(r"plan\.gbs \(100\).*mbs\*dp \(2\*8\)"):
        plan(gbs=100, mbs=2, dp=8)


def test_ep_etp_must_divide_stage_ranks():
    with raises(r"plan\.ep\*etp \(8\*1\).*tp\*cp\*dp \(2\*1\*2\)"):
        plan(tp=2, dp=2, ep=8)


def test_vpp_needs_pp():
    with raises(r"plan\.vpp \(2\) needs pp > 1"):
        plan(vpp=2)


def test_seq_must_split_over_cp():
    with raises(r"plan\.seq \(4098\).*2\*cp \(4\)"):
        plan(seq=4098, cp=2)


def test_derived_properties():
    p = plan(tp=2, pp=2, cp=2, dp=4, ep=4, mbs=2, gbs=64)
    assert p.world_size == 32
    assert p.edp == 2 * 2 * 4 // 4
    assert p.num_microbatches == 64 // (2 * 4)
    assert p.tokens_per_step == 64 * 4096


def test_to_dict_is_plain():
    d = plan(recompute="full").to_dict()
    assert d["recompute"] == "full" and type(d["recompute"]) is str
    assert set(d) >= {"tp", "pp", "vpp", "dp", "ep", "etp", "cp", "zero", "mbs", "gbs", "seq", "dtype", "schedule"}


# ---- model- and cluster-dependent checks ----------------------------------------------


def test_world_size_mismatch_names_product_and_count():
    with raises(r"tp\*pp\*cp\*dp = 2\*2\*1\*4 = 16 must equal the GPU count 32"):
        check_plan(plan(tp=2, pp=2, dp=4), tiny_dense(), 32)


def test_tp_must_divide_heads():
    with raises(r"plan\.tp \(3\).*heads \(16\)"):
        check_plan(plan(tp=3, gbs=66), tiny_dense(), 3)


def test_tp_and_kv_heads_must_nest():
    with raises(r"plan\.tp \(8\).*kv heads \(6\)"):
        check_plan(plan(tp=8), tiny_dense(num_heads=48, num_kv_heads=6), 8)


def test_ep_must_divide_experts():
    with raises(r"plan\.ep \(3\).*experts \(8\)"):
        check_plan(plan(dp=3, ep=3, gbs=63), tiny_moe(), 3)


def test_etp_must_divide_expert_ffn():
    with raises(r"plan\.etp \(3\).*expert_ffn_hidden_size \(2048\)"):
        check_plan(plan(dp=3, etp=3, gbs=63), tiny_moe(), 3)


def test_ep_on_dense_model():
    with raises(r"plan\.ep/etp \(2/1\).*tiny-dense is dense"):
        check_plan(plan(dp=2, ep=2), tiny_dense(), 2)


def test_pp_vpp_must_divide_layers():
    with raises(r"plan\.pp\*vpp \(2\*3\).*layers \(8\)"):
        check_plan(plan(pp=2, vpp=3), tiny_dense(), 2)
    with raises(r"plan\.pp\*vpp \(3\*1\).*layers \(8\)"):
        check_plan(plan(pp=3), tiny_dense(), 3)


def test_interleaved_needs_vpp():
    with raises(r"interleaved.*vpp > 1"):
        check_plan(plan(pp=2, schedule="interleaved"), tiny_dense(), 2)


def test_interleaving_needs_microbatches_divisible_by_pp():
    with raises(r"microbatches \(6\).*pp \(4\)"):
        check_plan(plan(pp=4, vpp=2, gbs=6), tiny_dense(), 4)


def test_valid_plans_pass():
    check_plan(plan(tp=4, pp=2, vpp=2, dp=2), tiny_dense(), 16)
    check_plan(plan(tp=2, cp=2, dp=4, ep=8, pp=2), tiny_moe(), 32)
    check_plan(plan(tp=2, dp=4, ep=2, etp=2, pp=2), tiny_moe(), 16)


# ---- derive_dp ---------------------------------------------------------------------------


def test_derive_dp():
    assert derive_dp(1024) == 1024
    assert derive_dp(64, tp=8, pp=4) == 2
    assert derive_dp(64, tp=2, pp=2, cp=4) == 4


def test_derive_dp_not_dividing():
    with raises(r"tp\*pp\*cp = 24 does not divide the GPU count 64"):
        derive_dp(64, tp=8, pp=3)


# ---- placement ------------------------------------------------------------------------


def shape(size, stride, per_node=8):
    s = group_shape(size, stride, per_node)
    return s.per_node, s.num_nodes


def test_group_shape_tp8_is_one_node():
    s = group_shape(8, 1, 8)
    assert (s.size, s.per_node, s.num_nodes, s.intra_only) == (8, 8, 1, True)


def test_group_shape_dp_stride_8_spans_nodes():
    s = group_shape(16, 8, 8)
    assert (s.per_node, s.num_nodes, s.intra_only) == (1, 16, False)


@pytest.mark.parametrize(
    "size, stride, expected",
    [
        (1, 1, (1, 1)),
        (2, 1, (2, 1)),
        (4, 2, (4, 1)),  # ranks 0,2,4,6
        (8, 2, (4, 2)),  # 4 per node over 2 nodes
        (1024, 1, (8, 128)),  # pure dp over 128 nodes
        (128, 8, (1, 128)),
        (4, 16, (1, 4)),
    ],
)
def test_group_shape_table(size, stride, expected):
    assert shape(size, stride) == expected


def test_group_shape_counts_every_rank():
    for size in (2, 4, 8, 16, 64):
        for stride in (1, 2, 4, 8, 16):
            s = group_shape(size, stride, 8)
            assert s.per_node * s.num_nodes >= size
            assert s.per_node * (s.num_nodes - 1) < size


def test_group_shapes_megatron_order():
    p = plan(tp=8, pp=4, dp=2, ep=2, gbs=64)
    shapes = group_shapes(p, 8)
    assert shapes["tp"].intra_only and shapes["tp"].size == 8
    assert shapes["dp"].num_nodes == 2 and shapes["dp"].per_node == 1
    assert shapes["pp"].num_nodes == 4 and shapes["pp"].per_node == 1
    assert shapes["ep"].size == 2 and shapes["ep"].intra_only  # ep carved from the tp ranks
    assert shapes["edp"].size == p.edp == 8


def test_group_shapes_tp2_cp2_dp_inside_node():
    shapes = group_shapes(plan(tp=2, cp=2, dp=2, gbs=64), 8)
    assert shapes["cp"].intra_only and shapes["cp"].size == 2
    assert shapes["dp"].intra_only and shapes["dp"].size == 2
    assert shapes["dp_cp"].size == 4 and shapes["dp_cp"].intra_only
