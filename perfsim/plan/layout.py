"""Megatron-Core's custom pipeline layout (``--pipeline-model-parallel-layout``).

A layout string lists the virtual pipeline stages in forward order (Megatron: every
pipeline rank's first chunk, then every rank's second, ...), split by ``|``; each stage
holds symbols ``E`` (the embedding), ``t`` (a decoder layer), ``m`` (a multi-token-
prediction layer) and ``L`` (the loss: final norm, LM head, cross-entropy). ``x*N``
repeats a symbol, ``(...)*N`` a group; commas and spaces are cosmetic; an empty stage is
legal (``E||t|L``). Source: Megatron-Core's user guide, "Custom Pipeline Model Parallel
Layout" (docs.nvidia.com/megatron-core/developer-guide/latest/user-guide/features/
pipeline_parallel_layout.html), whose example places DeepSeek-V3's 61 decoder layers and
one MTP layer over PP16 VPP2 as ``Et*3|(tt|)*29,m|L``.

perfsim holds the embedding on the first virtual stage and the loss on the last (its
schedules put them there), and numbers the MTP layers after the decoder layers, so a
layout must start with ``E``, end with ``L`` and place every ``m`` after every ``t``;
each virtual stage then holds a contiguous run of layer indices (``stage_counts``).
"""

import functools
import re

from perfsim.errors import ConfigError

SYMBOLS = frozenset("EtmL")
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_SINGLE = re.compile(r"([EtmL])\*(\d+)")
MAX_REPEAT = 100_000  # a larger count is a typo, not a pipeline
MAX_SYMBOLS = 10 * MAX_REPEAT  # input bound on the expanded layout


def _repeat(match: re.Match, what: str) -> str:
    count = int(match.group(2))
    if count > MAX_REPEAT:
        raise ConfigError(f"plan.pipeline_layout: repeat count {count:,} in {what!r} is larger than {MAX_REPEAT:,}")
    if len(match.group(1)) * count > MAX_SYMBOLS:  # checked before expanding: nested repeats multiply
        raise ConfigError(f"plan.pipeline_layout {what!r} expands to more than {MAX_SYMBOLS:,} symbols")
    return match.group(1) * count


@functools.lru_cache(maxsize=256)
def parse(layout: str) -> tuple[str, ...]:
    """The layout's virtual stages in forward order, each as its symbols (``'Et'``, ``''``)."""
    if not isinstance(layout, str) or not layout.strip():
        raise ConfigError(f"plan.pipeline_layout must be a layout string such as 'Et|(tt|)*30mL', got {layout!r}")
    text = re.sub(r"[\s,]", "", layout)
    bad = sorted(set(text) - SYMBOLS - set("|()*0123456789"))
    if bad:
        raise ConfigError(f"plan.pipeline_layout {layout!r}: unknown symbol {bad[0]!r} (E embedding, t decoder layer, "
                          f"m MTP layer, L loss, | between stages, x*N and (...)*N repeat)")
    while _GROUP.search(text):
        text = _GROUP.sub(lambda m: _repeat(m, layout), text)
        if len(text) > MAX_SYMBOLS:
            raise ConfigError(f"plan.pipeline_layout {layout!r} expands to more than {MAX_SYMBOLS:,} symbols")
    text = _SINGLE.sub(lambda m: _repeat(m, layout), text)
    if len(text) > MAX_SYMBOLS:
        raise ConfigError(f"plan.pipeline_layout {layout!r} expands to more than {MAX_SYMBOLS:,} symbols")
    if set(text) - SYMBOLS - {"|"}:
        raise ConfigError(f"plan.pipeline_layout {layout!r}: a '(', ')' or '*' is not part of a repeat "
                          f"(write x*N or (...)*N)")
    stages = tuple(text.split("|"))
    flat = "".join(stages)
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        raise ConfigError(f"plan.pipeline_layout {layout!r}: the embedding E must appear once, first in the first stage")
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        raise ConfigError(f"plan.pipeline_layout {layout!r}: the loss L must appear once, last in the last stage")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise ConfigError(f"plan.pipeline_layout {layout!r}: every MTP layer m must come after every decoder layer t")
    return stages


def symbol_count(layout: str, symbol: str) -> int:
    return sum(stage.count(symbol) for stage in parse(layout))


@functools.lru_cache(maxsize=256)
def stage_counts(layout: str) -> tuple[int, ...]:
    """Layers (decoder and MTP) each virtual stage holds, in forward order."""
    return tuple(stage.count("t") + stage.count("m") for stage in parse(layout))


def check(layout: str, pp: int, vpp: int, mtp_layers: int) -> None:
    """The plan-level checks: the stage count is pp x vpp and the MTP layers are the plan's."""
    stages = parse(layout)
    if len(stages) != pp * vpp:
        raise ConfigError(f"plan.pipeline_layout {layout!r} has {len(stages)} stages; pp*vpp = {pp}*{vpp} = {pp * vpp} "
                          f"(Megatron takes vpp = stages / pp: set vpp {len(stages) // pp if len(stages) % pp == 0 else '?'})")
    mtp = symbol_count(layout, "m")
    if mtp != mtp_layers:
        raise ConfigError(f"plan.pipeline_layout {layout!r} places {mtp} MTP layer(s) m; plan.mtp_layers is {mtp_layers}")


def check_model(layout: str, num_layers: int) -> None:
    decoder = symbol_count(layout, "t")
    if decoder != num_layers:
        raise ConfigError(f"plan.pipeline_layout {layout!r} places {decoder} decoder layers t; the model has {num_layers}")
