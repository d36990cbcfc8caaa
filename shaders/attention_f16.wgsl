// Attention over an f16 KV cache: `attention.wgsl`'s kernel reading keys and
// values stored two f16 to a u32 (`copy_f16.wgsl` writes them), decoded
// exactly and without needing f16 support from the device.

#include "common.wgsl"

// Written only by the fused pass (attention_core.wgsl).
@group(0) @binding(2) var<storage, read_write> k: array<u32>;
@group(0) @binding(3) var<storage, read_write> v: array<u32>;

fn key_pair(i: u32) -> vec2<f32> {
    let w = k[i >> 1u];
    return vec2<f32>(f16_bits(w & 0xffffu), f16_bits(w >> 16u));
}

fn value(i: u32) -> f32 {
    return f16_bits((v[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
}

fn cached(x: f32) -> f32 {
    return round_f16(x);
}

// Two f16 to a word, as copy_f16.wgsl packs them (i even).
fn store_kv(i: u32, key: vec2<f32>, value: vec2<f32>) {
    k[i >> 1u] = f16_bits_of(key.x) | (f16_bits_of(key.y) << 16u);
    v[i >> 1u] = f16_bits_of(value.x) | (f16_bits_of(value.y) << 16u);
}

#include "attention_core.wgsl"
