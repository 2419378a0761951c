"""Hypothesis over every input surface: the CLI's flags, the API's arguments, Hugging Face
config.json files, cluster profiles and measurement files. CI runs a few derandomized
examples of each (seeded: the same cases every run); ``pytest -m fuzz`` runs many."""

import json
import tempfile
import uuid
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import perfsim
from fuzz_harness import GOOD, record, run_api, run_cli
from fuzz_inputs import cluster_dict, stack_dict
from fuzz_strategies import (ANY_VALUE, DELETE, cluster_mutation, command_argv, hf_config, kernel_csv_text, rccl_text,
                             simulate_argv, stack_mutation)

FOLDER = Path(tempfile.mkdtemp(prefix="perfsim-fuzz-"))
QUICK = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LONG = settings(max_examples=1000, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _file(text: str, suffix: str) -> Path:
    path = FOLDER / f"{uuid.uuid4().hex}{suffix}"
    path.write_text(text, encoding="utf-8")
    return path


def _assert_good(surface: str, result, what) -> None:
    record(surface, result)
    assert result.outcome in GOOD, f"{what}\n{result}"


def check_simulate(argv):
    _assert_good("hyp.cli.simulate", run_cli(argv), " ".join(argv))


def check_command(argv):
    _assert_good(f"hyp.cli.{argv[0]}", run_cli(argv), " ".join(argv))


API_ARGS = ("model", "cluster", "nodes", "gbs", "seq", "tp", "pp", "mbs", "zero", "dtype", "recompute", "routing",
            "variability", "check_memory", "gpus", "cp", "ep", "recompute_modules", "shared_expert_overlap",
            "mtp_layers", "pipeline_flushes")


def check_api(arg, value):
    kwargs = dict(model="llama3.1-8b", cluster="mi300x-pollara", nodes=1, gbs=8, seq=512) | {arg: value}
    _assert_good("hyp.api.estimate", run_api(lambda: perfsim.estimate(**kwargs)), f"estimate({arg}={value!r})")


def check_hf(config):
    path = _file(json.dumps(config), ".json")

    def load_and_estimate():
        model = perfsim.load_model(str(path))
        return perfsim.estimate(model, "mi300x-pollara", nodes=1, gbs=8, seq=512, check_memory=False)

    _assert_good("hyp.model.hf", run_api(load_and_estimate), json.dumps(config)[:300])


def _mutated_toml(data: dict, key: str, value) -> Path | None:
    """``data`` with leaf ``key`` (dotted) set to ``value``, or removed where ``value`` is
    DELETE, written to a fresh TOML file; None where TOML cannot hold it."""
    *parents, leaf = key.split(".")
    table = data
    for p in parents:
        table = table.setdefault(p, {}) if isinstance(table, dict) else None
    if not isinstance(table, dict):
        return None
    if value is DELETE:
        table.pop(leaf, None)
    else:
        table[leaf] = value
    try:
        return _file(tomli_w.dumps(data), ".toml")
    except (TypeError, ValueError):
        return None  # not expressible in TOML


def check_profile(mutation):
    key, value = mutation
    path = _mutated_toml(cluster_dict(), key, value)
    if path is not None:
        call = lambda: perfsim.estimate("llama3.1-8b", str(path), nodes=1, gbs=8, seq=512)  # noqa: E731
        _assert_good("hyp.profile", run_api(call), f"{key} = {value!r}")


def check_stack(mutation):
    """A shipped stack profile with one leaf changed, removed or added, priced on an FP8
    dense plan with TP and ZeRO (every stack table in play) and an MoE plan with EP."""
    name, key, value = mutation
    path = _mutated_toml(stack_dict(name), key, value)
    if path is None:
        return
    for kwargs in (dict(model="llama3.1-8b", tp=2, zero=3, dtype="fp8"), dict(model="olmoe-1b-7b", ep=8)):
        call = lambda: perfsim.estimate(cluster="mi300x-pollara", nodes=1, gbs=8, seq=512, stack=str(path), **kwargs)  # noqa: E731
        _assert_good("hyp.stack", run_api(call), f"{name}: {key} = {value!r} ({kwargs['model']})")


def check_rccl(text):
    path = _file(text, ".log")
    _assert_good("hyp.measure.rccl", run_api(lambda: perfsim.validate("mi300x-pollara", rccl_logs=[str(path)])), text[-400:])


def check_kernels(text):
    path = _file(text, ".csv")
    _assert_good("hyp.measure.kernels", run_api(lambda: perfsim.validate("mi300x-pollara", kernel_csvs=[str(path)])), text)


SURFACES = {
    "simulate": (simulate_argv(), check_simulate),
    "commands": (command_argv(), check_command),
    "api": (st.tuples(st.sampled_from(API_ARGS), ANY_VALUE), lambda t: check_api(*t)),
    "hf": (hf_config(), check_hf),
    "profile": (cluster_mutation(), check_profile),
    "stack": (stack_mutation(), check_stack),
    "rccl": (rccl_text(), check_rccl),
    "kernels": (kernel_csv_text(), check_kernels),
}


def _run(name: str, profile: settings) -> None:
    strategy, check = SURFACES[name]
    profile(given(strategy)(check))()


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_surface_quick(surface):
    _run(surface, QUICK)


@pytest.mark.fuzz
@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_surface_long(surface):
    _run(surface, LONG)
