"""What `verify` writes (`--json`, `--html`, `--save-golden`) obeys `convert`'s rule for OUT: never one of the
files the run reads (the checkpoint, the reference it compares with, the golden file it checks
against), inside one, or a directory holding one; an existing file is replaced only with --force,
and only if lmconvert wrote it. Checked before anything runs: a verify can take hours, and its
report is the last thing written."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmconvert.formats.atomic import Recogniser, atomic_file, check_output
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import read_json_object

from .golden import is_golden
from .html import is_html_report
from .report import SCHEMA


def is_report(file: Path) -> bool:
    """Whether `file` is a JSON report verify wrote (so --force may replace it)."""
    try:
        schema = read_json_object(file).get("schema")
    except InputError:
        return False
    return isinstance(schema, str) and schema.split("/")[0] == SCHEMA.split("/")[0]


RECOGNISERS: dict[str, Recogniser] = {"--json": is_report, "--html": is_html_report, "--save-golden": is_golden}


def check_outputs(outputs: Mapping[str, Path | None], read: tuple[Path, ...], force: bool) -> None:
    """Refuse, before the run, an output (by option) that is or holds an input, one that exists
    (without `force`, or not lmconvert's), and two options naming one file."""
    given = {option: path for option, path in outputs.items() if path is not None}
    seen: dict[Path, str] = {}
    for option, path in given.items():
        check_output(path, force, read, RECOGNISERS[option], f"{option} {path}")  # resolves it, or says why not
        where = path.resolve()
        if where in seen:
            raise InputError(f"{option} {path}: is also {seen[where]}'s file; give each its own path")
        seen[where] = option


def write_report(path: Path, report: dict[str, Any], force: bool) -> None:
    """The JSON report, atomically: a full disk leaves no truncated report behind."""
    with atomic_file(path, force, is_report, f"--json {path}") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
