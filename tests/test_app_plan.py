"""Plan page what-ifs (issue 17.14): every `perfsim simulate` knob on the page and reaching
perfsim, knobs that no longer fit reset with a note when the model or node count changes,
parameter counts shown, and results as deltas against a pinned baseline."""

import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import perfsim
from perfsim.errors import ConfigError
from perfsim.plan.routing import RoutingSpec
from perfsim.plan.stragglers import VariabilitySpec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))

import baseline  # noqa: E402
import fmt  # noqa: E402
import inputs as planner_inputs  # noqa: E402


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFSIM_DB", str(tmp_path / "scenarios.db"))
    monkeypatch.setenv("PERFSIM_PROFILES", str(tmp_path / "profiles"))


def start() -> AppTest:
    at = AppTest.from_file(str(ROOT / "app" / "planner.py"), default_timeout=90).run()
    ok(at)
    return at


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def metric(at, label):
    return next(m for m in at.metric if m.label == label)


def test_every_fidelity_knob_reaches_perfsim():
    inputs = planner_inputs.normalize({
        "model": "mixtral-8x7b", "nodes": 2, "estimator": "analytic",
        "knobs": {"tp": 2, "ep": 4, "dp": 0, "gbs": 16, "seq": 2048},
        "routing": {"distribution": "zipf", "skew": 1.2, "placement": "speed"},
        "fidelity": {"tp_comm_overlap": True, "overlap_grad_reduce": False, "overlap_cu_share": 0.2,
                     "dma_offload": False, "grad_bucket_mb": 40.0, "capacity_factor": 1.25, "gpu_variability": 0.05,
                     "variability_seed": 3}})
    got = planner_inputs.simulate(inputs)
    model = perfsim.load_model("mixtral-8x7b")
    import dataclasses
    want = perfsim.estimate(dataclasses.replace(model, capacity_factor=1.25), "mi300x-pollara", nodes=2, tp=2, ep=4,
                            gbs=16, seq=2048, tp_comm_overlap=True, overlap_grad_reduce=False,
                            comm_compute_interference=0.2, grad_bucket_bytes=40_000_000, check_memory=False,
                            routing=RoutingSpec(distribution="zipf", skew=1.2, speed_aware=True),
                            variability=VariabilitySpec(cv=0.05, seed=3))
    assert got.step_time_s == want.step_time_s and got.plan["tp_comm_overlap"] and got.straggler_slowdown > 1
    plain = planner_inputs.simulate({**inputs, "fidelity": planner_inputs.default_inputs()["fidelity"]})
    assert plain.step_time_s != got.step_time_s


def test_tp_comm_overlap_toggle_changes_the_step():
    at = start()
    at.number_input(key="w.tp").set_value(8).run()
    at.number_input(key="w.dp").set_value(0).run()
    ok(at)
    before = metric(at, "Step time").value
    at.selectbox(key="w.tp_comm_overlap").set_value("on").run()
    ok(at)
    assert metric(at, "Step time").value != before
    assert at.session_state["inputs"]["fidelity"]["tp_comm_overlap"] is True


def test_ep_comm_overlap_knob_reaches_perfsim():
    inputs = planner_inputs.normalize({
        "model": "olmoe-1b-7b", "nodes": 2, "estimator": "analytic",
        "knobs": {"tp": 1, "pp": 2, "vpp": 2, "ep": 8, "dp": 0, "gbs": 32, "seq": 4096, "schedule": "interleaved"},
        "fidelity": {"ep_comm_overlap": True}})
    got = planner_inputs.simulate(inputs)
    want = perfsim.estimate("olmoe-1b-7b", "mi300x-pollara", nodes=2, tp=1, pp=2, vpp=2, ep=8, gbs=32, seq=4096,
                            schedule="interleaved", ep_comm_overlap=True, check_memory=False)
    assert got.plan["ep_comm_overlap"] is True and got.step_time_s == pytest.approx(want.step_time_s)
    serial = planner_inputs.simulate({**inputs, "fidelity": {"ep_comm_overlap": False}})
    assert serial.step_time_s > got.step_time_s


def test_the_planner_refuses_full_recompute_beside_the_ep_overlap_as_the_api_does():
    """Megatron-Core refuses the pair; the page gets the API's one-line reason, not a priced step."""
    inputs = planner_inputs.normalize({
        "model": "olmoe-1b-7b", "nodes": 2, "estimator": "analytic",
        "knobs": {"tp": 1, "pp": 2, "vpp": 2, "ep": 8, "dp": 0, "gbs": 32, "seq": 4096, "schedule": "interleaved",
                  "recompute": "full"},
        "fidelity": {"ep_comm_overlap": True}})
    with pytest.raises(ConfigError, match=r"plan\.ep_comm_overlap with full recompute"):
        planner_inputs.simulate(inputs)
    inputs["knobs"]["recompute"] = "selective"
    assert planner_inputs.simulate(inputs).plan["recompute"] == "selective"


def test_the_recompute_modules_widget_reprices_the_plan():
    """zaya1-base is MoE: naming moe_act beside selective recompute lowers the peak the page shows."""
    at = start()
    at.selectbox(key="w.recompute").set_value("selective").run()
    ok(at)
    before = metric(at, "Peak memory").value
    at.multiselect(key="w.recompute_modules").set_value(["core_attn", "moe_act"]).run()
    ok(at)
    assert at.session_state["inputs"]["fidelity"]["recompute_modules"] == ["core_attn", "moe_act"]
    assert metric(at, "Peak memory").value != before


def test_the_stack_overlap_policy_is_the_default_and_the_knobs_override_it():
    """maxtext's policy turns gradient-reduce overlap off unless the page sets it."""
    policy = planner_inputs.simulate(planner_inputs.normalize({"stack": "maxtext", "estimator": "analytic"}))
    assert policy.plan["overlap_grad_reduce"] is False
    forced = planner_inputs.normalize({"stack": "maxtext", "estimator": "analytic",
                                       "fidelity": {"overlap_grad_reduce": True}})
    assert planner_inputs.simulate(forced).plan["overlap_grad_reduce"] is True
    at = start()
    at.selectbox(key="w.stack").set_value("maxtext").run()
    ok(at)
    assert at.selectbox(key="w.overlap_grad_reduce").value == "stack's"
    at.selectbox(key="w.overlap_grad_reduce").set_value("on").run()
    ok(at)
    assert at.session_state["inputs"]["fidelity"]["overlap_grad_reduce"] is True


def test_changing_the_node_count_resets_dp_instead_of_failing():
    at = start()
    assert at.number_input(key="w.dp").value == 1024
    at.number_input(key="w.nodes").set_value(64).run()
    ok(at)  # without the reset: "tp*pp*cp*dp = 1*1*1*1024 must equal the GPU count 512"
    assert at.number_input(key="w.dp").value == 0
    assert any("dp 1024 -> auto" in i.value.replace("\\", "") for i in at.info)
    assert at.session_state["inputs"]["nodes"] == 64


def test_changing_to_a_dense_model_resets_expert_parallelism():
    at = start()
    at.number_input(key="w.ep").set_value(8).run()
    ok(at)
    at.selectbox(key="w.model").set_value("llama3.1-8b").run()
    ok(at)
    assert at.number_input(key="w.ep").value == 1 and any("ep 8 -> 1" in i.value.replace("\\", "") for i in at.info)


def test_refit_is_silent_when_everything_fits():
    knobs = {"tp": 2, "pp": 2, "vpp": 1, "dp": 4, "ep": 2, "etp": 1, "cp": 1}
    assert planner_inputs.refit(knobs, 16, 32, 8) == (knobs, [])
    new, notes = planner_inputs.refit(knobs, 16, 30, 8)  # 30 layers: pp 2 still splits; vpp 1
    assert new == knobs and not notes
    new, notes = planner_inputs.refit({**knobs, "pp": 4}, 16, 30, 8)
    assert new["pp"] == 1 and any("30 layers" in n for n in notes)


def test_parameter_counts_are_shown():
    at = start()
    spec = perfsim.load_model("zaya1-base")
    shown = next(c.value for c in at.sidebar.caption if "parameters" in c.value)
    assert fmt.params(spec.total_params(False)) in shown and fmt.params(spec.active_params(False)) in shown


def test_pinned_baseline_shows_deltas():
    at = start()
    before = planner_inputs.simulate(at.session_state["inputs"])
    next(b for b in at.button if b.label == "Pin as baseline").click().run()
    ok(at)
    at.number_input(key="w.gbs").set_value(4096).run()
    ok(at)
    after = planner_inputs.simulate(at.session_state["inputs"])
    step = metric(at, "Step time")
    assert step.delta == fmt.signed_percent(after.step_time_s / before.step_time_s - 1)
    table = next(d.value for d in at.dataframe if "change" in d.value.columns and "category" in d.value.columns)
    assert set(table["category"]) == set(before.breakdown) | set(after.breakdown)
    next(b for b in at.button if b.label == "Unpin").click().run()
    ok(at)
    assert metric(at, "Step time").delta in (None, "")


def test_baseline_rows():
    rows = baseline.breakdown_rows({"mlp": 1.0, "tp_comm": 0.5}, {"mlp": 1.5, "tp_comm": 0.5, "ep_a2a": 0.1})
    assert [r["category"] for r in rows] == ["mlp", "ep_a2a", "tp_comm"] and rows[0]["change"] == "500 ms"
    mem = baseline.memory_rows([{"total_bytes": 2e9, "weights_bytes": 1e9}], [{"total_bytes": 3e9, "weights_bytes": 1e9}])
    assert {r["part"]: r["change"] for r in mem} == {"weights": "+0 B", "total": "+1.00 GB"}


# ---- model and hardware editing (issue 17.15) ---------------------------------------------------

def test_editing_the_model_shape_simulates_the_edited_model():
    import dataclasses

    at = start()
    before = metric(at, "Step time").value
    at.number_input(key="w.me.zaya1-base.num_layers").set_value(20).run()
    ok(at)
    assert at.session_state["inputs"]["model_edit"] == {"num_layers": 20}
    edited = dataclasses.replace(perfsim.load_model("zaya1-base"), num_layers=20)
    direct = perfsim.simulate(edited, "mi300x-pollara", nodes=128, dp=1024, zero=1, mbs=1, gbs=2048, seq=4096,
                              check_memory=False)
    assert metric(at, "Step time").value == fmt.duration(direct.step_time_s) != before
    assert any("(edited)" in c.value for c in at.caption)


def test_an_impossible_shape_is_an_inline_error():
    at = start()
    at.number_input(key="w.me.zaya1-base.top_k").set_value(99).run()
    assert not at.exception
    assert at.error and "top_k" in at.error[0].value.replace("\\", "")


def test_editing_the_hardware_simulates_the_edited_cluster():
    at = start()
    at.number_input(key="w.hw.mi300x-pollara.hbm_capacity_GB").set_value(96.0).run()
    at.number_input(key="w.hw.mi300x-pollara.nic_bw_Gbps").set_value(800.0).run()
    ok(at)
    inputs = at.session_state["inputs"]
    assert inputs["hardware_edit"] == {"hbm_capacity_GB": 96.0, "nic_bw_Gbps": 800.0}
    spec = planner_inputs.cluster_spec(inputs)
    assert spec.gpu.hbm_capacity_GB == 96.0 and spec.fabric.nic_bw_Gbps == 800.0 and spec.num_gpus == 1024
    direct = perfsim.simulate("zaya1-base", spec, dp=1024, zero=1, mbs=1, gbs=2048, seq=4096, check_memory=False)
    assert metric(at, "Step time").value == fmt.duration(direct.step_time_s)
    # the edited "96 GB" is the vendor's binary figure: 96 GiB = 103.1 GB (no driver reserve on record for MI300X)
    assert spec.gpu.hbm_bytes == 96 * 2**30 - 16 * 2**20  # the edited capacity, less the profile's driver reserve
    assert f"free of {fmt.num_bytes(spec.gpu.hbm_bytes)}" in metric(at, "Peak memory").delta == \
        f"{fmt.num_bytes(spec.gpu.hbm_bytes - direct.peak_memory_bytes)} free of 103 GB"


def test_tflops_edit_scales_every_dtype():
    inputs = planner_inputs.normalize({"hardware_edit": {"dense_tflops": 2614.8}})
    base = perfsim.load_cluster("mi300x-pollara").gpu.peak_tflops
    got = planner_inputs.cluster_spec(inputs).gpu.peak_tflops
    assert got["bf16"] == pytest.approx(2614.8) and got["fp8"] == pytest.approx(2 * base["fp8"] * 2614.8 / (2 * base["bf16"]))


def test_the_stack_selector_reaches_perfsim():
    at = start()
    before = metric(at, "Step time").value
    at.selectbox(key="w.stack").set_value("megatron-primus").run()
    ok(at)
    assert at.session_state["inputs"]["stack"] == "megatron-primus"
    assert metric(at, "Step time").value != before
    got = planner_inputs.simulate(planner_inputs.normalize({"stack": "megatron-primus", "estimator": "analytic"}))
    assert got.stack == "megatron-primus"
    assert planner_inputs.simulate(planner_inputs.normalize({"estimator": "analytic"})).stack == "ideal"


def test_uneven_stages_and_recompute_layers_reach_perfsim():
    inputs = planner_inputs.normalize({
        "model": "llama3.1-8b", "nodes": 4, "estimator": "analytic",
        "knobs": {"tp": 2, "pp": 4, "dp": 0, "gbs": 64, "seq": 4096, "recompute": "full"},
        "fidelity": {"first_stage_layers": 6, "last_stage_layers": 6, "recompute_layers": 2}})
    got = planner_inputs.simulate(inputs)
    want = perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=4, tp=2, pp=4, gbs=64, seq=4096, recompute="full",
                            first_stage_layers=6, last_stage_layers=6, recompute_layers=2, check_memory=False)
    assert got.step_time_s == want.step_time_s
    assert (got.plan["first_stage_layers"], got.plan["last_stage_layers"], got.plan["recompute_layers"]) == (6, 6, 2)


def test_recompute_auto_reaches_perfsim_and_the_page_offers_it():
    knobs = {"tp": 8, "pp": 1, "dp": 0, "mbs": 2, "gbs": 16, "seq": 8192, "recompute": "auto"}
    inputs = planner_inputs.normalize({"model": "llama3.1-70b", "nodes": 1, "estimator": "analytic", "knobs": knobs})
    got = planner_inputs.simulate(inputs)
    want = perfsim.estimate("llama3.1-70b", "mi300x-pollara", nodes=1, tp=8, mbs=2, gbs=16, seq=8192, recompute="auto")
    assert (got.plan["recompute"], got.plan["recompute_layers"]) == (want.plan["recompute"], want.plan["recompute_layers"])
    assert got.plan["recompute"] == "full" and 0 < got.plan["recompute_layers"] < 80 and got.fits
    at = start()
    at.selectbox(key="w.recompute").set_value("auto").run()
    ok(at)
    assert at.session_state["inputs"]["knobs"]["recompute"] == "auto"


def test_recompute_op_reaches_perfsim_and_the_page_offers_it():
    """torchtitan's per-op checkpointing from the planner: the same step as the API's, and an MoE
    model with it shows the one-line reason instead of a result."""
    knobs = {"tp": 1, "pp": 1, "dp": 0, "mbs": 1, "gbs": 8, "seq": 8192, "zero": 3, "recompute": "op"}
    inputs = planner_inputs.normalize({"model": "llama3.1-8b", "nodes": 1, "estimator": "analytic", "knobs": knobs,
                                       "stack": "torchtitan"})
    got = planner_inputs.simulate(inputs)
    want = perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=1, mbs=1, gbs=8, seq=8192, zero=3, recompute="op",
                            stack="torchtitan", check_memory=False)
    assert got.plan["recompute"] == "op" and got.step_time_s == want.step_time_s
    at = start()
    at.selectbox(key="w.recompute").set_value("op").run()
    assert at.session_state["inputs"]["knobs"]["recompute"] == "op"
    assert any("recompute 'op'" in e.value for e in at.error)  # zaya1-base is MoE: refused with its reason


def test_plan_page_has_the_stage_and_recompute_layer_knobs():
    at = start()
    at.number_input(key="w.pp").set_value(4).run()
    at.number_input(key="w.dp").set_value(0).run()
    at.number_input(key="w.first_stage_layers").set_value(4).run()
    ok(at)
    assert at.session_state["inputs"]["fidelity"]["first_stage_layers"] == 4


def test_param_prefetch_knob_reaches_the_plan():
    """The Plan page's 'Prefetch param gathers' knob: off runs ZeRO gathers unprefetched."""
    off = planner_inputs.normalize({"estimator": "analytic", "fidelity": {"overlap_param_gather": False}})
    assert planner_inputs.simulate(off).plan["overlap_param_gather"] is False
    at = start()
    assert at.selectbox(key="w.overlap_param_gather").value == "stack's"
    at.selectbox(key="w.overlap_param_gather").set_value("off").run()
    ok(at)
    assert at.session_state["inputs"]["fidelity"]["overlap_param_gather"] is False
