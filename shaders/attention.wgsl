// Scaled-dot-product attention over the KV cache, grouped-query, with causal
// or bidirectional masks and sliding windows: decode, multi-row verify and
// non-causal drafter blocks alike. One workgroup per (query row, head), an
// online softmax over chunks of 64 keys (no score buffer, any length).

#include "common.wgsl"

// Written only by the fused pass (attention_core.wgsl).
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;

fn key_pair(i: u32) -> vec2<f32> {
    return vec2<f32>(k[i], k[i + 1u]);
}

fn value(i: u32) -> f32 {
    return v[i];
}

fn cached(x: f32) -> f32 {
    return x;
}

fn store_kv(i: u32, key: vec2<f32>, value: vec2<f32>) {
    k[i] = key.x;
    k[i + 1u] = key.y;
    v[i] = value.x;
    v[i + 1u] = value.y;
}

#include "attention_core.wgsl"
