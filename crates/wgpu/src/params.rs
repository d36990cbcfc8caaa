//! The uniform blocks of the kernels (binding 0, a WGSL `struct Params` in
//! each shader), as Rust structs of the same members in the same order:
//! a dispatch takes one of these instead of positional words, so a field
//! out of place or a float passed as an integer no longer compiles. A test
//! checks every struct against naga's layout of its shaders' `Params`.

use bytemuck::Pod;

/// A member's WGSL type, as the test compares it with naga's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    U32,
    I32,
    F32,
    /// `array<vec4<f32>, N>` (uniform arrays have 16-byte elements).
    F32x4Array(usize),
    /// `vec4<u32>`.
    U32x4,
}

/// The Rust types a uniform member may have, with their WGSL type.
pub trait Member: Pod {
    const TY: Ty;
}

impl Member for u32 {
    const TY: Ty = Ty::U32;
}

impl Member for i32 {
    const TY: Ty = Ty::I32;
}

impl Member for f32 {
    const TY: Ty = Ty::F32;
}

impl Member for [u32; 4] {
    const TY: Ty = Ty::U32x4;
}

impl<const N: usize> Member for [[f32; 4]; N] {
    const TY: Ty = Ty::F32x4Array(N);
}

/// One member of a uniform struct.
#[cfg_attr(not(test), allow(dead_code, reason = "read by the layout test"))]
pub struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub ty: Ty,
}

/// A uniform struct's layout and the shader files whose `Params` it mirrors.
#[cfg_attr(not(test), allow(dead_code, reason = "read by the layout test"))]
pub struct Layout {
    pub name: &'static str,
    pub shaders: &'static [&'static str],
    pub fields: &'static [Field],
    pub size: usize,
}

/// A kernel's uniform block (implemented by `params!` only).
pub trait Uniform: Pod {
    const LAYOUT: Layout;
}

/// Declares each `#[repr(C)]` uniform struct, its [`Uniform`] layout, and
/// `ALL` of them (for the test).
macro_rules! params {
    ($(
        $(#[$doc:meta])*
        $name:ident for [$($shader:literal),+] { $($field:ident: $ty:ty),+ $(,)? }
    )+) => {
        $(
            $(#[$doc])*
            #[repr(C)]
            #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
            pub struct $name {
                $(pub $field: $ty),+
            }

            impl Uniform for $name {
                const LAYOUT: Layout = Layout {
                    name: stringify!($name),
                    shaders: &[$($shader),+],
                    fields: &[$(Field {
                        name: stringify!($field),
                        offset: std::mem::offset_of!($name, $field),
                        ty: <$ty as Member>::TY,
                    }),+],
                    size: size_of::<$name>(),
                };
            }
        )+

        /// Every uniform struct's layout.
        #[cfg(test)]
        pub const ALL: &[Layout] = &[$(<$name as Uniform>::LAYOUT),+];
    };
}

/// Weights of `add_slices` per dispatch (as many as fill the 256-byte
/// uniform block).
pub const ADD_SLICES_WEIGHTS: usize = 56;

params! {
    /// `swiglu`, `geglu`.
    Activation for ["activation.wgsl"] {
        n: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }

    /// `argmax` (to ids or into an f32 tensor).
    Argmax for ["argmax.wgsl"] {
        n_rows: u32,
        cols: u32,
        as_f32: u32,
        out_row: u32,
        out_col: u32,
        out_cols: u32,
        _pad0: u32,
        _pad1: u32,
    }

    /// `attention`, f32 or f16 keys and values (both include
    /// attention_core.wgsl, which declares it).
    Attention for ["attention.wgsl", "attention_f16.wgsl"] {
        n_rows: u32,
        n_head: u32,
        n_head_kv: u32,
        head_dim: u32,
        q_pos0: u32,
        kv_len: u32,
        causal: u32,
        window: u32,
        scale: f32,
        fused: u32,
        half_rot: u32,
        neox: u32,
        table_row0: u32,
        q_scale: f32,
        head_norm: u32,
        norm_eps: f32,
        k_norm_off: u32,
        _pad0: u32,
    }

    /// `grouped_conv`.
    Conv for ["conv.wgsl"] {
        n_rows: u32,
        cols: u32,
        taps: u32,
        group: u32,
        side: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }

    /// `causal_conv_silu`, `gated_delta_rule` (and its chunked form's
    /// `delta_rule_prepare`, `delta_rule_chunked`).
    DeltaNet for ["delta_net.wgsl"] {
        n_rows: u32,
        channels: u32,
        taps: u32,
        n_k_heads: u32,
        n_v_heads: u32,
        k_dim: u32,
        v_dim: u32,
        eps: f32,
    }

    /// `split_heads`, `sigmoid_mul`.
    GatedAttention for ["gated_attention.wgsl"] {
        n: u32,
        d: u32,
        _pad0: u32,
        _pad1: u32,
    }

    /// `copy_rows` and `append_kv`, into f32 or f16.
    CopyRows for ["copy.wgsl", "copy_f16.wgsl"] {
        n_rows: u32,
        src_cols: u32,
        src_row: u32,
        dst_cols: u32,
        dst_row: u32,
        dst_col: u32,
        _pad0: u32,
        _pad1: u32,
    }

    /// `add`, `scale`, `clamp_finite`, `softcap`, `add_bias`.
    Elementwise for ["elementwise.wgsl"] {
        n: u32,
        cols: u32,
        s: f32,
        _pad: u32,
    }

    /// `embed_*`, one weight part per dispatch.
    Embed for ["embed.wgsl"] {
        n_ids: u32,
        cols: u32,
        row0: u32,
        rows: u32,
        row_bytes: u32,
        zero: u32,
        ids_f32: u32,
        ids_stride: u32,
        ids_row0: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }

    /// `add_slices`: up to [`ADD_SLICES_WEIGHTS`] weights in `w`.
    AddSlices for ["fusion.wgsl"] {
        n: u32,
        d: u32,
        width: u32,
        slice0: u32,
        n_w: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
        w: [[f32; 4]; ADD_SLICES_WEIGHTS / 4],
    }

    /// `matmul_f32`, `matmul_f16`, `matmul_bf16`, one weight part per
    /// dispatch.
    MatmulFloat for ["matmul_float.wgsl"] {
        rows: u32,
        cols: u32,
        n: u32,
        row0: u32,
        out_cols: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
        epilogue: u32,
        _pad3: u32,
        _pad4: u32,
        _pad5: u32,
    }

    /// `matmul_q*`, one weight part per dispatch; `matmul_stacked*`, the
    /// weights side by side in one buffer described by the `seg_*` members
    /// (zero for the others).
    MatmulQuant for ["matmul_quant.wgsl"] {
        rows: u32,
        cols: u32,
        n: u32,
        row0: u32,
        out_cols: u32,
        row_bytes: u32,
        d_off: u32,
        s_off: u32,
        epilogue: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
        seg_rows: [u32; 4],
        seg_off: [u32; 4],
        seg_row_bytes: [u32; 4],
        seg_bias: [u32; 4],
    }

    /// `rms_norm`, and `rms_norm_quantize_q8_0` / `_q8_k`, which also
    /// quantize the rows for a matmul (`q8_1_sums`, `d_off`, `s_off` as in
    /// [`Quantize`]).
    Norm for ["norm.wgsl"] {
        group: u32,
        n_slices: u32,
        eps: f32,
        q8_1_sums: u32,
        d_off: u32,
        s_off: u32,
        post_eps: f32,
        _pad0: u32,
    }

    /// `penalize`.
    Penalty for ["penalty.wgsl"] {
        rows: u32,
        cols: u32,
        hist_len: u32,
        last_n: u32,
        penalty: f32,
        batch_col: u32,
        batch_cols: u32,
        _pad: u32,
    }

    /// `quantize_q8_0`, `quantize_q8_k`.
    Quantize for ["quantize.wgsl"] {
        n: u32,
        cols: u32,
        chunks: u32,
        d_off: u32,
        s_off: u32,
        q8_1_sums: u32,
        _pad0: u32,
        _pad1: u32,
    }

    /// `rope`, `rope_qk`.
    Rope for ["rope.wgsl"] {
        n_rows: u32,
        cols: u32,
        n_head: u32,
        head_dim: u32,
        half_rot: u32,
        neox: u32,
        table_row0: u32,
        n_head_k: u32,
    }

    /// `sample`.
    Sample for ["sample.wgsl"] {
        n_rows: u32,
        m: u32,
        sorted: u32,
        temperature: f32,
        top_p: f32,
        min_p: f32,
        seed_lo: u32,
        seed_hi: u32,
        ctr_lo: u32,
        ctr_hi: u32,
        out_row: u32,
        out_col: u32,
        out_cols: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }

    /// `selector_walk`.
    Selector for ["selector.wgsl"] {
        n_rows: u32,
        rank: u32,
        k: u32,
        out_col: u32,
        out_cols: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }

    /// `top_k`.
    TopK for ["topk.wgsl"] {
        n_rows: u32,
        cols: u32,
        k: u32,
        _pad0: u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shaders::{compiled_files, preprocessed, ShaderFeatures};

    /// The [`Ty`] of a naga type, if it is one a uniform member may have.
    fn wgsl_ty(module: &naga::Module, ty: naga::Handle<naga::Type>) -> Option<Ty> {
        use naga::{ScalarKind, TypeInner};
        match &module.types[ty].inner {
            TypeInner::Scalar(s) if s.width == 4 => match s.kind {
                ScalarKind::Uint => Some(Ty::U32),
                ScalarKind::Sint => Some(Ty::I32),
                ScalarKind::Float => Some(Ty::F32),
                _ => None,
            },
            TypeInner::Vector {
                size: naga::VectorSize::Quad,
                scalar: naga::Scalar::U32,
            } => Some(Ty::U32x4),
            TypeInner::Array {
                base,
                size: naga::ArraySize::Constant(n),
                ..
            } => match module.types[*base].inner {
                TypeInner::Vector {
                    size: naga::VectorSize::Quad,
                    scalar: naga::Scalar::F32,
                } => Some(Ty::F32x4Array(n.get() as usize)),
                _ => None,
            },
            _ => None,
        }
    }

    /// A WGSL member: name, byte offset, type.
    type WgslMember = (String, usize, Option<Ty>);

    /// `struct Params` of `file`'s `features` variant: its members (name,
    /// offset, type) and size. `None` where the file declares none.
    fn wgsl_params(file: &str, features: ShaderFeatures) -> Option<(Vec<WgslMember>, usize)> {
        let src = preprocessed(file, features).unwrap();
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{file} {features:?}: {}", e.emit_to_string(&src)));
        let (_, params) = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some("Params"))?;
        // Offsets and span are laid out by the front end.
        let naga::TypeInner::Struct { members, span } = &params.inner else {
            panic!("{file}: `Params` is not a struct");
        };
        let members = members
            .iter()
            .map(|m| {
                let name = m.name.clone().unwrap_or_default();
                (name, m.offset as usize, wgsl_ty(&module, m.ty))
            })
            .collect();
        Some((members, *span as usize))
    }

    /// Each Rust struct has the members of its shaders' `struct Params`
    /// (every variant): names in order, offsets, types and size.
    #[test]
    fn params_match_their_shaders() {
        for layout in ALL {
            for &file in layout.shaders {
                for features in ShaderFeatures::all() {
                    let at = format!("params::{} vs {file} ({features:?})", layout.name);
                    let (members, size) = wgsl_params(file, features)
                        .unwrap_or_else(|| panic!("{at}: the shader has no `struct Params`"));
                    for (i, (wgsl, rust)) in members.iter().zip(layout.fields).enumerate() {
                        let (name, offset, ty) = wgsl;
                        assert!(
                            (name.as_str(), *offset, *ty)
                                == (rust.name, rust.offset, Some(rust.ty)),
                            "{at}: member {i} is `{name}: {ty:?}` at byte {offset} in WGSL, \
                             `{}: {:?}` at byte {} in Rust",
                            rust.name,
                            rust.ty,
                            rust.offset,
                        );
                    }
                    let names = |n: Vec<&str>| n.join(", ");
                    assert_eq!(
                        members.len(),
                        layout.fields.len(),
                        "{at}: WGSL members [{}], Rust fields [{}]",
                        names(members.iter().map(|m| m.0.as_str()).collect()),
                        names(layout.fields.iter().map(|f| f.name).collect()),
                    );
                    assert_eq!(size, layout.size, "{at}: struct size");
                }
            }
        }
    }

    /// Every shader with a `struct Params` has a Rust struct.
    #[test]
    fn every_shader_params_has_a_struct() {
        for file in compiled_files() {
            if wgsl_params(file, ShaderFeatures::default()).is_some() {
                assert!(
                    ALL.iter().any(|l| l.shaders.contains(&file)),
                    "{file}: its `struct Params` has no struct in params.rs"
                );
            }
        }
    }
}
