"""Decoder-only transformer specs (dense and MoE): parameter counts and layer shapes.

Conventions: ``ffn_hidden_size`` and ``expert_ffn_hidden_size`` are the width after the
activation (the down projection's input); a gated MLP (SwiGLU) has two up projections.
``ffn_hidden_size`` is 0 when every layer is MoE. For MLA, ``head_dim`` is the per-head
non-rotary q/k width (HF ``qk_nope_head_dim``) and ``num_kv_heads`` equals ``num_heads``.

Published counts differ in how they treat embeddings: ``published_params_include_embeddings``
says whether the figures count the embedding and LM head at all, and
``published_active_params_include_input_embedding`` (False for DeepSeek) says whether the
activated figure counts the input embedding lookup, which does no matmul.
"""

from dataclasses import dataclass
from enum import StrEnum

from perfsim.errors import ConfigError


def causal_keys(seq: float, window: int = 0) -> float:
    """Keys a query attends to on average in a causal sequence of ``seq`` tokens: half of it,
    or under a sliding ``window`` shorter than it, the window less its ramp at the sequence
    start (W - W^2 / 2S, the causal half at W = S)."""
    return seq / 2 if not 0 < window < seq else window - window * window / (2 * seq)


class AttentionKind(StrEnum):
    GQA = "gqa"  # multi-head / grouped-query attention (MHA when kv heads == heads)
    MLA = "mla"  # DeepSeek multi-head latent attention


@dataclass(frozen=True, kw_only=True)
class Linear:
    """One weight matrix: y[tokens, out] = x[tokens, in] @ W[in, out]."""

    name: str
    in_features: int
    out_features: int

    @property
    def params(self) -> int:
        return self.in_features * self.out_features


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    source: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool = False
    gated_mlp: bool = True
    # rotary position embeddings applied to q and k in every layer (Llama and its kin); False:
    # learned absolute positions added once to the token embedding (MPT, GPT-3), whose table
    # (max_seq_len x hidden, a fraction of a percent of a model's parameters at 2k) is not counted
    rotary: bool = True
    # RMSNorm on the queries and keys before rotary (Qwen3, Qwen3-MoE, OLMoE): one more
    # memory-bound pass over q and k per layer; its weights (head_dim or q/k width) are negligible
    qk_norm: bool = False
    attention: AttentionKind = AttentionKind.GQA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_experts: int = 0
    top_k: int = 0
    expert_ffn_hidden_size: int = 0
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    num_dense_layers: int = 0
    router_hidden_size: int = 0
    capacity_factor: float = 0.0
    # group-limited routing (DeepSeek-V2/V3 ``n_group`` / ``topk_group``): experts form
    # ``expert_groups`` contiguous groups and a token picks its experts from ``topk_groups``
    # of them; with expert parallelism the groups lie on EP ranks in order, so this bounds the
    # nodes a token reaches (0 = no limit)
    expert_groups: int = 0
    topk_groups: int = 0
    # sliding-window attention (GPT-OSS, Gemma, Mistral): each query of a windowed layer
    # attends to the ``sliding_window`` tokens ending at its own (0: every layer full causal);
    # ``full_attention_every`` N > 0: every N-th layer (layers N-1, 2N-1, ...) stays full and the
    # others are windowed, as the Hugging Face ``layer_types`` lists them (GPT-OSS 2: sliding,
    # full, sliding, ...); 0: every layer windowed
    sliding_window: int = 0
    full_attention_every: int = 0
    published_total_params: float = 0.0
    published_active_params: float = 0.0
    published_params_include_embeddings: bool = True
    published_active_params_include_input_embedding: bool = True

    def __post_init__(self):
        for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model.{key} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )
        self._check_moe()
        self._check_mla()
        self._check_window()

    def _check_moe(self) -> None:
        if self.num_experts < 0 or self.num_experts == 1:
            raise ConfigError(f"model.num_experts must be 0 (dense) or >= 2, got {self.num_experts!r}")
        if self.num_experts:
            if not 1 <= self.top_k <= self.num_experts:
                raise ConfigError(f"model.top_k must be in [1, {self.num_experts}], got {self.top_k!r}")
            if self.expert_ffn_hidden_size < 1:
                raise ConfigError(f"model.expert_ffn_hidden_size must be >= 1, got {self.expert_ffn_hidden_size!r}")
            if not 0 <= self.num_dense_layers < self.num_layers:
                raise ConfigError(f"model.num_dense_layers must be in [0, {self.num_layers}), got {self.num_dense_layers!r}")
        if self.num_dense_layers and self.ffn_hidden_size < 1 or not self.num_experts and self.ffn_hidden_size < 1:
            raise ConfigError(f"model.ffn_hidden_size must be >= 1, got {self.ffn_hidden_size!r}")
        if self.capacity_factor < 0:
            raise ConfigError(f"model.capacity_factor must be >= 0 (0 = no dropping), got {self.capacity_factor!r}")
        self._check_groups()

    def _check_groups(self) -> None:
        g, k = self.expert_groups, self.topk_groups
        for key, value in (("expert_groups", g), ("topk_groups", k)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model.{key} must be a non-negative integer (0 = no group limit), got {value!r}")
        if not g and not k:
            return
        if not self.num_experts or not g or not k:
            raise ConfigError(f"model.expert_groups ({g}) and topk_groups ({k}) go together, on an MoE model (0 and 0 = no limit)")
        if self.num_experts % g:
            raise ConfigError(f"model.expert_groups ({g}) must divide num_experts ({self.num_experts})")
        if not 1 <= k <= g:
            raise ConfigError(f"model.topk_groups must be in [1, expert_groups={g}], got {k!r}")
        if self.top_k > k * (self.num_experts // g):
            raise ConfigError(f"model.top_k ({self.top_k}) exceeds the {k * (self.num_experts // g)} experts of "
                              f"topk_groups={k} groups")

    def _check_window(self) -> None:
        for key in ("sliding_window", "full_attention_every"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model.{key} must be a non-negative integer (0 = none), got {value!r}")
        if self.full_attention_every and not self.sliding_window:
            raise ConfigError(f"model.full_attention_every ({self.full_attention_every}) needs a sliding_window > 0")

    def attention_window(self, layer: int) -> int:
        """Keys a query of ``layer`` attends to at most (its own and those before it): the
        sliding window on a windowed layer, 0 on a full causal one. A multi-token-prediction
        layer (numbered after the decoder layers) is a layer like the model's last."""
        if not self.sliding_window:
            return 0
        layer = min(layer, self.num_layers - 1)
        every = self.full_attention_every
        return 0 if every and (layer + 1) % every == 0 else self.sliding_window

    @property
    def group_limited(self) -> bool:
        """Routing picks experts within ``topk_groups`` of ``expert_groups`` groups (a real limit)."""
        return bool(self.expert_groups) and self.topk_groups < self.expert_groups

    def _check_mla(self) -> None:
        if self.attention is AttentionKind.MLA and (self.kv_lora_rank < 1 or self.v_head_dim < 1):
            raise ConfigError("model: MLA attention needs kv_lora_rank >= 1 and v_head_dim >= 1")

    # ---- structure ------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_mlp_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def shared_ffn_hidden_size(self) -> int:
        if self.shared_expert_ffn_hidden_size:
            return self.shared_expert_ffn_hidden_size
        return self.num_shared_experts * self.expert_ffn_hidden_size

    @property
    def has_shared_experts(self) -> bool:
        """MoE layers with shared experts beside the routed ones."""
        return self.is_moe and self.shared_ffn_hidden_size > 0

    @property
    def qk_width(self) -> int:
        """Queries plus keys per token (what rotary and the q/k norm read and write)."""
        return self.q_width + self.num_kv_heads * (self.head_dim + self.qk_rope_head_dim)

    @property
    def q_width(self) -> int:
        """Width of the attention's query (= key) vectors summed over heads."""
        return self.num_heads * (self.head_dim + self.qk_rope_head_dim)

    @property
    def v_width(self) -> int:
        return self.num_heads * (self.v_head_dim or self.head_dim)

    def attention_linears(self) -> list[Linear]:
        h = self.hidden_size
        if self.attention is AttentionKind.MLA:
            return self._mla_linears()
        kv = 2 * self.num_kv_heads * self.head_dim
        return [
            Linear(name="qkv", in_features=h, out_features=self.num_heads * self.head_dim + kv),
            Linear(name="attn_out", in_features=self.num_heads * self.head_dim, out_features=h),
        ]

    def _mla_linears(self) -> list[Linear]:
        h, heads = self.hidden_size, self.num_heads
        q = [Linear(name="q", in_features=h, out_features=self.q_width)]
        if self.q_lora_rank:
            q = [
                Linear(name="q_down", in_features=h, out_features=self.q_lora_rank),
                Linear(name="q_up", in_features=self.q_lora_rank, out_features=self.q_width),
            ]
        return q + [
            Linear(name="kv_down", in_features=h, out_features=self.kv_lora_rank + self.qk_rope_head_dim),
            Linear(name="kv_up", in_features=self.kv_lora_rank, out_features=heads * (self.head_dim + self.v_head_dim)),
            Linear(name="attn_out", in_features=self.v_width, out_features=h),
        ]

    def mlp_linears(self, width: int, prefix: str = "mlp") -> list[Linear]:
        up = width * (2 if self.gated_mlp else 1)
        return [
            Linear(name=f"{prefix}_up", in_features=self.hidden_size, out_features=up),
            Linear(name=f"{prefix}_down", in_features=width, out_features=self.hidden_size),
        ]

    def router_linears(self) -> list[Linear]:
        if not self.router_hidden_size:
            return [Linear(name="router", in_features=self.hidden_size, out_features=self.num_experts)]
        r = self.router_hidden_size
        return [
            Linear(name="router_down", in_features=self.hidden_size, out_features=r),
            Linear(name="router_mlp", in_features=r, out_features=r),
            Linear(name="router_out", in_features=r, out_features=self.num_experts),
        ]

    # ---- parameter counts --------------------------------------------------------------

    def attention_params(self) -> int:
        return sum(lin.params for lin in self.attention_linears())

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return sum(lin.params for lin in self.mlp_linears(self.expert_ffn_hidden_size))

    def shared_expert_params(self) -> int:
        if not self.shared_ffn_hidden_size:
            return 0
        return sum(lin.params for lin in self.mlp_linears(self.shared_ffn_hidden_size))

    def router_params(self) -> int:
        return sum(lin.params for lin in self.router_linears()) if self.is_moe else 0

    def dense_mlp_params(self) -> int:
        return sum(lin.params for lin in self.mlp_linears(self.ffn_hidden_size))

    def norm_params_per_layer(self) -> int:
        """Pre-attention and pre-MLP RMSNorms, plus MLA's RMSNorms on the q and kv latents."""
        latent_norms = self.q_lora_rank + self.kv_lora_rank if self.attention is AttentionKind.MLA else 0
        return 2 * self.hidden_size + latent_norms

    def mtp_own_params(self) -> int:
        """What a multi-token-prediction layer adds to a transformer layer (DeepSeek-V3 sec. 2.2;
        Megatron-Core MultiTokenPredictionLayer): the 2h -> h projection of the joined hidden
        state and embedding, and three RMSNorms (the hidden state's, the embedding's, its final
        norm)."""
        return 2 * self.hidden_size * self.hidden_size + 3 * self.hidden_size

    def embedding_params(self) -> int:
        """Input embedding plus an untied LM head."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    def moe_layer_params(self, active: bool) -> int:
        experts = self.top_k if active else self.num_experts
        return experts * self.expert_params() + self.shared_expert_params() + self.router_params()

    def _layers_params(self, active: bool) -> int:
        per_layer = self.attention_params() + self.norm_params_per_layer()
        total = self.num_layers * per_layer + self.num_mlp_layers * self.dense_mlp_params()
        return total + self.num_moe_layers * self.moe_layer_params(active) + self.hidden_size

    def total_params(self, include_embeddings: bool = True) -> int:
        return self._layers_params(False) + (self.embedding_params() if include_embeddings else 0)

    def active_params(self, include_embeddings: bool = True) -> int:
        return self._layers_params(True) + (self.embedding_params() if include_embeddings else 0)

    def params_as_published(self, active: bool) -> int:
        """Total or active parameters counted the way the published figure counts them."""
        include = self.published_params_include_embeddings
        count = self.active_params(include) if active else self.total_params(include)
        skip_input = not self.published_active_params_include_input_embedding and not self.tied_embeddings
        if active and include and skip_input:
            count -= self.vocab_size * self.hidden_size
        return count

    # ---- FLOPs ---------------------------------------------------------------------------

    def model_flops_per_token(self, seq_len: int, mtp_layers: int = 0) -> float:
        """Training FLOPs per token (forward + backward), the MFU numerator.

        6 * N_active_matmul  (Kaplan'20: 2 FLOP per weight forward, 4 backward)
        + 6 * L * s * (q_width + v_width) / 2   (attention scores and context, causal
        half of PaLM's 12*L*H*Q*T, Chowdhery'22 app. B; a sliding-window layer's keys per query
        ``causal_keys`` in place of s / 2); embeddings lookups excluded,
        the LM head included. Each of ``mtp_layers`` multi-token-prediction layers (DeepSeek-V3
        sec. 2.2; the plan's ``mtp_layers``) adds a layer like the model's last, its own
        parameters (``mtp_own_params``: the 2h -> h projection; its norms, as the layers' are
        counted) and one more LM head, as Megatron-Bridge's FLOPs count takes them.
        """
        matmul = self.active_params(include_embeddings=False) + self.vocab_size * self.hidden_size
        layers = self.num_layers + mtp_layers
        if mtp_layers:
            last = self.moe_layer_params(True) if self.is_moe else self.dense_mlp_params()
            head = self.vocab_size * self.hidden_size
            matmul += mtp_layers * (self.attention_params() + last + self.mtp_own_params() + head)
        keys = sum(causal_keys(seq_len, self.attention_window(layer)) for layer in range(layers))
        attention = 6 * keys * (self.q_width + self.v_width)
        return 6.0 * matmul + attention
