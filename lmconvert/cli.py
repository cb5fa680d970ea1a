"""The `lmconvert` command line. Thin: parses arguments, calls lmconvert.convert, maps errors to
exit codes (0 ok, 1 parity failure, 2 bad input or usage)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

import click

from lmconvert.arch import ConfigError
from lmconvert.mappings import MappingError

from .convert.errors import InputError, ParityFailure

EXISTING_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
CHECKPOINT = click.Path(exists=True, path_type=Path)  # a directory, or a single-file format such as GGUF
DTYPE = click.Choice(["float32", "bfloat16", "float16"])


def _fail(message: str, code: int) -> None:
    click.echo(f"lmconvert: error: {message}", err=True)
    sys.exit(code)


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr, shown only on a terminal, driven by (done, total) callbacks."""
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            state["bar"] = click.progressbar(length=total, label=label, file=sys.stderr).__enter__()
        state["bar"].update(done - state["bar"].pos)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].__exit__(None, None, None)


def handled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One line on stderr and the exit code; the traceback only with --debug."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = click.get_current_context().find_root().params.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except (InputError, MappingError, ConfigError) as exc:
            if debug:
                raise
            _fail(str(exc), 2)
        except ParityFailure as exc:
            if debug:
                raise
            _fail(str(exc), 1)
        except KeyboardInterrupt:
            _fail("interrupted; no output was written", 130)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
@click.version_option(package_name="lmconvert")
def main(debug: bool) -> None:
    """Convert decoder-only LM checkpoints into one canonical implementation, prove they compute
    what transformers computes, and export them back to safetensors."""


@main.command()
@click.argument("src", type=CHECKPOINT)
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--to", "to", type=click.Choice(["canonical", "hf"]), default="canonical", show_default=True,
              help="canonical: HF directory -> canonical; hf: canonical -> HF safetensors.")
@click.option("--family", help="With --to hf: write as this family (default: the source's).")
@click.option("--dtype", type=click.Choice(["keep", "float32", "bfloat16", "float16"]), default="keep",
              show_default=True, help="Cast tensors on the way.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest output shard.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@handled
def convert(src: Path, out: Path, to: str, family: str | None, dtype: str, max_shard_size: str, force: bool) -> None:
    """Convert SRC into OUT. OUT appears complete or not at all."""
    from .convert.hf_source import parse_dtype
    from .convert.pipeline import convert as run
    from .convert.shards import parse_size

    if family and to != "hf":
        raise InputError("--family only applies with --to hf")
    kwargs: dict[str, Any] = {"dtype": parse_dtype(dtype), "max_shard_bytes": parse_size(max_shard_size),
                              "force": force}
    if to == "hf":
        kwargs["family"] = family
    with progress_bar(f"converting {src.name}") as progress:
        run(src, out, to, progress=progress, **kwargs)
    click.echo(f"wrote {out}")


@main.command()
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--reference", type=CHECKPOINT, help="HF directory to compare with (default: the recorded source).")
@click.option("--dtype", type=DTYPE, default="float32", show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--seq-len", type=click.IntRange(min=1), help="Tokens per sequence (default: past any window).")
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--json", "json_out", type=click.Path(path_type=Path, allow_dash=True),
              help="Also write the report as JSON to FILE ('-' for stdout).")
@handled
def verify(checkpoint: Path, reference: Path | None, dtype: str, device: str, seq_len: int | None, batch: int,
           json_out: Path | None) -> None:
    """Compare CHECKPOINT's logits with transformers'. Exit 1 when parity fails."""
    from .convert.verify import verify as run

    report = run(checkpoint, reference, dtype=dtype, device=device, seq_len=seq_len, batch=batch)
    if json_out is not None:
        text = json.dumps(report.to_dict(), indent=2)
        if str(json_out) == "-":
            click.echo(text)
        else:
            json_out.write_text(text + "\n")
    if json_out is None or str(json_out) != "-":
        click.echo(report.table())
    if not report.passed:
        raise ParityFailure(f"{checkpoint}: parity check failed ({report.criterion})")


@main.command()
@click.argument("checkpoint", type=EXISTING_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print the card as JSON.")
@handled
def inspect(checkpoint: Path, as_json: bool) -> None:
    """Print CHECKPOINT's architecture card: family, variants, sizes."""
    from .convert.card import card, format_card

    info = card(checkpoint)
    click.echo(json.dumps(info, indent=2) if as_json else format_card(info))


@main.command()
@click.argument("checkpoint", type=EXISTING_DIR)
@click.option("--prompt", required=True)
@click.option("--max-new-tokens", type=click.IntRange(min=0), default=32, show_default=True)
@click.option("--dtype", type=DTYPE)
@click.option("--device", default="cpu", show_default=True)
@handled
def generate(checkpoint: Path, prompt: str, max_new_tokens: int, dtype: str | None, device: str) -> None:
    """Greedy decoding with the KV cache and the checkpoint's tokenizer."""
    from .convert.generation import generate as run

    click.echo(prompt + run(checkpoint, prompt, max_new_tokens, dtype=dtype, device=device))


if __name__ == "__main__":
    main()
