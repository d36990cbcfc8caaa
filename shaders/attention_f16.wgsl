// Attention over an f16 KV cache: `attention.wgsl`'s kernel reading keys and
// values stored two f16 to a u32 (`copy_f16.wgsl` writes them), decoded
// exactly and without needing f16 support from the device.

#include "common.wgsl"

@group(0) @binding(2) var<storage, read> k: array<u32>;
@group(0) @binding(3) var<storage, read> v: array<u32>;

fn key_pair(i: u32) -> vec2<f32> {
    let w = k[i >> 1u];
    return vec2<f32>(f16_bits(w & 0xffffu), f16_bits(w >> 16u));
}

fn value(i: u32) -> f32 {
    return f16_bits((v[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
}

#include "attention_core.wgsl"
