"""A registry of kinds by name (attention kinds, token-mixer kinds): each declared once, a second
declaration under a taken name refused, and a config value naming none refused in one line."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from .errors import ConfigError


class Named(Protocol):
    name: str


K = TypeVar("K", bound=Named)


class Kinds(dict[str, K], Generic[K]):
    """name -> kind; `field` is the ArchConfig field that names one (its refusal says so)."""

    def __init__(self, what: str, field: str) -> None:
        super().__init__()
        self.what, self.field = what, field

    def register(self, kind: K) -> K:
        """Adds a kind; a second kind under a taken name would silently replace the first, so it fails."""
        if kind.name in self:
            raise ValueError(f"{self.what} {kind.name!r} is already registered")
        self[kind.name] = kind
        return kind

    def unregister(self, name: str) -> None:
        del self[name]

    def named(self, name: Any) -> K:  # noqa: ANN401 - a config value, unchecked
        """The kind `ArchConfig.<field>` names; a ConfigError naming the value when none is registered."""
        try:
            return self[name]
        except (KeyError, TypeError):
            known = ", ".join(self) or "none registered"
            raise ConfigError(f"ArchConfig.{self.field}={name!r}: must be one of {known}") from None
