"""What every layer of one forward call shares: positions, masks and RoPE tables, built once."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .rope import Rotary


@dataclass
class Context:
    q_pos: torch.Tensor  # (T,) absolute positions of the new tokens
    k_pos: torch.Tensor  # (S,) absolute positions of every key, cached ones first
    dtype: torch.dtype
    _memo: dict = field(default_factory=dict)

    def rotary(self, rotary: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        key = ("rope", id(rotary))
        if key not in self._memo:
            self._memo[key] = rotary.tables(self.q_pos, self.dtype)
        return self._memo[key]

    def allowed(self, window: int | None) -> torch.Tensor | None:
        """Bool (T, S): causal, and within `window` keys counting the query itself, as
        transformers' masks define it (kv > q - window). None when every key is visible."""
        key = ("mask", window)
        if key not in self._memo:
            q, k = self.q_pos[:, None], self.k_pos[None, :]
            allowed = k <= q
            if window is not None:
                allowed = allowed & (k > q - window)
            self._memo[key] = None if bool(allowed.all()) else allowed
        return self._memo[key]

    def is_plain_causal(self, window: int | None) -> bool:
        """True when the mask is exactly lower-triangular, so SDPA can take is_causal."""
        if len(self.q_pos) != len(self.k_pos) or len(self.q_pos) == 1:
            return False
        return window is None or window >= len(self.q_pos)
