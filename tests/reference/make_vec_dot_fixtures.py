#!/usr/bin/env python3
"""Writes tests/fixtures/llamacpp/vec_dot.gguf: llama.cpp's own dot products
(ggml-cpu's `vec_dot` of each type, through ctypes) of random weight rows with
random activations, for the weight types no registry model covers (and IQ4_NL with an odd count of
blocks, IQ4_XS), so that the
CPU backend's kernels are checked against llama.cpp's bit for bit.

For every type T (lower-case t) the file holds:
  t.w    - T: ROWS random rows (random bytes, scales made finite and small)
  t.x    - F32: NX activation rows of the same length
  t.dot  - F32: llama.cpp's dot of every (activation row, weight row), row
           major by activation row; the activations quantized by llama.cpp's
           own `from_float` of the type's `vec_dot_type` (Q8_K or Q8_0)

Run once with a llama.cpp build (ggml-cpu is built for the host CPU: its x86
build takes the AVX2 paths for these types, what blockdraft's x86 kernels
follow) and commit the output:
  python3 tests/reference/make_vec_dot_fixtures.py ~/.cache/blockdraft/llama.cpp/build/bin
Needs numpy and the PyPI `gguf` package (0.19.0).
"""
import ctypes
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "llamacpp", "vec_dot.gguf")
ROWS, NX = 6, 3
TYPES = [Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M,
         Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4, Q.IQ4_NL, Q.IQ4_XS]
# Row lengths: three super-blocks, or an odd count of 32-blocks (the FP4
# kernels pair blocks and finish an odd one apart).
COLS = {Q.MXFP4: 224, Q.NVFP4: 192, Q.IQ4_NL: 224}


class TypeTraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def finite_scales(qt, raw, rng):
    """Small finite scales in the fields random bytes would make anything."""
    n = raw.shape[0]
    f16 = lambda: (rng.uniform(-0.05, 0.05, n)).astype(np.float16).view(np.uint8).reshape(n, 2)
    at = {Q.IQ2_XXS: 0, Q.IQ2_XS: 0, Q.IQ2_S: 0, Q.IQ3_XXS: 0, Q.IQ3_S: 0, Q.IQ1_S: 0,
          Q.TQ1_0: 52, Q.TQ2_0: 64, Q.IQ4_NL: 0, Q.IQ4_XS: 0}
    if qt in at:
        raw[:, at[qt]:at[qt] + 2] = f16()
    elif qt == Q.IQ1_M:
        bits = f16().copy().view(np.uint16).reshape(n)
        for k in range(4):
            nib = ((bits >> (4 * k)) & 0xF).astype(np.uint8)
            raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (nib << 4)
    elif qt == Q.MXFP4:
        raw[:, 0] = rng.integers(118, 125, n, dtype=np.uint8)
    elif qt == Q.NVFP4:
        raw[:, 0:4] &= 0x1F


def main():
    bin_dir = sys.argv[1]
    lib = ctypes.CDLL(os.path.join(bin_dir, "libggml-cpu.so"))
    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    lib.ggml_cpu_init()
    rng = np.random.default_rng(20261206)

    w = gguf.GGUFWriter(OUT, arch="vec-dot-fixtures")
    w.add_string("fixtures.generator", "llama.cpp ggml-cpu vec_dot via ctypes (tests/reference/make_vec_dot_fixtures.py)")
    for qt in TYPES:
        name = qt.name.lower()
        block_len, type_size = gguf.GGML_QUANT_SIZES[qt]
        cols = COLS.get(qt, 768)
        raw = rng.integers(0, 256, (ROWS * cols // block_len, type_size), dtype=np.uint8)
        finite_scales(qt, raw, rng)
        x = rng.uniform(-1, 1, (NX, cols)).astype(np.float32)

        traits = lib.ggml_get_type_traits_cpu(int(qt)).contents
        act = lib.ggml_get_type_traits_cpu(traits.vec_dot_type).contents
        act_block, act_size = gguf.GGML_QUANT_SIZES[Q(traits.vec_dot_type)]
        from_float = FROM_FLOAT(act.from_float)
        vec_dot = VEC_DOT(traits.vec_dot)

        row_bytes = cols // block_len * type_size
        wbuf = np.ascontiguousarray(raw.reshape(ROWS, row_bytes))
        dots = np.zeros((NX, ROWS), dtype=np.float32)
        for i in range(NX):
            xq = np.zeros(cols // act_block * act_size, dtype=np.uint8)
            xr = np.ascontiguousarray(x[i])
            from_float(xr.ctypes.data, xq.ctypes.data, cols)
            for r in range(ROWS):
                s = ctypes.c_float()
                wr = np.ascontiguousarray(wbuf[r])
                vec_dot(cols, ctypes.addressof(s), 0, wr.ctypes.data, 0, xq.ctypes.data, 0, 1)
                dots[i, r] = s.value
        assert np.all(np.isfinite(dots)), name
        w.add_tensor(f"{name}.w", raw.reshape(-1), raw_shape=[ROWS, row_bytes], raw_dtype=qt)
        w.add_tensor(f"{name}.x", x)
        w.add_tensor(f"{name}.dot", dots)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
