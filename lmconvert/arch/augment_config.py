"""The settings of what Gemma 3n adds around the blocks (torch-free, as config.py): AltUp's residual streams and
the per-layer embeddings (PLE), which Gemma 4 has too. Each is one frozen value on ArchConfig (`altup`, `ple`),
None where a model has none; the modules that compute them are arch/altup.py and arch/ple.py."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


def _count(owner: str, name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"ArchConfig.{owner}.{name}={value!r}: must be an integer >= {low}")


@dataclass(frozen=True)
class AltUpConfig:
    """Alternating updates (Gemma3nTextAltUp): the model carries `n_inputs` residual streams; the embedding is the
    first, the others its projections (`altup_in.{i}`) scaled to its RMS. Each block runs on the `active` stream
    predicted from all of them by a learned mixing (its router: a weighted RMSNorm of the active stream times
    1/d_model, a linear to n_inputs, tanh in fp32), then corrects every stream by its output; the corrected active
    stream, times `layers.{i}.altup.correct_scale` where `correct_scale`, feeds the per-layer embedding (ple),
    added to streams 1 and up. After the last block the other streams are projected back (`altup_out.{i}`), scaled
    to the first's RMS, and the mean of all is the final norm's input. `coef_clip` clamps the coefficient weights
    in training only (kept for the config's round trip)."""

    n_inputs: int = 4
    active: int = 0
    coef_clip: float | None = 120.0
    correct_scale: bool = True

    def __post_init__(self) -> None:
        _count("altup", "n_inputs", self.n_inputs, 2)
        _count("altup", "active", self.active, 0)
        if self.active >= self.n_inputs:
            raise ConfigError(f"ArchConfig.altup.active={self.active}: must be below n_inputs={self.n_inputs}")
        if self.coef_clip is not None and (isinstance(self.coef_clip, bool)
                                           or not isinstance(self.coef_clip, (int, float)) or self.coef_clip <= 0):
            raise ConfigError(f"ArchConfig.altup.coef_clip={self.coef_clip!r}: must be a positive number or None")
        if self.correct_scale not in (True, False):
            raise ConfigError(f"ArchConfig.altup.correct_scale={self.correct_scale!r}: must be true or false")


# PleConfig.scales: how the per-layer embeddings' constant factors multiply (sqrt(dim) on the table is rounded to
# the weight dtype either way, as the main embedding's): "rounded", Gemma 3n's, 1/sqrt(d_model) and 1/sqrt(2) as
# tensors cast to the activation dtype first, and token ids past the table read row 0; "python", Gemma 4's, both as
# Python floats (rounded once, in the product)
PLE_SCALES = ("rounded", "python")


@dataclass(frozen=True)
class PleConfig:
    """Per-layer embeddings (Gemma 3n, Gemma 4's hidden_size_per_layer_input): a second table (`ple.embed`,
    `vocab_size` rows of n_layers * `dim`, times sqrt(dim)) gives every token a `dim`-wide input per layer; the
    main embedding projected (`ple.project`, times 1/sqrt(d_model)) and normalised per layer (`ple.norm`) is added
    to it and the sum times 1/sqrt(2). In each block, `layers.{i}.ple`: gate (d_model -> dim), the activation,
    times the layer's input, projection back, norm; added to the residual (to AltUp's streams 1 and up)."""

    vocab_size: int
    dim: int
    scales: str = "rounded"

    def __post_init__(self) -> None:
        _count("ple", "vocab_size", self.vocab_size, 1)
        _count("ple", "dim", self.dim, 1)
        if self.scales not in PLE_SCALES:
            raise ConfigError(f"ArchConfig.ple.scales={self.scales!r}: one of {', '.join(PLE_SCALES)}")


@dataclass(frozen=True)
class SharedBlocksConfig:
    """Transformer blocks held once and called from several layers (Zamba2's shared transformer): `n_blocks`
    blocks (`shared_blocks.{j}`), the n-th of the `layers` listed (the hybrid layers, in order) calling block
    n % n_blocks. A call reads concat(h, the embeddings) (2 d_model wide), normalises it (`attn_norm`, 2 d_model),
    attends (q, k, v from 2 d_model; n_heads x head_dim, head_dim 2 d_model / n_heads in Zamba2, ArchConfig's
    n_heads, n_kv_heads, head_dim, attn_scale and RoPE; o back to d_model), normalises (`mlp_norm`) and runs a
    gated FFN whose gate and up are one fused projection (`mlp.gate_up`; two, `mlp.gate` and `mlp.up`, unless
    `fused_gate_up`; ArchConfig's d_ff and activation). Each call has its own low-rank adapters
    (`layers.{i}.shared.*_adapter.{0,1}`, rank `adapter_rank`, no bias; none where it is None), added to the fused
    gate/up's output and to q, k and v where `attn_adapters`, and its own `linear` (d_model ->
    d_model) after the block; that output joins the layer's input before its norm only, the residual stays
    the layer's input. Each call keeps its own KV cache (they share weights, not keys)."""

    n_blocks: int
    layers: tuple[int, ...]
    adapter_rank: int | None  # None: no adapters at all (Zamba's)
    attn_adapters: bool = False
    fused_gate_up: bool = True  # the FFN's gate and up one projection (Zamba2's gate_up_proj); False: two (Zamba's)

    def __post_init__(self) -> None:
        _count("shared_blocks", "n_blocks", self.n_blocks, 1)
        if self.adapter_rank is not None:
            _count("shared_blocks", "adapter_rank", self.adapter_rank, 1)
        if self.fused_gate_up not in (True, False):
            raise ConfigError(f"ArchConfig.shared_blocks.fused_gate_up={self.fused_gate_up!r}: must be true or false")
        layers = self.layers
        if not isinstance(layers, (list, tuple)) or not layers:
            raise ConfigError(f"ArchConfig.shared_blocks.layers={layers!r}: must list the layers that call a block")
        for i in layers:
            _count("shared_blocks", "layers", i, 0)
        if list(layers) != sorted(set(layers)):
            raise ConfigError(f"ArchConfig.shared_blocks.layers={list(layers)}: must be increasing, each once")
        object.__setattr__(self, "layers", tuple(layers))
        if self.attn_adapters not in (True, False):
            raise ConfigError(f"ArchConfig.shared_blocks.attn_adapters={self.attn_adapters!r}: must be true or false")
        if self.attn_adapters and self.adapter_rank is None:
            raise ConfigError("ArchConfig.shared_blocks.attn_adapters=True: adapters need an adapter_rank")

    def block_of(self, layer: int) -> int:
        """The block a calling layer runs: its call's number modulo n_blocks."""
        return self.layers.index(layer) % self.n_blocks
