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

from perfsim.system.network import max_min_rates

DONE = 1e-15  # seconds of work left below which a flow has ended
MIN_RATE = 0.05  # a floor on background speed beside a saturated pass (keeps the drain finite; numerical, not physical)


@dataclass(frozen=True, slots=True)
class Window:
    """One block's pass on the chain and what overlaps it."""

    chain_s: float  # the block's pass (its blocking comm included)
    links: dict[str, float] = field(default_factory=dict)  # link busy seconds of the block's own comm
    prefetch_s: float = 0.0  # the next block's parameter gathers, alone, back to back
    prefetch_links: dict[str, float] = field(default_factory=dict)
    ops: tuple = ()  # the block's priced chain ops: the prefetch is played against them


def window_s(w: Window) -> float:
    """How long the block holds the chain once the prefetch overlapping it is done: the
    prefetch and the chain's comm (and the ops beside it: ring attention, TP-comm
    overlap) share the links max-min fairly, as in the engine (``fluid_chain_s``); a
    window without its ops: the bound, the chain, the prefetch alone, and every link's
    total busy time."""
    if w.prefetch_s <= 0:
        return w.chain_s
    if w.ops:
        return fluid_chain_s(w)
    need = max(w.chain_s, w.prefetch_s)
    for link, busy in w.prefetch_links.items():
        need = max(need, w.links.get(link, 0.0) + busy)
    return need


_COMPILED: dict[int, tuple] = {}  # id(ops) -> (ops, segments): a template's chain, compiled once
_RATES: dict[tuple, dict] = {}  # max-min rates of a set of flows, by their link shares


def _segments(ops: tuple) -> tuple:
    """A chain as (latency or compute seconds, data seconds, shares, shares key,
    offchain, join, compute, compute-unit share), consecutive plain compute ops merged
    (nothing changes on the links between them). ``compute``: the segment is compute
    (not a comm op's latency); the compute-unit share: what an off-chain comm op's kernels
    hold while it runs (``meta['cu_share']``: DeepEP's SMs)."""
    found = _COMPILED.get(id(ops))
    if found is not None and found[0] is ops:
        return found[1]
    out: list[list] = []
    for op in ops:
        offchain, join = bool(op.meta.get("offchain")), bool(op.meta.get("join"))
        if op.is_comm:
            latency, share = _data_shares(op)
            held = op.meta.get("cu_share", 0.0) if offchain else 0.0
            out.append([latency, max(0.0, op.duration_s - latency), share, tuple(sorted(share.items())), offchain, join,
                        False, held])
        elif out and not offchain and not join and out[-1][6] and not out[-1][4] and not out[-1][5]:
            out[-1][0] += op.duration_s
        else:
            out.append([op.duration_s, 0.0, {}, (), offchain, join, True, 0.0])
    segments = tuple(tuple(x) for x in out)
    if len(_COMPILED) > 20000:
        _COMPILED.clear()
    _COMPILED[id(ops)] = (ops, segments)
    return segments


def fluid_chain_s(w: Window, contended: bool = False, held: bool = True) -> float:
    """Play the chain op by op against the prefetch started with it: latency and compute
    leave the prefetch its links, a comm op shares them with it max-min (both slow
    down); an ``offchain`` op (ring-attention hop, overlapped TP collective) starts on
    its own queue, one at a time, when the chain reaches it; a ``join`` op waits for the oldest one not yet joined (as
    ``lowering.graph`` wires them). The chain's comm op, the op beside it and the
    prefetch share the links max-min, as in the engine. ``contended``: play the chain
    even with no prefetch, for the contention of its own comm with the ops beside it.
    ``held``: the chain's compute runs on the compute units an off-chain op beside it
    leaves (its compute-unit share, as in the engine); False: at full speed."""
    g_share = {link: busy / w.prefetch_s for link, busy in w.prefetch_links.items()}
    segments = _segments(w.ops)
    if not contended and not any(g_share.keys() & seg[2].keys() for seg in segments if seg[2]):
        return max(w.chain_s, w.prefetch_s)  # no link in common: the prefetch runs beside the chain untouched
    g_key = tuple(sorted(g_share.items()))
    g = w.prefetch_s
    i, t, chain_end, n = 0, 0.0, None, len(segments)
    main = None  # [latency or compute seconds left, data seconds left, shares, key, waits-for side entry]
    side, unjoined = [], []  # side queue (head runs), started side ops not yet joined
    while True:
        while main is None and i < n:
            seg = segments[i]
            i += 1
            if seg[4]:
                entry = [seg[0], seg[1], seg[2], seg[3], False, seg[7] if held else 0.0]
                side.append(entry)
                unjoined.append(entry)
                continue
            main = [seg[0], seg[1], seg[2], seg[3], unjoined.pop(0) if seg[5] and unjoined else None, seg[6]]
        if main is None and chain_end is None:
            chain_end = t
        head = side[0] if side else None
        running = main is not None and (main[4] is None or main[4][4])
        m_on = running and main[0] <= DONE and main[1] > DONE
        s_on = head is not None and head[0] <= DONE and head[1] > DONE
        g_on = g > DONE
        if chain_end is not None and (not g_on or not s_on and not side):
            return max(chain_end, t + max(0.0, g))
        key = (main[3] if m_on else None, head[3] if s_on else None, g_key if g_on else None)
        rates = _RATES.get(key)
        if rates is None:
            flows = {}
            if m_on:
                flows["main"] = main[2]
            if s_on:
                flows["side"] = head[2]
            if g_on:
                flows["g"] = g_share
            shared = {k: v for k, v in flows.items() if v}
            rates = max_min_rates(shared) if shared else {}
            rates.update({k: 1.0 for k, v in flows.items() if not v})
            if len(_RATES) > 50000:
                _RATES.clear()
            _RATES[key] = rates
        r_main, r_side, r_g = rates.get("main", 0.0), rates.get("side", 0.0), rates.get("g", 0.0)
        pace = 1.0 - head[5] if running and main[5] and head is not None else 1.0  # compute beside a held share
        dt = float("inf")
        if running:
            dt = main[0] / pace if main[0] > DONE else main[1] / max(r_main, 1e-12)
        if head is not None:
            dt = min(dt, head[0] if head[0] > DONE else head[1] / max(r_side, 1e-12))
        if g_on:
            dt = min(dt, g / max(r_g, 1e-12))
        if dt == float("inf"):
            dt = 0.0
        dt = max(0.0, dt)
        t += dt
        g -= dt * r_g
        if running:
            if main[0] > DONE:
                main[0] -= dt * pace
            else:
                main[1] -= dt * r_main
        if head is not None:
            if head[0] > DONE:
                head[0] -= dt
            else:
                head[1] -= dt * r_side
            if head[0] <= DONE and head[1] <= DONE:
                head[4] = True
                side.pop(0)
        if running and main[0] <= DONE and main[1] <= DONE:
            main = None


def _data_shares(op) -> tuple[float, dict[str, float]]:
    """(latency, link shares at full rate) of a priced comm op."""
    return op.meta.get("latency_s", 0.0), dict(op.meta.get("link_share") or {})


def add_links(*loads: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for load in loads:
        for link, busy in load.items():
            out[link] = out.get(link, 0.0) + busy
    return out


def queue_drain_s(items, end: float) -> float:
    """Seconds a queue of transfers ((issue time, seconds alone, rate) in order, one at
    a time) runs past ``end``, each progressing at its ``rate`` of full speed before
    ``end`` (what the pass's foreground traffic leaves it) and at full speed after."""
    t = 0.0
    for issue, work, rate in items:
        t = max(t, issue)
        if t < end and rate < 1.0:
            before = min(work, (end - t) * rate)
            t, work = t + before / rate, work - before
        t += work
    return max(0.0, t - end)


def background_rate(fg: list[tuple[float, dict[str, float]]], pass_s: float, traffic_links: dict[str, float]) -> float:
    """The share of its speed background traffic keeps beside a pass: foreground comm
    goes first (``engine.priority_rates``), so while a foreground op moves data
    (``fg``: its data seconds over the pass and link shares) the background gets what
    that op leaves of each link it uses (``traffic_links``: its busy seconds per link,
    the busiest at share 1)."""
    top = max(traffic_links.values(), default=0.0)
    if pass_s <= 0 or top <= 0:
        return 1.0
    share = {link: busy / top for link, busy in traffic_links.items() if busy > 0}
    lost = 0.0
    for seconds, links in fg:
        left = min(((1.0 - links.get(link, 0.0)) / s for link, s in share.items()), default=1.0)
        lost += seconds * (1.0 - min(1.0, max(0.0, left)))
    return max(MIN_RATE, 1.0 - lost / pass_s)


def drain_s(pass_s: float, exposed_alone: float, pass_links: dict[str, float], traffic_links: dict[str, float]) -> float:
    """Seconds the traffic (gradient buckets) adds past the pass it drains behind:
    ``exposed_alone`` as if it had the links to itself (the last bucket always shows),
    or more where a link must carry the pass's own traffic and the buckets."""
    end = pass_s + exposed_alone
    for link, busy in traffic_links.items():
        end = max(end, pass_links.get(link, 0.0) + busy)
    return end - pass_s


def link_figures(loads: dict[str, dict[str, float]], per_coll: dict, step: float) -> dict[str, dict]:
    """Per link of the critical stage's rank (xGMI: its busiest peer link; NIC; leaf
    uplink): seconds its comm keeps it busy moving data (``loads``: collective key ->
    link -> seconds), that over the step, and the exposed seconds of the collectives that
    use it -- where overlap failed, and which link it failed on. Adds each collective's
    link seconds to ``per_coll`` as ``links``."""
    busy: dict[str, dict[str, float]] = {}
    users: dict[str, set] = {}
    for key, load in loads.items():
        for link, seconds in load.items():
            family = link.split(":")[0]
            busy.setdefault(family, {})[link] = busy.get(family, {}).get(link, 0.0) + seconds
            users.setdefault(family, set()).add(key)
            if key in per_coll:
                mine = per_coll[key].setdefault("links", {})
                mine[family] = max(mine.get(family, 0.0), seconds)
    out = {}
    for family, members in sorted(busy.items()):
        top = max(members.values())
        exposed = sum(per_coll.get(k, {}).get("exposed_s", 0.0) for k in users[family])
        out[family] = {"busy_s": top, "utilization": top / step if step > 0 else 0.0, "exposed_s": exposed,
                       "links": len(members)}
    return out
