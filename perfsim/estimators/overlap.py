"""Overlapped traffic in closed form, obeying the links.

What the engine does with every comm op that shares a link (max-min fair sharing of
the rank's xGMI links, NIC and leaf uplink), summarised per window of the compute
chain, so that categories no longer hide independently:

- A ZeRO parameter all-gather is prefetched one block ahead (FSDP2's implicit forward /
  backward prefetch, Megatron-Core's ``overlap_param_gather``; the graph issues a layer's
  gather when the block two back ends, which bounds gathers in flight like FSDP's
  ``limit_all_gathers``): it runs during the block before it. That block's window lasts
  the longest of its own chain, the gather alone, and, for every link, the seconds the
  block's own comm and the gather keep that link busy (``window_s``).
- Gradient buckets drain behind the last backward: that pass lasts at least the link
  time of everything on each link, and the last bucket can hide behind nothing
  (``drain_s``).

Link loads are the seconds a link is busy moving an op's data alone (``pricing``'s
``link_share`` x data time), so "the sum of the traffic sharing a link over a window
exceeds what the link moves in that window" is a comparison of seconds.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Window:
    """One block's pass on the chain and what overlaps it."""

    chain_s: float  # the block's pass (its blocking comm included)
    links: dict[str, float] = field(default_factory=dict)  # link busy seconds of the block's own comm
    prefetch_s: float = 0.0  # the next block's parameter gathers, alone, back to back
    prefetch_links: dict[str, float] = field(default_factory=dict)


def window_s(w: Window) -> float:
    """How long the block holds the chain once the prefetch overlapping it is done."""
    need = max(w.chain_s, w.prefetch_s)
    for link, busy in w.prefetch_links.items():
        need = max(need, w.links.get(link, 0.0) + busy)
    return need


def add_links(*loads: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for load in loads:
        for link, busy in load.items():
            out[link] = out.get(link, 0.0) + busy
    return out


def drain_s(pass_s: float, exposed_alone: float, pass_links: dict[str, float], traffic_links: dict[str, float]) -> float:
    """Seconds the traffic (gradient buckets) adds past the pass it drains behind:
    ``exposed_alone`` as if it had the links to itself (the last bucket always shows),
    or more where a link must carry the pass's own traffic and the buckets."""
    end = pass_s + exposed_alone
    for link, busy in traffic_links.items():
        end = max(end, pass_links.get(link, 0.0) + busy)
    return end - pass_s
