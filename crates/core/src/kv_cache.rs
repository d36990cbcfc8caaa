//! Per-layer key/value cache. Slot `p` holds position `p`, so rollback is
//! just a shorter length.

use crate::backend::{Backend, KvType};
use crate::error::ModelError;

pub struct KvCache<B: Backend> {
    k: Vec<B::Tensor>,
    v: Vec<B::Tensor>,
    len: usize,
    capacity: usize,
    ty: KvType,
}

impl<B: Backend> KvCache<B> {
    pub fn new(be: &B, n_layer: usize, kv_dim: usize, capacity: usize, ty: KvType) -> Self {
        let alloc = || {
            (0..n_layer)
                .map(|_| be.kv_tensor(capacity, kv_dim, ty))
                .collect()
        };
        KvCache {
            k: alloc(),
            v: alloc(),
            len: 0,
            capacity,
            ty,
        }
    }

    /// How keys and values are stored.
    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Fails unless `needed` positions fit.
    pub fn reserve(&self, needed: usize) -> Result<(), ModelError> {
        if needed > self.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Drops every position from `len` on; longer lengths are ignored.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }

    pub fn layer(&self, il: usize) -> (&B::Tensor, &B::Tensor) {
        (&self.k[il], &self.v[il])
    }

    pub fn layer_mut(&mut self, il: usize) -> (&mut B::Tensor, &mut B::Tensor) {
        (&mut self.k[il], &mut self.v[il])
    }
}
