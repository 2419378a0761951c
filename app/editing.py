"""Edit the model shape and the hardware on the Plan page, starting from the chosen preset
and profile (issue 17.15). Only the changed fields are kept in the inputs ("model_edit",
"hardware_edit"), so a scenario stores what the user changed; the widgets of each preset
have their own keys, so picking another preset starts from its own values."""

import streamlit as st

import fmt

MODEL_FIELDS = (  # ModelSpec field, label
    ("num_layers", "layers"), ("hidden_size", "hidden"), ("num_heads", "heads"), ("num_kv_heads", "KV heads"),
    ("ffn_hidden_size", "FFN width"), ("num_experts", "experts"), ("top_k", "top-k"),
    ("expert_ffn_hidden_size", "expert FFN width"),
)
HARDWARE_FIELDS = (  # key, label, unit
    ("dense_tflops", "dense TFLOPS (plan dtype)", "TFLOPS"), ("hbm_capacity_GB", "HBM capacity (vendor GB, read as GiB)", "GB"),
    ("hbm_bw_GBps", "HBM bandwidth", "GB/s"), ("link_bw_GBps", "xGMI/NVLink per link", "GB/s"),
    ("nic_bw_Gbps", "NIC bandwidth", "Gb/s"),
)


def hardware_values(cluster, dtype: str) -> dict:
    """The editable hardware numbers of a ClusterSpec."""
    return {"dense_tflops": cluster.gpu.peak_tflops.get(dtype, cluster.gpu.peak_tflops.get("bf16")),
            "hbm_capacity_GB": cluster.gpu.hbm_capacity_GB, "hbm_bw_GBps": cluster.gpu.hbm_bw_GBps,
            "link_bw_GBps": cluster.node.link_bw_GBps, "nic_bw_Gbps": cluster.fabric.nic_bw_Gbps}


def model_editor(spec, model_name: str, current: dict) -> dict:
    """Number inputs for the shape of ``spec``; returns the fields that differ from it."""
    edits = {}
    with st.expander("Edit model shape", icon=":material/edit:"):
        cols = st.columns(2)
        for i, (field, label) in enumerate(MODEL_FIELDS):
            base = getattr(spec, field)
            value = cols[i % 2].number_input(label, min_value=0, step=1, value=int(current.get(field, base)),
                                             key=f"w.me.{model_name}.{field}")
            if int(value) != base:
                edits[field] = int(value)
        if edits:
            st.caption(fmt.md("Changed from the preset: " + ", ".join(f"{k} {getattr(spec, k)} -> {v}"
                                                                       for k, v in edits.items())))
    return edits


def hardware_editor(cluster, cluster_name: str, dtype: str, current: dict) -> dict:
    """Number inputs for the hardware of ``cluster``; returns the numbers that differ."""
    base, edits = hardware_values(cluster, dtype), {}
    with st.expander("Edit hardware", icon=":material/memory:"):
        for key, label, unit in HARDWARE_FIELDS:
            value = st.number_input(f"{label} ({unit})", min_value=0.001, value=float(current.get(key, base[key])),
                                    key=f"w.hw.{cluster_name}.{key}", format="%.1f")
            if abs(float(value) - base[key]) > 1e-9 * max(1.0, abs(base[key])):
                edits[key] = float(value)
        if edits:
            st.caption(fmt.md("Changed from the profile: " + ", ".join(f"{k} {base[k]:g} -> {v:g}" for k, v in edits.items())
                              + ". TFLOPS scales every dtype's peak by the same factor; the link and NIC "
                                "figures are usable bandwidth (the raw link rate scales with it)."))
    return edits
