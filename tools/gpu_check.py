"""The whole GPU check in one go (`make gpu-check`): the `pytest -m gpu` suite, then `lmconvert
verify --device cuda` on a tiny perturbed checkpoint in each dtype (in memory, and streamed with
accelerate offloading). Everything goes to stdout and to a log file; the exit status is non-zero
if any step fails, and also when there is no CUDA device: skipped is not passed.

    python tools/gpu_check.py [LOG]    # default: gpu-check.log
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16", "float16")


class Log:
    def __init__(self, path: Path) -> None:
        self.file = open(path, "w", buffering=1)  # noqa: SIM115 - held for the whole run

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        self.file.write(text)


def run(log: Log, title: str, argv: list[str], no_skips: bool = False) -> bool:
    """Run one step, its output streamed to the log; with `no_skips`, a skipped test fails the step."""
    log.write(f"\n=== {title}\n$ {' '.join(argv)}\n")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    skipped = False
    for line in proc.stdout:
        log.write(line)
        skipped = skipped or (no_skips and line.startswith("SKIPPED"))
    ok = proc.wait() == 0 and not skipped
    why = f"exit {proc.returncode}" + (", tests skipped" if skipped else "")
    log.write(f"=== {title}: {'ok' if ok else f'FAILED ({why})'}\n")
    return ok


def main() -> int:
    log = Log(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "gpu-check.log"))
    python = sys.executable
    results = {"CUDA device": run(log, "CUDA device", [python, "-c", (
        "import torch, transformers; assert torch.cuda.is_available(), 'no CUDA device: this check needs one'; "
        "print(torch.cuda.get_device_name(0), '| torch', torch.__version__, '| CUDA', torch.version.cuda, "
        "'| transformers', transformers.__version__)")])}
    if not results["CUDA device"]:
        log.write("\nGPU check FAILED: no CUDA device\n")
        return 1
    results["pytest -m gpu"] = run(log, "pytest -m gpu", [python, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py",
                                                         "-q", "-rs", "-p", "no:cacheprovider"], no_skips=True)
    with tempfile.TemporaryDirectory(prefix="lmconvert-gpu-") as tmp:
        hf, canonical = Path(tmp) / "hf", Path(tmp) / "canonical"
        make = ("import sys; sys.path.insert(0, 'tests'); from pathlib import Path; "
                "from hf_models import build_model, save_checkpoint; "
                f"save_checkpoint(build_model('llama', attention_bias=True), Path({str(hf)!r}))")
        results["tiny checkpoint"] = run(log, "tiny checkpoint", [python, "-c", make]) and run(
            log, "convert", [python, "-m", "lmconvert.cli", "convert", str(hf), str(canonical)])
        for dtype in DTYPES:
            for extra in ([], ["--max-memory", "100KB"]):
                title = f"verify --device cuda --dtype {dtype} {' '.join(extra)}".strip()
                results[title] = results["tiny checkpoint"] and run(log, title, [
                    python, "-m", "lmconvert.cli", "verify", str(canonical), "--device", "cuda", "--dtype", dtype,
                    *extra])
    log.write("\n=== summary\n" + "".join(f"{'ok    ' if ok else 'FAILED'}  {name}\n" for name, ok in results.items()))
    passed = all(results.values())
    log.write(f"GPU check {'passed' if passed else 'FAILED'}\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
