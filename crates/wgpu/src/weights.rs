//! Weights on the GPU in their GGUF type, read in place by the kernels.
//! Matrices larger than the adapter's largest storage binding are split
//! into parts of whole rows; 1-D weights (norms, biases) are small and kept
//! as f32.

use crate::recorder::{Binding, Device};
use crate::shaders::Kernel;
use crate::{grid, u};
use blockdraft_core::backend::{BackendError, WeightSource};
use blockdraft_gguf::GgmlType;

/// Where `embed` finds its ids: u32 from the host (`stride` 1), or f32
/// values down column 0 of a tensor of `stride` columns from row `row0`.
#[derive(Clone, Copy)]
pub(crate) struct IdsLayout {
    pub f32_values: bool,
    pub stride: usize,
    pub row0: usize,
}

/// Whole rows `row0 .. row0 + rows` of a matrix, in a buffer of their own.
struct Part {
    buffer: wgpu::Buffer,
    row0: usize,
    rows: usize,
}

pub struct WgpuWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    parts: Vec<Part>,
}

/// The matmul and embedding kernels of a weight type, if it has them.
fn kernels(ty: GgmlType) -> Option<(Kernel, Kernel)> {
    let (mm, emb) = match ty {
        GgmlType::F32 => ("matmul_f32", "embed_f32"),
        GgmlType::F16 => ("matmul_f16", "embed_f16"),
        GgmlType::BF16 => ("matmul_bf16", "embed_bf16"),
        _ => return None,
    };
    Some((
        Kernel {
            file: "matmul_float.wgsl",
            entry: mm,
        },
        Kernel {
            file: "embed.wgsl",
            entry: emb,
        },
    ))
}

impl WgpuWeight {
    pub(crate) fn load(
        dev: &Device,
        src: WeightSource<'_>,
        max_binding: u64,
    ) -> Result<Self, BackendError> {
        let bad = |reason: String| BackendError::BadWeight {
            name: src.name.to_string(),
            reason,
        };
        let (cols, rows) = match *src.dims {
            [c] => (c, 1),
            [c, r] => (c, r),
            _ => {
                return Err(bad(format!(
                    "{} dimensions; only vectors and matrices are used",
                    src.dims.len()
                )))
            }
        };
        let too_large = || bad("too large".into());
        let cols = usize::try_from(cols).map_err(|_| too_large())?;
        let rows = usize::try_from(rows).map_err(|_| too_large())?;
        if cols == 0 || cols % src.ty.block_len() != 0 {
            return Err(bad(format!(
                "row length {cols} is not a positive multiple of the {} block size {}",
                src.ty,
                src.ty.block_len()
            )));
        }
        let row_bytes = src.ty.bytes_for(cols as u64).ok_or_else(too_large)?;
        let expected = row_bytes.checked_mul(rows as u64).ok_or_else(too_large)?;
        if src.data.len() as u64 != expected {
            return Err(bad(format!(
                "{} bytes of data, expected {expected}",
                src.data.len()
            )));
        }
        if src.dims.len() == 1 {
            let mut dense = vec![0f32; cols];
            blockdraft_gguf::quants::dequantize(src.ty, &src.data, &mut dense)
                .map_err(|e| bad(e.to_string()))?;
            return Ok(WgpuWeight {
                ty: GgmlType::F32,
                rows: 1,
                cols,
                parts: vec![Part {
                    buffer: dev.storage_init(src.name, bytemuck::cast_slice(&dense)),
                    row0: 0,
                    rows: 1,
                }],
            });
        }
        if kernels(src.ty).is_none() {
            return Err(BackendError::Unsupported {
                what: format!("{} matrices on wgpu (`{}`)", src.ty, src.name),
            });
        }
        // Whole rows per part, each part within one binding (and 4-byte
        // aligned, which every block size times 4 rows is).
        let rows_per_part = ((max_binding / row_bytes) as usize / 4 * 4).max(1);
        if row_bytes > max_binding {
            return Err(bad(format!(
                "one row ({row_bytes} bytes) exceeds the device's largest storage binding ({max_binding})"
            )));
        }
        let row_bytes = row_bytes as usize;
        let parts = (0..rows)
            .step_by(rows_per_part)
            .map(|row0| {
                let n = rows_per_part.min(rows - row0);
                let bytes = &src.data[row0 * row_bytes..(row0 + n) * row_bytes];
                Part {
                    buffer: dev.storage_init(src.name, bytes),
                    row0,
                    rows: n,
                }
            })
            .collect();
        Ok(WgpuWeight {
            ty: src.ty,
            rows,
            cols,
            parts,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// A 1-D weight as f32 (norm and bias kernels).
    pub(crate) fn dense_binding(&self) -> Binding<'_> {
        assert!(
            self.rows == 1 && self.ty == GgmlType::F32,
            "not a 1-D weight"
        );
        Binding::whole(&self.parts[0].buffer)
    }

    /// `out[r] = self[id r]` for `n` ids laid out in `ids` as `layout` says.
    pub(crate) fn embed(
        &self,
        dev: &Device,
        ids: &wgpu::Buffer,
        layout: IdsLayout,
        n: usize,
        out: &wgpu::Buffer,
    ) {
        let (_, k) = kernels(self.ty).expect("checked at load");
        for part in &self.parts {
            let params = [
                u(n),
                u(self.cols),
                u(part.row0),
                u(part.rows),
                u32::from(layout.f32_values),
                u(layout.stride),
                u(layout.row0),
                0,
            ];
            dev.dispatch(
                k,
                &params,
                &[
                    Binding::whole(ids),
                    Binding::whole(&part.buffer),
                    Binding::whole(out),
                ],
                grid(n * self.cols, 256),
            );
        }
    }

    /// `y = x · selfᵀ` for `n` rows of `x`.
    pub(crate) fn matmul(&self, dev: &Device, x: &wgpu::Buffer, n: usize, y: &wgpu::Buffer) {
        let (k, _) = kernels(self.ty).expect("checked at load");
        for part in &self.parts {
            let params = [
                u(part.rows),
                u(self.cols),
                u(n),
                u(part.row0),
                u(self.rows),
                0,
                0,
                0,
            ];
            dev.dispatch(
                k,
                &params,
                &[
                    Binding::whole(&part.buffer),
                    Binding::whole(x),
                    Binding::whole(y),
                ],
                grid(part.rows, 1),
            );
        }
    }
}
