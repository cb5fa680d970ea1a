"""The C extension lmconvert.formats._ggml (lmconvert/formats/_ggml.c: GGUF-in dequantization and
llama.cpp's K-quant encoders); everything else is in pyproject.toml.

Its results are bit for bit gguf-py's and llama.cpp's only without contracted or reassociated float
operations: -ffp-contract=off (no fused multiply-add, whatever -march a user's CFLAGS add) and no
-ffast-math. The rest are ggml-base's own flags (-O3 -std=gnu11, and not Python's -fwrapv): where a
K-quant block's scale is Inf, its bytes follow which NaN payload survives an addition, which depends
on the order the compiler gives commutative operands, so the code is generated as llama.cpp's is.
A failed build is reported in one line, naming what is missing."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FLAGS = ["-O3", "-std=gnu11", "-fno-wrapv", "-ffp-contract=off", "-fno-fast-math"]


class BuildGgml(build_ext):
    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":  # gcc or clang; MSVC contracts nothing without /fp:fast
            for ext in self.extensions:
                ext.extra_compile_args = FLAGS
        try:
            super().build_extensions()
        except Exception as e:  # the compiler's own errors are printed above this line
            raise SystemExit(f"lmconvert: building the C extension lmconvert/formats/_ggml.c failed ({e}); it needs "
                             "a C compiler (gcc or clang) and Python's headers (Debian: apt-get install gcc "
                             "python3-dev)") from None


setup(ext_modules=[Extension("lmconvert.formats._ggml", ["lmconvert/formats/_ggml.c"])],
      cmdclass={"build_ext": BuildGgml})
