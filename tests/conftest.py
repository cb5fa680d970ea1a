import functools
import gc
import itertools
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# `make test-fast` runs the per-family cases of the parametrized tests for these families only (every
# family's in `make test`): together they exercise every variant the decoder has (norm kinds and
# placements, RoPE layouts and scalings, windows, soft-caps, QK norms, fused and Conv1D layouts,
# ALiBi, positions, latent and sparse attention, mixtures of experts), so an everyday run stays
# under two minutes as the families grow to a hundred. The families a change touches are added
# by the Makefile (`tools/changed_families.py`).
CORE_FAMILIES = ("llama", "mistral", "gemma2", "gemma3", "qwen3", "olmo2", "phi3", "cohere2", "gpt2", "gpt_neo",
                 "opt", "stablelm_qk", "falcon", "bloom", "mpt", "minicpm3", "mixtral", "qwen2_moe", "deepseek_v3",
                 "deepseek_v32")


# `make test-fast` loads this profile (`--hypothesis-profile=fast`): each hypothesis test runs a quarter of
# its examples (tests/examples_budget.py); `make test` runs hypothesis' default profile, every example.
FAST_EXAMPLES = 25


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Registers the `fast` profile before hypothesis' plugin loads the one asked for; hypothesis is imported
    only when one is (the AVX2 rerun imports no hypothesis test)."""
    if config.getoption("hypothesis_profile", None):
        from hypothesis import settings

        settings.register_profile("fast", max_examples=FAST_EXAMPLES)


def _family_names() -> set[str]:
    """Every name a per-family case can carry: the spec names and the families' model_types."""
    from family_specs import SPECS

    from lmconvert.mappings import BY_MODEL_TYPE, FAMILIES

    return set(SPECS) | set(FAMILIES) | set(BY_MODEL_TYPE)


def _kept(selected: set[str], names: set[str], item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    named = {value.split(":")[0] for value in params.values() if isinstance(value, str)} & names
    return not named or bool(named & selected)


@functools.cache
def _names_bitexact(path: Path) -> bool:
    return "bitexact" in path.read_text()


def _only_bitexact(config: pytest.Config) -> bool:
    """Whether the run's `-m` selects bitexact tests only (the AVX2 rerun's `bitexact and not slow`): no
    assignment of the expression's other markers lets a test without `bitexact` through."""
    if not config.option.markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression  # pytest's own parser of -m; absent: collect everything

        expression = Expression.compile(config.option.markexpr)
    except Exception:  # noqa: BLE001 - no -m, or a pytest without that parser: nothing is left out
        return False
    names = sorted({token for token in config.option.markexpr.replace("(", " ").replace(")", " ").split()
                    if token not in ("and", "or", "not", "bitexact")})

    def lets_through(marks: dict[str, bool]) -> bool:
        return expression.evaluate(lambda name, **_: marks.get(name, False))

    return not any(lets_through(dict(zip(names, values, strict=True)))
                   for values in itertools.product((False, True), repeat=len(names)))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A run of the bitexact tests only (the AVX2 rerun of `make test` and `make test-fast`) imports only
    the test modules that mark one: collecting the whole suite again cost each worker ~7 s. Every
    bitexact test's module names the marker (checked at every other collection, below)."""
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_") and _only_bitexact(config)
            and not _names_bitexact(collection_path)):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    outside = sorted({item.nodeid.split("::")[0] for item in items if item.get_closest_marker("bitexact")
                      and not _names_bitexact(Path(item.path))})
    if outside:
        raise pytest.UsageError(f"marked bitexact without naming the marker in their module: {outside}; "
                                "the bitexact-only rerun (tests/conftest.py, pytest_ignore_collect) would miss them")
    chosen = os.environ.get("LMCONVERT_FAMILIES")
    if not chosen:
        return
    names = _family_names()
    selected = {*CORE_FAMILIES, *chosen.split(",")} if chosen != "core" else set(CORE_FAMILIES)
    kept = [item for item in items if _kept(selected, names, item)]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (the modules, the parametrized items: ~580k objects with the whole suite) lives
    to the end of the run: frozen out of the garbage collector, so that each full collection during the
    run (`verify` makes one after the reference runs, before ours loads) no longer walks it again (~0.5-1.5 s
    each on the 2-core machine). Objects made by the tests are collected as before."""
    gc.collect()
    gc.freeze()
    gc.callbacks.append(_note_full_collection)


# Objects made after collection that live on (transformers' and torch's modules imported at a test's first
# use, the module-scoped checkpoints) were walked again by every full collection: in each xdist worker of
# `make test-fast` ~200k of them, ~0.1 s a walk, ~60 walks (verify makes one per reference run), ~14% of
# the workers' CPU. After a test during which a full collection ran, if this many unfrozen objects survived
# it, they are collected and frozen too; freezing never keeps garbage alive (what is unreachable at the
# collection is freed first), and frozen objects are still freed by reference counting when released.
REFREEZE_ABOVE = 20_000
_full_collection_ran = False


def _note_full_collection(phase: str, info: dict[str, int]) -> None:
    global _full_collection_ran  # noqa: PLW0603 - the gc callback's only way to tell the next teardown
    if phase == "stop" and info["generation"] == 2:
        _full_collection_ran = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201 - a hook wrapper
    yield
    global _full_collection_ran  # noqa: PLW0603
    if _full_collection_ran:
        _full_collection_ran = False
        if len(gc.get_objects(generation=2)) > REFREEZE_ABOVE:
            gc.collect()
            gc.freeze()
            _full_collection_ran = False  # this one's own

