"""How many examples a hypothesis test runs: its full count in `make test` (hypothesis' default profile,
whose 100 examples are the unit), a quarter of it in `make test-fast`, which loads the `fast` profile
(`--hypothesis-profile=fast`, registered in conftest.py). The same properties over the same derandomized
generator, fewer examples of each in everyday runs; `make test` and CI run every one."""

from __future__ import annotations

from hypothesis import settings

UNIT = 100  # hypothesis' default max_examples, which `make test` runs under


def examples(full: int) -> int:
    """`full` under the default profile, scaled by the loaded profile's max_examples (never below 10)."""
    return max(10, full * settings().max_examples // UNIT)
