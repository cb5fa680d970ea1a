"""A KV cache for incremental decoding: per layer, two tensors grown along the sequence (dim -2).

Standard attention stores keys and values after RoPE, (B, KV, S, D) each. Latent attention (MLA)
stores its latent instead, in the same two slots: `keys` the normed c_kv (B, 1, S, kv_lora_rank),
`values` the rotated shared key k_rot (B, 1, S, qk_rope_head_dim); it expands them at each step.
Sparse attention (DSA) also keeps its indexer's keys, (B, S, index_head_dim), in `index_keys`.
A token mixer that is not attention (`mixer_kinds.py`) keeps its own fixed-size state per layer
in `states`, a dict of tensors it names itself and replaces at each step.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.index_keys: list[torch.Tensor | None] = [None] * n_layers
        self.states: list[dict[str, torch.Tensor]] = [{} for _ in range(n_layers)]
        self.tokens = 0  # the tokens seen: not any layer's keys, since a hybrid's layer may keep none

    @property
    def length(self) -> int:
        return self.tokens

    def advance(self, new: int) -> None:
        """Counts `new` tokens in, before the layers of the forward that adds them run."""
        self.tokens += new

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v (B, KV, T, D), or MLA's c_kv, k_rot (B, 1, T, C|R); return all seen so far."""
        if self.keys[layer] is not None:
            k = torch.cat((self.keys[layer], k), dim=-2)
            v = torch.cat((self.values[layer], v), dim=-2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def update_index(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """Append DSA's indexer keys (B, T, index_head_dim); return all seen so far (B, S, index_head_dim)."""
        if self.index_keys[layer] is not None:
            k = torch.cat((self.index_keys[layer], k), dim=-2)
        self.index_keys[layer] = k
        return k
