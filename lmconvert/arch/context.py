"""What every layer of one forward call shares: positions, masks and RoPE tables, built once."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .rope import Rotary


def mask_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position counted from its row's first real token, 0 on (left) padding: (B, S).
    transformers' generate numbers RoPE and absolute positions this way (`cumsum - 1`, pads 0), and
    BLOOM and Falcon build ALiBi from the same numbers (`(cumsum - 1) * mask`)."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1) * mask


@dataclass
class Context:
    q_pos: torch.Tensor  # (T,) index of the new tokens in the sequence (the cache's numbering)
    k_pos: torch.Tensor  # (S,) index of every key, cached ones first
    dtype: torch.dtype
    positions: torch.Tensor | None = None  # (T,) or (B, T) the tokens' positions (RoPE); None: q_pos
    keys: torch.Tensor | None = None  # (B, S) bool, False on padding keys; None: no padding
    _memo: dict = field(default_factory=dict)
    # Gemma 4's KV sharing: a source layer's K/V (cached ones first), by its index, for the layers that reuse them
    shared_kv: dict = field(default_factory=dict)
    # the per-layer embeddings' inputs (B, T, n_layers, dim) of the new tokens (arch/ple.py); None: none
    per_layer: torch.Tensor | None = None
    # the embeddings (B, T, d_model) the shared blocks read beside the stream (Zamba2); None: none
    embeddings: torch.Tensor | None = None

    @classmethod
    def build(cls, past: int, T: int, dtype: torch.dtype, device: torch.device,
              positions: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> Context:
        """The context of T new tokens after `past` cached ones. `attention_mask` (B, past + T), 1 on
        real tokens and 0 on padding, as transformers takes it."""
        keys = None if attention_mask is None else attention_mask.to(device=device, dtype=torch.bool)
        if keys is not None and bool(keys.all()):  # no padding: the plain causal mask (and SDPA's is_causal)
            keys = None
        return cls(torch.arange(past, past + T, device=device), torch.arange(past + T, device=device), dtype,
                   positions, keys)

    def rotary(self, rotary: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: (T, dim), or (B, 1, T, dim) for per-row positions (broadcast over heads)."""
        key = ("rope", id(rotary))
        if key not in self._memo:
            positions = self.q_pos if self.positions is None else self.positions
            cos, sin = rotary.tables(positions, self.dtype)
            if positions.dim() == 2:
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            self._memo[key] = cos, sin
        return self._memo[key]

    def query_temperature(self, beta: float, floor: int, form: str = "ministral3") -> torch.Tensor:
        """The query scale of ArchConfig.attn_temperature_form, fp32, (T, 1), or (B, 1, T, 1) for per-row
        positions. "ministral3" (`get_llama_4_attn_scale`): 1 + beta * log(1 + floor(p / floor)) of each new
        token's position p. "llama4" (Llama4TextAttention): log1p(floor((p + 1.0) / floor)) * beta + 1.0 of its
        index in the cache (transformers numbers it from the cache length, not the position ids). "beam"
        (`compute_attention_scaling`): exp(beta * log1p((p + 1) / floor)) of its position id."""
        key = ("temperature", beta, floor, form)
        if key not in self._memo:
            positions = self.q_pos if self.positions is None or form == "llama4" else self.positions
            if form == "llama4":
                scale = torch.log1p(torch.floor((positions.float() + 1.0) / floor)) * beta + 1.0
            elif form == "beam":
                scale = torch.exp(beta * torch.log1p((positions.float() + 1) / floor))
            else:
                scale = 1 + beta * torch.log(1 + torch.floor(positions / floor))
            self._memo[key] = scale[:, None, :, None] if positions.dim() == 2 else scale[:, None]
        return self._memo[key]

    def key_numbers(self) -> torch.Tensor | None:
        """Key positions counted from each row's first real token (B, S); None without padding."""
        return None if self.keys is None else mask_positions(self.keys)

    def allowed(self, window: int | None, chunk: int | None = None) -> torch.Tensor | None:
        """Bool (T, S), or (B, 1, T, S) with padding: causal, within `window` keys counting the query
        itself, as transformers' masks define it (kv > q - window), within the query's own chunk of
        `chunk` positions (kv // chunk == q // chunk, both counted from the row's first real token, as
        transformers' chunked_overlay counts them), and not a padding key. None when every key is visible."""
        key = ("mask", window, chunk)
        if key not in self._memo:
            q, k = self.q_pos[:, None], self.k_pos[None, :]
            allowed = k <= q
            if window is not None:
                allowed = allowed & (k > q - window)
            if chunk is not None:
                if self.keys is None:
                    allowed = allowed & (k // chunk == q // chunk)
                else:  # the left padding of each row shifts its chunks
                    pad = (self.keys.long().cumsum(-1) == 0).sum(-1)[:, None, None, None]
                    allowed = allowed & ((k - pad) // chunk == (q - pad) // chunk)
            if self.keys is not None:
                allowed = allowed & self.keys[:, None, None, :]
            self._memo[key] = None if bool(allowed.all()) else allowed
        return self._memo[key]

    def is_plain_causal(self, window: int | None, chunk: int | None = None) -> bool:
        """True when the mask is exactly lower-triangular, so SDPA can take is_causal."""
        if len(self.q_pos) != len(self.k_pos) or len(self.q_pos) == 1 or self.keys is not None:
            return False
        return (window is None or window >= len(self.q_pos)) and (chunk is None or chunk >= len(self.k_pos))
