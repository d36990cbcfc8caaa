#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/quants.gguf: reference data for blockdraft-gguf's
dequantizers and quantizers, produced by the PyPI `gguf` package (0.19.0).

For every type T (lower-case name t) the file holds:
  t.raw  - random blocks of type T: random bytes everywhere except the
           scale fields, which are finite f16 (f32 for Q8_K) values
  t.ref  - F32, the `gguf` package's dequantization of t.raw. The package
           has no dequantizer for Q8_1 and Q8_K; their reference is computed
           here with numpy as d * q (the whole format), noted in metadata.
For the types the package can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16):
  t.src  - F32 input values
  t.pyq  - the package's quantization of t.src

Run once (`pip install gguf==0.19.0 numpy`) and commit the output:
  python3 tests/gguf_fixtures/make_quant_fixtures.py
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gguf", "quants.gguf")
rng = np.random.default_rng(20261129)

# Byte offsets of the f16 scale fields in each block layout.
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
    Q.Q8_0: [0], Q.Q8_1: [0, 2],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2],
    Q.Q6_K: [208],
    Q.IQ4_NL: [0], Q.IQ4_XS: [0],
}


def sane_scales(n, dtype):
    """Finite scales of varied sign and magnitude (1e-3 .. 2)."""
    mag = 2.0 * 10.0 ** rng.uniform(-3, 0, n)
    sign = np.where(rng.random(n) < 0.2, -1.0, 1.0)
    return (mag * sign).astype(dtype)


# gguf-py 0.19.0 still lists Q8_1 as 40 bytes (the old f32 d/s layout);
# ggml's block_q8_1 is { f16 d; f16 s; i8 qs[32] } = 36 bytes, which is what
# blockdraft implements. Q8_1 blocks are therefore stored as an I8 tensor
# "q8_1.raw" of 36-byte blocks, reinterpreted by the Rust test.
TYPE_SIZE = {Q.Q8_1: 36}


def random_blocks(qt, n_blocks):
    type_size = TYPE_SIZE.get(qt) or gguf.GGML_QUANT_SIZES[qt][1]
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(qt, []):
        raw[:, off:off + 2] = sane_scales(n_blocks, np.float16).view(np.uint8).reshape(n_blocks, 2)
    if qt == Q.Q8_K:
        raw[:, 0:4] = sane_scales(n_blocks, np.float32).view(np.uint8).reshape(n_blocks, 4)
    return raw


LATER_TYPES = [Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M,
               Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4]


def sanitize_later(qt, raw):
    """Finite scales for LATER_TYPES (random_blocks leaves them random)."""
    n = raw.shape[0]
    f16_at = {Q.IQ2_XXS: 0, Q.IQ2_XS: 0, Q.IQ2_S: 0, Q.IQ3_XXS: 0, Q.IQ3_S: 0,
              Q.IQ1_S: 0, Q.TQ1_0: 52, Q.TQ2_0: 64}
    if qt in f16_at:
        off = f16_at[qt]
        raw[:, off:off + 2] = sane_scales(n, np.float16).view(np.uint8).reshape(n, 2)
    elif qt == Q.IQ1_M:
        # The f16 scale's four nibbles are the top nibbles of the four
        # little-endian u16 words at bytes 48..56 (lowest nibble first).
        bits = sane_scales(n, np.float16).view(np.uint16)
        for k in range(4):
            nib = ((bits >> (4 * k)) & 0xF).astype(np.uint8)
            raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (nib << 4)
    elif qt == Q.MXFP4:
        raw[:, 0] = rng.integers(118, 136, n, dtype=np.uint8)


def numpy_reference(qt, raw):
    """Formats the package cannot dequantize: x = d * q."""
    if qt == Q.Q8_1:
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = raw[:, 4:36].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    if qt == Q.Q8_K:
        d = raw[:, 0:4].copy().view(np.float32)
        q = raw[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    raise ValueError(qt)


def main():
    w = gguf.GGUFWriter(OUT, arch="quant-fixtures")
    w.add_string("fixtures.generator", f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else '0.19.0'} / numpy {np.__version__}")
    w.add_array("fixtures.numpy_reference", ["q8_1", "q8_k"])

    block_types = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q8_1,
                   Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_K]
    for qt in block_types:
        name = qt.name.lower()
        block_len, _ = gguf.GGML_QUANT_SIZES[qt]
        n_blocks = max(8, 2048 // block_len)
        raw = random_blocks(qt, n_blocks)
        if qt in (Q.Q8_1, Q.Q8_K):
            ref = numpy_reference(qt, raw)
        else:
            ref = dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert np.all(np.isfinite(ref)), name
        if qt == Q.Q8_1:
            w.add_tensor(f"{name}.raw", raw.reshape(-1).view(np.int8))
        else:
            w.add_tensor(f"{name}.raw", raw.reshape(-1), raw_dtype=qt)
        w.add_tensor(f"{name}.ref", ref)

    # Plain types: random bit patterns (finite) and their f32 values.
    f16 = sane_scales(512, np.float16)
    w.add_tensor("f16.raw", f16)
    w.add_tensor("f16.ref", f16.astype(np.float32))
    bf16 = sane_scales(512, np.float32).view(np.uint32) >> 16
    bf16 = bf16.astype(np.uint16).view(np.uint8)
    w.add_tensor("bf16.raw", bf16, raw_dtype=Q.BF16)
    w.add_tensor("bf16.ref", dequantize(bf16, Q.BF16).astype(np.float32).reshape(-1))
    for name, dt in (("i8", np.int8), ("i16", np.int16), ("i32", np.int32)):
        info = np.iinfo(dt)
        v = rng.integers(info.min, info.max, 256, dtype=dt, endpoint=True)
        w.add_tensor(f"{name}.raw", v)
        w.add_tensor(f"{name}.ref", v.astype(np.float32))

    # The package's own quantizers, to check ours against.
    for qt in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16):
        name = qt.name.lower()
        src = (rng.standard_normal(1024) * rng.choice([0.01, 1.0, 30.0], 1024)).astype(np.float32)
        src[:32] = 0.0  # an all-zero block
        q = quantize(src.reshape(-1, 256), qt)
        w.add_tensor(f"{name}.src", src)
        w.add_tensor(f"{name}.pyq", q.reshape(-1), raw_dtype=qt)

    # Added later, after everything above so that its random data stays
    # as it was: the non-linear 4-bit types.
    for qt in (Q.IQ4_NL, Q.IQ4_XS):
        name = qt.name.lower()
        block_len, _ = gguf.GGML_QUANT_SIZES[qt]
        raw = random_blocks(qt, max(8, 2048 // block_len))
        ref = dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert np.all(np.isfinite(ref)), name
        w.add_tensor(f"{name}.raw", raw.reshape(-1), raw_dtype=qt)
        w.add_tensor(f"{name}.ref", ref)

    # Added later again, after everything above: the lattice (IQ1/2/3),
    # ternary and 4-bit float types, then the package's quantizers of the
    # ones it quantizes.
    for qt in LATER_TYPES:
        name = qt.name.lower()
        block_len, _ = gguf.GGML_QUANT_SIZES[qt]
        raw = random_blocks(qt, max(8, 2048 // block_len))
        sanitize_later(qt, raw)
        ref = dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert np.all(np.isfinite(ref)), name
        w.add_tensor(f"{name}.raw", raw.reshape(-1), raw_dtype=qt)
        w.add_tensor(f"{name}.ref", ref)
    for qt in (Q.TQ1_0, Q.TQ2_0, Q.MXFP4):
        name = qt.name.lower()
        src = (rng.standard_normal(1024) * rng.choice([0.01, 1.0, 30.0], 1024)).astype(np.float32)
        src[:256] = 0.0  # an all-zero block
        q = quantize(src.reshape(-1, 256), qt)
        w.add_tensor(f"{name}.src", src)
        w.add_tensor(f"{name}.pyq", q.reshape(-1), raw_dtype=qt)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
