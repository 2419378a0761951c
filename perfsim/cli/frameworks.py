"""``simulate --megatron-args "..."`` / ``--primus-config file.yaml``: a Megatron-LM or
Primus training configuration mapped onto the plan (perfsim.plan.megatron). What was used,
what perfsim cannot model and every unknown flag are listed on stderr; explicit perfsim
flags (--tp, --gbs, ...) win over mapped ones."""

import dataclasses
import sys
from pathlib import Path

from perfsim.errors import ConfigError
from perfsim.plan import megatron
from perfsim.system.specio import read_text


def add_arguments(p) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--megatron-args", metavar="ARGS",
                       help='Megatron-LM flags as one string: "--tensor-model-parallel-size 8 --micro-batch-size 1 ..." '
                            "(a single flag: --megatron-args=--sequence-parallel)")
    group.add_argument("--primus-config", metavar="YAML", help="Primus experiment YAML (modules.pre_trainer.overrides)")


def mapped(args) -> megatron.MegatronPlan | None:
    if args.megatron_args:
        plan = megatron.from_args(args.megatron_args)
    elif args.primus_config:
        try:
            text = read_text(Path(args.primus_config), "Primus config")
        except ConfigError as exc:
            raise ConfigError(f"--primus-config: {exc}") from None
        plan = megatron.from_primus_yaml(text)
    else:
        return None
    for line in plan.notes():
        print(f"perfsim: {'megatron' if args.megatron_args else 'primus'} {line}", file=sys.stderr)
    return plan


def apply(args, knobs: dict, model):
    """(knobs, model) with the framework's flags under the explicit ones."""
    plan = mapped(args)
    if plan is None:
        return knobs, model
    framework = plan.knobs_for(model.num_layers)
    if framework.get("shared_expert_overlap") and not model.has_shared_experts:
        # Megatron-Core checks the overlap only where there are shared experts, and ignores it otherwise
        del framework["shared_expert_overlap"]
        print(f"perfsim: {'megatron' if args.megatron_args else 'primus'} ignored --moe-shared-expert-overlap: "
              f"{model.name} has no shared experts (Megatron-Core ignores it there too)", file=sys.stderr)
    merged = {**framework, **knobs}
    factor = plan.model_overrides.get("capacity_factor")
    if factor is not None and args.capacity_factor is None:
        model = dataclasses.replace(model, capacity_factor=factor)
    return merged, model
