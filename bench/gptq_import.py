"""GPTQ import speed and memory against `cp -r` of the same input, in one run.

Generates a LLaMA-3.2-1B-shaped GPTQ 4-bit checkpoint as gptqmodel writes them (every projection
as `qweight` int32 [in / 8, out], `qzeros` int32 [groups, out / 8], float16 `scales` [groups, out]
and `g_idx`, group_size 128, v1 zeros; embeddings and norms float16; 3 shards), packed as
tests/test_gptq.py's `pack` (gptqmodel's `pack_original`: input row 8r + j is field j of word r,
zeros packed alike along the outputs, then v1's whole-word subtraction), its integer weights and
zero points random over [0, 15] (0 and 15 included, as a real file's are), then times, each in its
own process: cp -r; lmconvert GPTQ -> canonical kept as it is (no --dtype); and GPTQ -> canonical
dequantized (--dtype bfloat16, --dtype float16). `--desc-act` gives every linear a permuted g_idx.

    python bench/gptq_import.py [--work DIR] [--repeat 3] [--desc-act] [--input disk|cache]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import LLAMA_3_2_1B, dir_bytes, write_sharded
from convert import cpu
from fp8_import import rounds

GROUP = 128
BITS = 4
V1_ADD = 0x11111111  # gptqmodel's convert_gptq_v1_to_v2_format_module at 4 bits (lmconvert.formats.gptq.V1_ADD)


def make_gptq_checkpoint(directory: Path, n_layers: int, desc_act: bool) -> Path:
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from gptq_import import _write; "
            f"_write({str(directory)!r}, {n_layers}, {desc_act})")
    subprocess.run([sys.executable, "-c", code], check=True)
    return directory


def pack(intw, zeros):  # noqa: ANN001, ANN202 - numpy arrays; tests/test_gptq.py's `pack`, a word row at a time
    """intw [out, in] and zeros [groups, out] (values in [0, 15]) -> qweight [in / 8, out], qzeros [groups, out / 8]
    int32, v1."""
    import numpy as np

    pf = 32 // BITS
    int_weight = intw.T.astype(np.uint32)  # [in, out]
    qweight = np.zeros((int_weight.shape[0] // pf, int_weight.shape[1]), dtype=np.uint32)
    for j in range(pf):
        qweight |= int_weight[j::pf] << np.uint32(BITS * j)
    z = zeros.astype(np.uint32)
    qzeros = np.zeros((z.shape[0], z.shape[1] // pf), dtype=np.uint32)
    for j in range(pf):
        qzeros |= z[:, j::pf] << np.uint32(BITS * j)
    qzeros -= np.uint32(V1_ADD)  # convert_gptq_v2_to_v1_format_module, wrapping as int32 does
    return qweight.view(np.int32), qzeros.view(np.int32)


def _write(directory: str, n_layers: int, desc_act: bool, shards: int = 3) -> None:
    import numpy as np
    import torch

    config = {**LLAMA_3_2_1B, "num_hidden_layers": n_layers, "dtype": "float16",
              "quantization_config": {"quant_method": "gptq", "bits": BITS, "group_size": GROUP, "sym": False,
                                      "desc_act": desc_act, "checkpoint_format": "gptq", "damp_percent": 0.01,
                                      "true_sequential": True, "static_groups": False}}
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)

    def make(name: str, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
        if "proj" not in name:
            return {name: (torch.randn(shape, generator=generator) * 0.02).half()}
        (out_f, in_f), groups = shape, shape[1] // GROUP
        qweight, qzeros = pack(rng.integers(0, 2 ** BITS, (out_f, in_f), dtype=np.uint8),
                               rng.integers(0, 2 ** BITS, (groups, out_f), dtype=np.uint8))
        order = rng.permutation(in_f) if desc_act else np.arange(in_f)
        g_idx = np.empty(in_f, dtype=np.int32)
        g_idx[order] = np.arange(in_f) // GROUP
        parts = {"qweight": torch.from_numpy(qweight), "qzeros": torch.from_numpy(qzeros),
                 "scales": (torch.rand(groups, out_f, generator=generator) * 0.01 + 1e-4).half(),
                 "g_idx": torch.from_numpy(g_idx)}
        return {f"{name.removesuffix('.weight')}.{part}": t for part, t in parts.items()}

    write_sharded(Path(directory), config, make, shards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each step's median is reported")
    parser.add_argument("--desc-act", action="store_true", help="permuted g_idx (act-order)")
    parser.add_argument("--input", choices=["disk", "cache"], default="cache", help="where each step's input is")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-gptq-"))
    try:
        src = make_gptq_checkpoint(work / "src", 16, args.desc_act)
        lm = [sys.executable, "-m", "lmconvert.cli", "convert"]
        steps = [
            ("cp -r", ["cp", "-r", str(src), str(work / "copy")], src, [work / "copy"]),
            ("lmconvert GPTQ -> canonical (kept)", [*lm, str(src), str(work / "kept"), "--max-shard-size", "1GB"],
             src, [work / "kept"]),
            *((f"lmconvert GPTQ -> canonical --dtype {dtype}", [*lm, str(src), str(work / dtype), "--dtype", dtype,
                                                                 "--max-shard-size", "1GB"], src, [work / dtype])
              for dtype in ("bfloat16", "float16")),
        ]
        print(f"CPU: {cpu()}")
        print(f"checkpoint: {dir_bytes(src) / 1e9:.2f} GB, 16 layers, GPTQ 4-bit group {GROUP}"
              f"{', desc_act' if args.desc_act else ''}; median of {args.repeat} rounds, input "
              f"{'in the page cache' if args.input == 'cache' else 'on disk'}")
        print(rounds(steps, args.repeat, args.input == "cache"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
