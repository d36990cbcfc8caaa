//! Fuzzes the GGUF readers with arbitrary bytes.
//!
//! Checks: nothing panics or over-allocates; a file the whole-file reader
//! accepts has every tensor readable and decodable; the chunk-stream reader
//! (fed in chunks whose size comes from the input) accepts exactly the files
//! the whole-file reader accepts and reassembles the same tensor bytes.
//!
//! Run: `cargo +nightly fuzz run gguf_reader -- -max_len=65536`
//! (seed corpus: tests/fixtures/gguf/ and tests/fixtures/gguf/malformed/).
#![no_main]

use blockdraft_gguf::{GgufFile, GgufStreamReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = GgufFile::from_bytes(data.to_vec());
    if let Ok(f) = &whole {
        let _ = format!("{:?} {:?}", f, f.metadata());
        for i in 0..f.tensors().len() {
            let t = f.tensor_data_at(i).expect("validated tensor must be readable");
            assert_eq!(t.len() as u64, f.tensors()[i].n_bytes);
            if t.n_elements() <= 1 << 16 {
                t.to_f32().expect("validated tensor must decode");
            }
        }
    }

    let chunk = 1 + data.first().copied().unwrap_or(0) as usize * 3;
    let mut s = GgufStreamReader::new().with_total_len(data.len() as u64);
    let mut pieces: Vec<(usize, u64, Vec<u8>)> = Vec::new();
    let mut ok = true;
    for c in data.chunks(chunk) {
        match s.push(c) {
            Ok(p) => pieces.extend(
                p.into_iter()
                    .map(|p| (p.tensor_index, p.offset_in_tensor, p.bytes.into_owned())),
            ),
            Err(_) => {
                ok = false;
                break;
            }
        }
    }
    let streamed = if ok { s.finish().ok() } else { None };
    assert_eq!(
        whole.is_ok(),
        streamed.is_some(),
        "whole-file and stream readers disagree: {:?}",
        whole.as_ref().err()
    );
    if let (Ok(f), Some(end)) = (&whole, streamed) {
        assert_eq!(&end.header.tensors[..], f.tensors());
        for (idx, off, bytes) in pieces {
            let t = f.tensor_data_at(idx).unwrap();
            let off = off as usize;
            assert_eq!(&t[off..off + bytes.len()], &bytes[..]);
        }
    }
});
