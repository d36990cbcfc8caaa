//! Memory that the matmul kernels stream weights from.
//!
//! Decoding reads every weight once per token, so it runs at the speed the
//! machine streams memory. With 4 KiB pages the hardware prefetchers stop
//! at every page boundary and each page costs a TLB miss; in 2 MiB
//! transparent huge pages they run on. On Linux this buffer is an
//! anonymous mapping aligned to 2 MiB and advised `MADV_HUGEPAGE` (which
//! works under the common `madvise` THP setting); elsewhere, or if the
//! mapping fails, it is an ordinary heap allocation.

/// A zero-initialised byte buffer, in huge pages where the OS gives them.
pub struct WeightBuffer {
    inner: Inner,
}

enum Inner {
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        offset: usize,
        len: usize,
    },
    Heap(Vec<u8>),
}

#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

impl WeightBuffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::in_huge_pages(len).unwrap_or_else(|| WeightBuffer {
            inner: Inner::Heap(vec![0; len]),
        })
    }

    /// `len` zero bytes in huge pages; `None` where they are not to be had
    /// (not Linux, or under one huge page long).
    pub fn in_huge_pages(len: usize) -> Option<Self> {
        #[cfg(target_os = "linux")]
        if let Some(inner) = Self::huge(len) {
            return Some(WeightBuffer { inner });
        }
        let _ = len;
        None
    }

    #[cfg(target_os = "linux")]
    fn huge(len: usize) -> Option<Inner> {
        // Small buffers would waste most of a huge page.
        if len < HUGE_PAGE {
            return None;
        }
        let map = memmap2::MmapMut::map_anon(len.checked_add(HUGE_PAGE)?).ok()?;
        let offset = (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize;
        // Only a hint: without THP the pages are simply 4 KiB.
        let _ = map.advise_range(memmap2::Advice::HugePage, offset, len);
        Some(Inner::Mapped { map, offset, len })
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.inner {
            #[cfg(target_os = "linux")]
            Inner::Mapped { map, offset, len } => &map[*offset..offset + len],
            Inner::Heap(v) => v,
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.inner {
            #[cfg(target_os = "linux")]
            Inner::Mapped { map, offset, len } => &mut map[*offset..*offset + *len],
            Inner::Heap(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_buffers_exist_for_large_lengths_on_linux() {
        assert!(WeightBuffer::in_huge_pages(4096).is_none());
        let big = WeightBuffer::in_huge_pages(3 << 20);
        assert_eq!(big.is_some(), cfg!(target_os = "linux"));
    }

    #[test]
    fn buffers_are_zeroed_writable_and_sized() {
        for len in [0, 1, 4096, (2 << 20) + 12345] {
            let mut b = WeightBuffer::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&v| v == 0));
            for (i, v) in b.as_mut_slice().iter_mut().enumerate() {
                *v = i as u8;
            }
            assert!(b.as_slice().iter().enumerate().all(|(i, &v)| v == i as u8));
            #[cfg(target_os = "linux")]
            if len >= HUGE_PAGE {
                // Aligned, so the huge-page hint covers whole huge pages.
                assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
            }
        }
    }
}
