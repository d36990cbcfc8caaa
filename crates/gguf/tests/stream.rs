//! The chunk-stream reader yields the same header as the whole-file reader
//! and reassembles every tensor exactly, whatever the chunk sizes.

use blockdraft_gguf::{ArrayValue, GgmlType, GgufFile, GgufStreamReader, GgufWriter, Value};

fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set_alignment(64).unwrap();
    w.add("general.architecture", "llama");
    // A big-ish vocabulary so the header spans many chunks.
    let toks: Vec<String> = (0..5000).map(|i| format!("tok{i}")).collect();
    w.add(
        "tokenizer.ggml.tokens",
        Value::Array(ArrayValue::String(toks)),
    );
    w.add(
        "tokenizer.ggml.scores",
        (0..5000).map(|i| i as f32).collect::<Vec<_>>(),
    );
    for (i, n) in [3usize, 100, 1, 700, 64].into_iter().enumerate() {
        let data: Vec<f32> = (0..n).map(|k| (i * 1000 + k) as f32).collect();
        w.add_f32_tensor(format!("t{i}"), &[n as u64], &data)
            .unwrap();
    }
    w.add_tensor(
        "q",
        &[64, 3],
        GgmlType::Q8_0,
        (0..204).map(|k| k as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    w.to_bytes().unwrap()
}

fn quants_fixture() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/gguf/quants.gguf"
    ))
    .unwrap()
}

fn chunk_sizes(pattern: &str, seed: u64) -> impl FnMut() -> usize + '_ {
    let mut s = seed | 1;
    move || match pattern {
        "1" => 1,
        "7" => 7,
        "4096" => 4096,
        "whole" => usize::MAX,
        _ => {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            1 + (s % 9000) as usize
        }
    }
}

fn stream(file: &[u8], pattern: &str, seed: u64, total: bool) {
    let whole = GgufFile::from_bytes(file.to_vec()).unwrap();
    let mut r = GgufStreamReader::new();
    if total {
        r = r.with_total_len(file.len() as u64);
    }
    let mut bufs: Vec<Vec<u8>> = vec![];
    let mut next = chunk_sizes(pattern, seed);
    let mut rest = file;
    let place =
        |r: &GgufStreamReader, bufs: &mut Vec<Vec<u8>>, p: &blockdraft_gguf::TensorChunk| {
            let h = r.header().expect("pieces only after the header");
            if bufs.is_empty() {
                *bufs = h
                    .tensors
                    .iter()
                    .map(|t| vec![0xAA; t.n_bytes as usize])
                    .collect();
            }
            let b = &mut bufs[p.tensor_index];
            let o = p.offset_in_tensor as usize;
            assert_eq!(p.tensor_len as usize, b.len());
            b[o..o + p.len()].copy_from_slice(p);
        };
    while !rest.is_empty() {
        let n = next().min(rest.len());
        let (c, tail) = rest.split_at(n);
        rest = tail;
        let pieces = r.push(c).unwrap();
        for p in &pieces {
            place(&r, &mut bufs, p);
        }
    }
    let end = r.finish().unwrap();
    let h = end.header;
    assert!(!total || end.tail.is_empty());
    if bufs.is_empty() {
        bufs = h
            .tensors
            .iter()
            .map(|t| vec![0xAA; t.n_bytes as usize])
            .collect();
    }
    for p in &end.tail {
        let o = p.offset_in_tensor as usize;
        bufs[p.tensor_index][o..o + p.len()].copy_from_slice(p);
    }
    assert_eq!(h.version, whole.version());
    assert_eq!(h.alignment, whole.alignment());
    assert_eq!(h.data_offset, whole.data_offset());
    assert_eq!(&h.metadata, whole.metadata());
    assert_eq!(&h.tensors[..], whole.tensors());
    for (i, t) in h.tensors.iter().enumerate() {
        assert_eq!(
            &bufs[i][..],
            &*whole.tensor_data(&t.name).unwrap(),
            "{} ({pattern})",
            t.name
        );
    }
}

#[test]
fn random_chunk_sizes_reassemble_exactly() {
    for file in [sample(), quants_fixture()] {
        for pattern in ["1", "7", "4096", "whole", "random"] {
            for total in [true, false] {
                stream(&file, pattern, 42, total);
            }
        }
        for seed in 1..6 {
            stream(&file, "random", seed, true);
        }
    }
}

#[test]
fn header_only_file_without_total_len() {
    let mut w = GgufWriter::new();
    w.add("k", 1u32);
    let f = w.to_bytes().unwrap();
    let mut r = GgufStreamReader::new();
    for c in f.chunks(3) {
        assert!(r.push(c).unwrap().is_empty());
    }
    assert_eq!(r.finish().unwrap().header.metadata.get_u32("k").unwrap(), 1);
}

#[test]
fn stream_errors() {
    let f = sample();
    // More bytes than announced.
    let mut r = GgufStreamReader::new().with_total_len(10);
    assert!(r.push(&f[..20]).is_err());
    // Cut short (inside the last tensor, not just its end padding).
    let mut r = GgufStreamReader::new().with_total_len(f.len() as u64);
    r.push(&f[..f.len() - 5]).unwrap();
    assert!(r.finish().is_err());
    let mut r = GgufStreamReader::new();
    r.push(&f[..f.len() - 100]).unwrap();
    assert_eq!(
        r.finish().unwrap_err().kind(),
        blockdraft_gguf::ErrorKind::TensorOutOfBounds
    );
    // Header cap.
    let mut r = GgufStreamReader::new().with_max_header_bytes(1000);
    assert!(r.push(&f).is_err());
}
