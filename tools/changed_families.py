"""The families a change touches, for `make test-fast`'s LMCONVERT_FAMILIES: the family modules and
test specs that differ from the main branch's merge base, or are not yet committed. Prints
`core` when there are none (or no git), so the selection is never empty."""

from __future__ import annotations

import subprocess
from pathlib import Path

WATCHED = ("lmconvert/mappings/families/", "tests/specs/")


def changed() -> list[str]:
    def git(*args: str) -> list[str]:
        done = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
        return done.stdout.split() if done.returncode == 0 else []

    base = git("merge-base", "HEAD", "main")
    paths = git("diff", "--name-only", *(base[:1] or ["HEAD"])) + git("ls-files", "--others", "--exclude-standard")
    return sorted({Path(p).stem for p in paths if p.startswith(WATCHED) and p.endswith(".py")} - {"__init__"})


if __name__ == "__main__":
    print(",".join(changed()) or "core")
