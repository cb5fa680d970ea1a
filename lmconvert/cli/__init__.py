"""The `lmconvert` command line. Thin: parses arguments (`args.py`), calls the rooms below, and
maps errors to exit codes a CI can tell apart (EXIT_CODES)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

import click

# numpy only does elementwise work here (the NaN/Inf check, GGUF dequantization; torch has its own
# BLAS), and its OpenBLAS thread pool would spin on the cores that a conversion copies and hashes with
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from lmconvert.arch.errors import LmconvertError
from lmconvert.formats.errors import InputError, IntegrityError
from lmconvert.runtime.launch import launched
from lmconvert.verify.errors import ParityFailure

from .args import CASTS, check_device, check_sampling, parse_cast, parse_memory, parse_size
from .progress import TENSORS, ProgressLine
from .torchrun import RANK_DIR, command_line, launch, rank_streams, record_code

# Each command imports the rooms it runs inside its function: `lmconvert --help`, `inspect` and a
# rename-only conversion then never import torch or transformers (over a second each).
EXISTING_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
CHECKPOINT = click.Path(exists=True, path_type=Path)  # a directory, or a single-file format such as GGUF
DTYPE = click.Choice(CASTS)
CAST = click.Choice(["keep", *CASTS])
PARITY, BAD_INPUT, BUG = 1, 2, 3
SIGPIPE_EXIT = 141  # as a shell reports a program ended by SIGPIPE
EXIT_CODES = f"""\b
Exit codes:
  0  success
  {PARITY}  the parity check (verify), the integrity check (verify --files, an export) or the
     comparison (diff) failed
  {BAD_INPUT}  bad input or usage: one line names the file or argument and what to do
  {BUG}  internal error: a bug in lmconvert; rerun with --debug for the traceback
  {SIGPIPE_EXIT}  what read the output stopped reading (`| head`): ended quietly"""


def _fail(message: str, code: int, now: bool = False) -> None:
    """One line, whatever a file name in the message holds: control characters are escaped. `now`
    (Ctrl-C) leaves without the interpreter's teardown, which joins worker threads: huggingface_hub's
    download threads would finish a multi-GB shard first."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    if os.environ.get("RANK", "0") == "0" or RANK_DIR in os.environ:  # under torchrun, rank 0 speaks for all
        # (under `verify --nproc` each rank writes to a file of its own, shown when that rank speaks)
        click.echo(f"lmconvert: error: {line}", err=True)
    if now:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@contextmanager
def progress_line() -> Iterator[ProgressLine]:
    """The command's progress line (`progress.py`), ended before the result or the error is printed."""
    line = ProgressLine()
    try:
        yield line
    finally:
        line.close()


def _reader_gone() -> None:
    """Exit 141 without a word: stdout and stderr now lead nowhere, so the interpreter's final flush of
    what was still buffered for the closed pipe cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            pass
    os._exit(SIGPIPE_EXIT)


def handled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One line on stderr and the exit code; the traceback only with --debug. An exception nobody
    expected is a bug, and exits 3 rather than 1, which a CI reads as "the model is wrong"."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = click.get_current_context().find_root().params.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: usage errors exit 2
        except LmconvertError as exc:  # ours: bad input 2, a failed check 1, anything else a bug
            if debug:
                raise
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:  # outputs were rolled back on the way here; nothing else is waited for
            _fail("interrupted; no output was written", 130, now=True)
        except BrokenPipeError as exc:  # what reads our output stopped (`| head`): leave as a program SIGPIPE
            if exc.filename is not None or debug:  # ends, silently (141 = 128 + SIGPIPE); not a file of ours
                raise
            _reader_gone()
        except OSError as exc:  # disk full, permissions: the output was rolled back
            if debug:
                raise
            where = f"{exc.filename}: " if exc.filename else ""  # every writer names its own file (formats.atomic)
            _fail(f"{where}{exc.strerror or exc}; nothing was written (check free space and permissions)", BAD_INPUT)
        except Exception as exc:  # noqa: BLE001 - every other exception is a bug, said so in one line
            if debug:
                raise
            what = " ".join(str(exc).split())[:200]
            _fail(f"internal error ({type(exc).__name__}{': ' + what if what else ''}); this is a bug in lmconvert: "
                  "rerun with --debug (lmconvert --debug COMMAND ...) and report the traceback", BUG)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
@click.version_option(package_name="lmconvert")
def main(debug: bool) -> None:
    """Convert decoder-only LM checkpoints into one canonical implementation, prove they compute
    what transformers computes, and export them back to safetensors."""


@main.command()
@click.argument("src", type=CHECKPOINT)
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--to", "to", type=click.Choice(["canonical", "hf", "meta", "gguf"]),
              help="What to write, from any format lmconvert reads, in one step: canonical; hf: HF safetensors; "
                   "meta: Meta's params.json + consolidated.NN.pth (LLaMA models); gguf: one llama.cpp file "
                   "[default: gguf when OUT ends in .gguf, else canonical].")
@click.option("--family", help="With --to hf or gguf: write as this family (default: the source's).")
@click.option("--quant", help="With --to gguf: the tensor type, f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                              "tq1_0, tq2_0, mxfp4, or a K-quant q2_k, q3_k, q4_k, q5_k, q6_k (1-D tensors stay f32) "
                              "[default: q8_0].")
@click.option("--gguf-pre", help="With --to gguf: llama.cpp's name for a BPE tokenizer's pre-tokenizer, when "
                                 "llama.cpp's converter would not recognise it (e.g. gpt-2, llama-bpe, qwen2).")
@click.option("--shards", type=click.IntRange(min=1), help="With --to meta: model-parallel ranks [default: 1].")
@click.option("--dtype", type=CAST, default="keep",
              show_default=True, help="Cast tensors on the way.")
@click.option("--max-shard-size", help="Largest output shard [default: 5GB; --to gguf: one file unless given, "
                                       "then OUT is a directory of llama.cpp's split files].")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--allow-nonfinite", is_flag=True, help="Convert even if weights hold NaN or Inf.")
@click.option("--record-source", is_flag=True,
              help="With --to gguf: record the source's local path in the file (for verify OUT.gguf). A pulled "
                   "source is always recorded as its Hub repo and commit; a local one is not, unless asked: "
                   "these files get shared.")
@handled
def convert(src: Path, out: Path, to: str | None, family: str | None, quant: str | None, gguf_pre: str | None,
            shards: int | None, dtype: str, max_shard_size: str | None, force: bool, allow_nonfinite: bool,
            record_source: bool) -> None:
    """Convert SRC (any format lmconvert reads) into OUT in one step. OUT appears complete or not at all."""
    from lmconvert.convert import convert as run
    from lmconvert.convert import target_for

    to = target_for(out, to)
    if family and to not in ("hf", "gguf"):
        raise InputError("--family only applies with --to hf or --to gguf")
    if quant is not None and to != "gguf":
        raise InputError("--quant only applies with --to gguf; use --dtype to cast other outputs")
    if gguf_pre is not None and to != "gguf":
        raise InputError("--gguf-pre only applies with --to gguf")
    if record_source and to != "gguf":
        raise InputError("--record-source only applies with --to gguf")
    if to == "gguf" and dtype != "keep":
        raise InputError("--dtype does not apply with --to gguf: choose the tensor type with --quant")
    kwargs: dict[str, Any] = {"dtype": parse_cast(dtype), "max_shard_bytes": parse_size(max_shard_size or "5GB"),
                              "force": force, "allow_nonfinite": allow_nonfinite}
    if to in ("hf", "gguf"):
        kwargs["family"] = family
    if to == "gguf":  # one file, unless split: then OUT is a directory of llama.cpp's split files
        kwargs.update({"gguf_pre": gguf_pre, "record_source": record_source,
                       "max_shard_bytes": parse_size(max_shard_size) if max_shard_size else None}
                      | ({"quant": quant} if quant is not None else {}))
    if shards is not None and to != "meta":
        raise InputError("--shards only applies with --to meta")
    if to == "meta":
        kwargs["shards"] = shards or 1
    with progress_line() as line:
        note = run(src, out, to, progress=line.stage(f"converting {src.name}"), **kwargs)
    if note:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {out}")


@main.command()
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--reference", type=CHECKPOINT, help="HF directory to compare with (default: the recorded source).")
@click.option("--dtype", type=DTYPE, help="Compute dtype [default: float32, or the golden file's].")
@click.option("--device", help="cpu, cuda or cuda:N; both sides run there; a bare cuda spreads transformers over "
                                "every visible GPU [default: cpu; under torchrun, where the ranks run].")
@click.option("--seq-len", type=click.IntRange(min=1),
              help="Tokens per sequence (default: past any window); at most the model's max_positions.")
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True,
              help="Sequences; a batch whose logits and hidden states need more memory than is available "
                   "is refused before anything is allocated.")
@click.option("--padded", is_flag=True,
              help="Rows of different lengths, left-padded under an attention mask (batched inference's shape).")
@click.option("--generate", "new_tokens", type=click.IntRange(min=0), default=16, show_default=True,
              help="Greedy tokens both sides generate from the first row (0: skip); at most max_positions, "
                   "fewer when the prompt leaves less room.")
@click.option("--max-memory", help="Models larger than memory: transformers keeps at most this much resident "
                                   "(accelerate offloads the rest to disk); ours streams one block at a time.")
@click.option("--golden", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Check against this golden file instead of transformers (transformers not needed).")
@click.option("--save-golden", type=click.Path(dir_okay=False, path_type=Path),
              help="Also store the token batch and transformers' outputs as a golden file.")
@click.option("--json", "json_out", type=click.Path(path_type=Path, allow_dash=True),
              help="Also write the report as JSON to FILE ('-' for stdout).")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the report as one self-contained HTML page to FILE (the error profile plotted; "
                   "needs matplotlib: lmconvert[html]).")
@click.option("--files", "files_only", is_flag=True,
              help="Only re-hash a canonical checkpoint's files and tensors against lmconvert.json.")
@click.option("--force", is_flag=True, help="Replace the --json, --html or --save-golden file if it exists (only one "
                                            "lmconvert wrote).")
@click.option("--nproc", type=click.IntRange(min=1),
              help="Run tensor-parallel over N ranks: launches torchrun (standalone, this machine) and exits "
                   "with lmconvert's exit code, where torchrun's is 1 for any failure.")
@handled
def verify(checkpoint: Path, reference: Path | None, dtype: str | None, device: str, seq_len: int | None, batch: int,
           padded: bool, new_tokens: int, max_memory: str | None, golden: Path | None, save_golden: Path | None,
           json_out: Path | None, html_out: Path | None, files_only: bool, force: bool, nproc: int | None) -> None:
    """Compare CHECKPOINT with transformers layer by layer, logit by logit and through greedy
    generation. Exit 1 when parity fails."""
    if nproc is not None:
        if files_only:
            raise InputError("--nproc does not apply with --files (which only re-hashes the files)")
        if launched():
            raise InputError("--nproc launches torchrun itself; under torchrun, drop --nproc "
                             "(the ranks are torchrun's --nproc-per-node)")
        from lmconvert.verify.parallel import check_ranks

        check_ranks(checkpoint, nproc)  # a split that cannot be is refused here, before torchrun starts
        ctx = click.get_current_context()
        ctx.exit(launch("verify", command_line(ctx, "nproc"), nproc, ctx.find_root().params.get("debug", False)))
    if files_only:
        from lmconvert.formats.integrity import check_files

        integrity = check_files(checkpoint)
        click.echo("\n".join(integrity.lines()))
        if not integrity.passed:
            problems = integrity.problems()
            raise IntegrityError(f"{checkpoint}: integrity check failed: {', '.join(problems[:5])} changed, missing "
                                 "or added since conversion (see above)")
        return

    from lmconvert.verify.html import check_available, write_html
    from lmconvert.verify.outputs import write_report
    from lmconvert.verify.parallel import verify as run  # tensor-parallel under torchrun

    if html_out is not None:
        check_available()
    to_file = json_out if json_out is not None and str(json_out) != "-" else None
    with progress_line() as line:
        report = run(checkpoint, reference, dtype=dtype, device=device and check_device(device), seq_len=seq_len,
                     batch=batch, generate=new_tokens, max_memory=parse_memory(max_memory), golden=golden,
                     save_golden=save_golden, padded=padded, force=force,
                     writes={"--json": to_file, "--html": html_out}, stages=None if launched() else line.layer_stages)
    if report is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    if to_file is not None:
        write_report(to_file, report.to_dict(), force)
    elif json_out is not None:
        click.echo(json.dumps(report.to_dict(), indent=2))
    if html_out is not None:
        write_html(html_out, report.to_dict(), force)
    if json_out is None or str(json_out) != "-":
        click.echo(report.table())
    if save_golden is not None:
        click.echo(f"wrote golden file {save_golden}", err=True)
    if not report.passed:
        raise ParityFailure(f"{checkpoint}: parity check failed ({', '.join(report.failures())}); "
                            f"criterion: {report.criterion}")


@main.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--atol", type=float, default=0.0, show_default=True, help="Absolute tolerance per element.")
@click.option("--rtol", type=float, default=0.0, show_default=True,
              help="Relative tolerance per element: |a - b| <= atol + rtol * max(|a|, |b|).")
@click.option("--json", "json_out", type=click.Path(path_type=Path, allow_dash=True),
              help="Also write the report as JSON to FILE ('-' for stdout).")
@click.option("--force", is_flag=True, help="Replace the --json file if it exists (only one lmconvert wrote).")
@handled
def diff(a: Path, b: Path, atol: float, rtol: float, json_out: Path | None, force: bool) -> None:
    """Compare checkpoints A and B tensor by tensor. Any formats lmconvert reads (HF safetensors or .bin,
    canonical, Meta, GGUF with its quantized tensors dequantized), matched by canonical name: shapes,
    dtypes, max |Δ|, relative error, identical bits. Exit 1 when a tensor differs beyond the tolerance
    or only one side has it."""
    from lmconvert.convert.diff import TensorsDiffer, Tolerance
    from lmconvert.convert.diff import diff as run

    tolerance = Tolerance(atol, rtol)
    to_file = json_out if json_out is not None and str(json_out) != "-" else None
    to_stdout = json_out is not None and to_file is None
    if to_stdout:  # the JSON at the end, and a progress bar meanwhile
        with progress_line() as line:
            report = run(a, b, tolerance, to_file, force, progress=line.stage(f"comparing {a.name} and {b.name}",
                                                                              TENSORS))
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:  # each tensor's line as it is compared
        report = run(a, b, tolerance, to_file, force, show=click.echo)
    if not report.passed:
        raise TensorsDiffer(f"{a} and {b} differ: {report.failures()}; criterion: {tolerance.criterion()}")


@main.command()
@click.argument("checkpoint")
@click.option("--json", "as_json", is_flag=True, help="Print the card as JSON.")
@click.option("--revision", help="With a REPO_ID: branch, tag or commit sha (default: the repo's main branch).")
@click.option("--token", help="With a REPO_ID: Hub access token for gated or private repos (default: HF_TOKEN or the "
                              "saved login).")
@handled
def inspect(checkpoint: str, as_json: bool, revision: str | None, token: str | None) -> None:
    """Print CHECKPOINT's architecture card: family, variants, sizes, KV cache per token. CHECKPOINT is
    a local path, or a Hub repo id (owner/name, when no such path exists): then only config.json and
    the safetensors headers are fetched (range requests), no weights."""
    from lmconvert.runtime.card import card, card_of, format_card

    path = Path(checkpoint)
    if path.exists() or not _is_repo_id(checkpoint):
        if revision is not None or token is not None:
            raise InputError(f"{checkpoint}: --revision and --token apply to a Hub repo id, not a local path")
        if not path.exists():
            raise InputError(f"{checkpoint}: no such file or directory, and not a Hub repo id (owner/name)")
        info = card(path)
    else:
        from lmconvert.convert.hub import remote_checkpoint

        with remote_checkpoint(checkpoint, revision, token, quiet=not sys.stderr.isatty()) as remote:
            info = card_of(remote)
    click.echo(json.dumps(info, indent=2) if as_json else format_card(info))


def _is_repo_id(text: str) -> bool:
    from lmconvert.convert.hub import is_repo_id

    return is_repo_id(text)


@main.command()
@click.argument("checkpoint", type=CHECKPOINT)
@click.option("--prompt", required=True, help="Text to continue (in chat: the user's message); empty: start from "
                                              "the tokenizer's BOS token.")
@click.option("--max-new-tokens", type=click.IntRange(min=0), default=32, show_default=True,
              help="At most what the model's max_positions leaves after the prompt.")
@click.option("--chat/--no-chat", default=None,
              help="Wrap the prompt in the tokenizer's chat template as the user's message and print only the "
                   "reply [default: --chat when the tokenizer has a template].")
@click.option("--system", help="With --chat: a system message before the prompt.")
@click.option("--temperature", type=float, help="Sample at this temperature; 0: greedy [default: the checkpoint's "
                                                "generation_config.json, as transformers: greedy unless do_sample].")
@click.option("--top-k", type=int, help="Sample from the K most likely tokens; 0: all [default: the generation "
                                        "config's, else 50]. Any of --temperature, --top-k, --top-p samples.")
@click.option("--top-p", type=float, help="Sample from the smallest set of tokens whose probability reaches P, in "
                                          "(0, 1] [default: the generation config's, else 1].")
@click.option("--seed", type=int, help="Seed torch's RNG first: the same tokens as transformers' generate after "
                                       "torch.manual_seed(SEED) on the same device.")
@click.option("--dtype", type=DTYPE)
@click.option("--device", default="cpu", show_default=True)
@handled
def generate(checkpoint: Path, prompt: str, max_new_tokens: int, chat: bool | None, system: str | None,
             temperature: float | None, top_k: int | None, top_p: float | None, seed: int | None, dtype: str | None,
             device: str) -> None:
    """Generate text with the KV cache and the checkpoint's tokenizer, greedy or sampled as transformers'
    generate, streamed to stdout as it comes; tokens/s on stderr at the end."""
    from lmconvert.runtime.generation import Request
    from lmconvert.runtime.generation import generate as run

    check_sampling(temperature, top_k, top_p, system, chat)
    request = Request(max_new_tokens, chat, system, temperature, top_k, top_p, seed)

    def started(chat: bool) -> None:  # outside chat the prompt is echoed first, once nothing can fail any more
        if not chat:
            click.echo(prompt, nl=False)

    def write(text: str) -> None:
        click.echo(text, nl=False)
        sys.stdout.flush()

    done = run(checkpoint, prompt, request, dtype=dtype, device=check_device(device), started=started, write=write,
               note=lambda line: click.echo(line, err=True))
    click.echo()
    click.echo(done.rate(), err=True)


@main.command()
@click.argument("repo_id")
@click.option("--revision", help="Branch, tag or commit sha (default: the repo's main branch).")
@click.option("--out", type=click.Path(path_type=Path), help="Output directory (default: ./<repo name>).")
@click.option("--verify", "check", is_flag=True, help="Then verify against the download; exit 1 when parity fails.")
@click.option("--dtype", type=CAST, default="keep",
              show_default=True, help="Cast tensors on the way; also --verify's compute dtype (keep: float32).")
@click.option("--device", default="cpu", show_default=True, help="Device for --verify.")
@click.option("--token", help="Hub access token for gated or private repos (default: HF_TOKEN or the saved login).")
@click.option("--file", "file", metavar="PATTERN",
              help="From a GGUF repo: the one .gguf file this pattern matches (e.g. '*Q4_K_M.gguf'), or every part "
                   "of the one split set it matches; converted as `convert FILE.gguf OUT` does [default OUT: "
                   "./<file name>].")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@handled
def pull(repo_id: str, revision: str | None, out: Path | None, check: bool, dtype: str, device: str,
         token: str | None, file: str | None, force: bool) -> None:
    """Download REPO_ID from the Hugging Face Hub into the HF cache and convert it to canonical: a
    transformers repo, or with --file one GGUF file (or split set) of a GGUF repo."""
    from lmconvert.convert.hub import pull as run
    from lmconvert.verify.run import verify as run_verify

    if check:
        check_device(device)
    with progress_line() as line:
        snapshot, out = run(repo_id, out, revision=revision, token=token, dtype=parse_cast(dtype), force=force,
                            fetching=line.stage(f"downloading {repo_id}"), progress=line.stage(f"converting {repo_id}"),
                            quiet=not sys.stderr.isatty(), file=file)
    what = f"{repo_id}@{snapshot.sha}" + (f": {snapshot.files[0]}" if file is not None else "")
    click.echo(f"wrote {out} from {what}" + (f" ({len(snapshot.files)} parts)" if len(snapshot.files) > 1 and file
                                            else ""))
    if check:
        with progress_line() as line:
            report = run_verify(out, dtype="float32" if dtype == "keep" else dtype, device=device,
                                stages=line.layer_stages)
        click.echo(report.table())
        if not report.passed:
            raise ParityFailure(f"{out}: parity check failed against {repo_id}@{snapshot.sha} ({report.criterion})")


def entry() -> None:
    """The `lmconvert` command: `main`. Under torchrun each rank leaves without the interpreter's
    teardown once its output is flushed. DTensor's caches keep the process groups alive past
    `destroy_process_group`, and a gloo group freed during the teardown can abort a rank whose work is
    done (SIGABRT, "terminate called without an active exception": a worker thread frees a tensor
    Python owned and dies taking the GIL; pytorch/pytorch#190489), which a CI would read as a crash."""
    if not launched():
        main()
        return
    rank_streams()  # under `verify --nproc`: into files of this rank's own
    try:
        main()
        code: object = 0
    except SystemExit as exc:  # click ends every run with one, carrying the exit code
        code = exc.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what sys.exit("message") would have done
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    record_code(code or 0)  # under `verify --nproc`: what torchrun's exit status cannot carry
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
