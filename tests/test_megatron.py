"""Megatron-LM / Primus flags onto a perfsim plan (perfsim.plan.megatron, `simulate
--megatron-args` / `--primus-config`): each flag maps to the knob it names, Megatron's own
defaults apply, and no flag is dropped silently (issue 17.16)."""

import json

import pytest

import perfsim
from perfsim.cli import main
from perfsim.errors import ConfigError
from perfsim.plan import megatron

ARGS = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 "
        "--num-layers-per-virtual-pipeline-stage 5 --context-parallel-size 1 --micro-batch-size 1 "
        "--global-batch-size 256 --seq-length 4096 --sequence-parallel --use-distributed-optimizer "
        "--overlap-grad-reduce --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
        "--bf16 --lr 3e-4 --made-up-flag 3 --decoder-first-pipeline-num-layers 18 --account-for-loss-in-pipeline-split")


def test_flags_map_onto_the_knobs_they_name():
    plan = megatron.from_args(ARGS)
    assert plan.knobs == {"tp": 8, "pp": 4, "cp": 1, "mbs": 1, "gbs": 256, "seq": 4096, "sequence_parallel": True,
                          "zero": 1, "overlap_grad_reduce": True, "recompute": "full", "dtype": "bf16",
                          "tp_comm_overlap": False, "ep_comm_overlap": False, "shared_expert_overlap": False,
                          "overlap_param_gather": False,
                          "first_stage_layers": 18}
    assert megatron.from_args(ARGS + " --overlap-param-gather").knobs["overlap_param_gather"] is True
    assert megatron.from_args(ARGS + " --overlap-moe-expert-parallel-comm").knobs["ep_comm_overlap"] is True
    assert plan.knobs_for(80)["vpp"] == 4  # 80 layers / (pp 4 x 5 layers per chunk)


def test_no_flag_is_dropped_silently():
    plan = megatron.from_args(ARGS)
    assert plan.unknown == ("made_up_flag",)
    assert {name for name, _ in plan.not_modelled} == {"recompute_num_layers", "account_for_loss_in_pipeline_split"}
    assert plan.ignored == ("lr",)
    notes = "\n".join(plan.notes())
    assert "--made-up-flag" in notes and "--account-for-loss-in-pipeline-split" in notes and "uneven" in notes


def test_torch_fsdp2_is_reported_not_priced_as_zero1():
    """Megatron's FSDP2 path gathers per pass but accumulates unsharded gradients: no ZeRO
    stage of perfsim's, so it is named with what to set instead of being dropped."""
    plan = megatron.from_args("--global-batch-size 8 --seq-length 1024 --use-torch-fsdp2")
    assert "use_torch_fsdp2" not in plan.ignored
    reasons = dict(plan.not_modelled)
    assert "--zero 3" in reasons["use_torch_fsdp2"] and "--zero3-gather once" in reasons["use_torch_fsdp2"]


def test_block_recompute_maps_onto_recompute_layers():
    plan = megatron.from_args("--pipeline-model-parallel-size 4 --global-batch-size 8 --seq-length 1024 "
                              "--recompute-granularity full --recompute-method block --recompute-num-layers 2")
    assert plan.knobs["recompute"] == "full" and plan.knobs["recompute_layers"] == 2 and not plan.not_modelled


def test_megatron_defaults_not_perfsims():
    """Without the switches Megatron runs without SP, grad-reduce overlap or a distributed optimizer."""
    plan = megatron.from_args("--tensor-model-parallel-size 2 --global-batch-size 8 --seq-length 1024")
    assert (plan.knobs["sequence_parallel"], plan.knobs["overlap_grad_reduce"], plan.knobs["zero"]) == (False, False, 0)


@pytest.mark.parametrize("text, field", [
    ("--tensor-model-parallel-size eight", "--tensor-model-parallel-size"),
    ("--micro-batch-size 0", "--micro-batch-size"),
    ("--recompute-granularity some", "--recompute-granularity"),
    ("--virtual-pipeline-model-parallel-size 2", "--virtual-pipeline-model-parallel-size"),
    ("--seq-length 'unclosed", "--megatron-args"),
])
def test_bad_values_name_the_flag(text, field):
    with pytest.raises(ConfigError, match=field):
        megatron.from_args(text)


@pytest.mark.parametrize("text, knobs, notes", [
    # the flex dispatcher's DeepEP backend (its default; --moe-enable-deepep is Megatron-Core's old name) at its SMs
    ("--moe-token-dispatcher-type flex --moe-enable-deepep --moe-deepep-num-sms 24",
     {"dispatch": "deepep", "dispatch_compute_units": 24}, ()),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep", {"dispatch": "deepep"}, ()),
    ("--moe-enable-deepep", {"dispatch": "deepep"}, ()),
    ("--moe-token-dispatcher-type alltoall --moe-deepep-num-sms 24", {"dispatch": "alltoall"},
     ("ignored (no effect on step time here): --moe-deepep-num-sms",)),
    # HybridEP (Megatron-Bridge's H100 Qwen3-30B-A3B preset from 26.04) at the cluster's DeepEP table;
    # DeepEP's SM count is not HybridEP's
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-deepep-num-sms 24",
     {"dispatch": "deepep"},
     ("not modelled: --moe-flex-dispatcher-backend (HybridEP has no bandwidth table of its own; priced by the "
      "cluster's DeepEP table", "ignored (no effect on step time here): --moe-deepep-num-sms")),
    ("--moe-token-dispatcher-type allgather", {"dispatch": "alltoall"},
     ("not modelled: --moe-token-dispatcher-type (the allgather dispatcher",)),
])
def test_the_token_dispatcher_flags_pick_the_dispatch(text, knobs, notes):
    plan = megatron.from_args(text)
    assert {k: v for k, v in plan.knobs.items() if k.startswith("dispatch")} == knobs
    lines = plan.notes()
    for note in notes:
        assert any(line.startswith(note) for line in lines), lines
    assert not plan.unknown


@pytest.mark.parametrize("text, field", [("--moe-token-dispatcher-type ring", "--moe-token-dispatcher-type"),
                                         ("--moe-token-dispatcher-type flex --moe-deepep-num-sms 0",
                                          "--moe-deepep-num-sms"),
                                         ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend nccl",
                                          "--moe-flex-dispatcher-backend: expected deepep, hybridep, got 'nccl'")])
def test_bad_dispatcher_values_name_the_flag(text, field):
    with pytest.raises(ConfigError, match=field):
        megatron.from_args(text)


def test_vpp_layers_must_divide_the_model():
    with pytest.raises(ConfigError, match="num-layers-per-virtual-pipeline-stage 7"):
        megatron.from_args("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 7").knobs_for(80)


PRIMUS = """\
work_group: ${TEAM:amd}
exp_name: llama_exp
modules:
  pre_trainer:
    framework: megatron
    config: pre_trainer.yaml
    model: llama3.1_8B.yaml
    overrides:
      tensor_model_parallel_size: ${PRIMUS_TP:2}
      pipeline_model_parallel_size: 1
      expert_model_parallel_size: 1
      micro_batch_size: 2
      global_batch_size: 64
      seq_length: 2048
      sequence_parallel: true
      use_distributed_optimizer: true
      overlap_grad_reduce: true
      moe_expert_capacity_factor: 1.25
      wandb_project: perfsim
      mystery_knob: 1
"""


def test_primus_experiment_yaml_with_env_defaults(monkeypatch):
    pytest.importorskip("yaml")
    monkeypatch.delenv("PRIMUS_TP", raising=False)
    plan = megatron.from_primus_yaml(PRIMUS)
    assert (plan.knobs["tp"], plan.knobs["mbs"], plan.knobs["gbs"], plan.knobs["zero"]) == (2, 2, 64, 1)
    assert plan.model_overrides == {"capacity_factor": 1.25} and plan.unknown == ("mystery_knob",)
    monkeypatch.setenv("PRIMUS_TP", "4")
    assert megatron.from_primus_yaml(PRIMUS).knobs["tp"] == 4


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_megatron_args_give_the_same_step_as_the_perfsim_flags(capsys):
    base = ["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--engine", "analytic", "--json"]
    code, out, err = _run([*base, "--megatron-args", "--tensor-model-parallel-size 2 --micro-batch-size 2 "
                           "--global-batch-size 64 --seq-length 2048 --sequence-parallel --use-distributed-optimizer "
                           "--overlap-grad-reduce --bf16 --whatever 1"], capsys)
    assert code == 0 and "--whatever" in err
    mapped = json.loads(out)
    direct = perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=1, tp=2, mbs=2, gbs=64, seq=2048, zero=1,
                              overlap_param_gather=False)  # Megatron-Core's default without --overlap-param-gather
    assert mapped["step_time_s"] == direct.step_time_s and mapped["plan"]["tp"] == 2
    code, out, _ = _run([*base, "--tp", "4", "--megatron-args", "--tensor-model-parallel-size 2 "
                         "--global-batch-size 64 --seq-length 2048"], capsys)
    assert code == 0 and json.loads(out)["plan"]["tp"] == 4  # an explicit perfsim flag wins


def test_cli_primus_config_file_and_its_errors(tmp_path, capsys):
    pytest.importorskip("yaml")
    path = tmp_path / "exp.yaml"
    path.write_text(PRIMUS)
    base = ["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--engine", "analytic", "--json"]
    code, out, err = _run([*base, "--primus-config", str(path)], capsys)
    assert code == 0 and json.loads(out)["plan"]["tp"] == 2 and "mystery_knob" in err.replace("-", "_")
    code, _, err = _run([*base, "--primus-config", str(tmp_path / "none.yaml")], capsys)
    assert code == 2 and "--primus-config" in err and len(err.strip().splitlines()) == 1
    path.write_text("modules: [unclosed")
    code, _, err = _run([*base, "--primus-config", str(path)], capsys)
    assert code == 2 and "invalid YAML" in err


@pytest.mark.parametrize("flags, schedule, vpp", [
    ("--patch-zero-bubble", "zb-h1", None),
    ("--patch-zero-bubble --zero-bubble-v-schedule", "v-half", 2),  # Primus' default memory setup
    ("--patch-zero-bubble --zero-bubble-v-schedule --zero-bubble-v-schedule-mem-setup zb", "zbv", 2),
    ("--zero-bubble-v-schedule --zero-bubble-v-schedule-mem-setup min --num-virtual-stages-per-pipeline-rank 2",
     "v-min", 2),
])
def test_primus_zero_bubble_flags_pick_the_schedule(flags, schedule, vpp):
    plan = megatron.from_args("--pipeline-model-parallel-size 4 " + flags)
    assert plan.knobs["schedule"] == schedule and plan.knobs.get("vpp") == vpp and not plan.unknown


def test_primus_v_schedule_runs_and_bad_mem_setup_names_the_flag():
    plan = megatron.from_args("--pipeline-model-parallel-size 8 --zero-bubble-v-schedule --micro-batch-size 1 "
                              "--global-batch-size 16 --seq-length 2048 --zero-bubble-v-schedule-mem-setup zb")
    report = perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=1, **plan.knobs_for(32))
    assert report.step_time_s > 0 and report.plan["schedule"] == "zbv" and report.plan["vpp"] == 2
    with pytest.raises(ConfigError, match="--zero-bubble-v-schedule-mem-setup: expected zb, half or min"):
        megatron.from_args("--zero-bubble-v-schedule-mem-setup quarter")
