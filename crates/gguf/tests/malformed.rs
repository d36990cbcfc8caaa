//! The malformed-file corpus in `tests/fixtures/gguf/malformed/`.
//!
//! Each file is named `<error_kind>__<what is wrong>.gguf`; the test asserts
//! that reading it (whole, and through the chunk stream) fails with that
//! [`ErrorKind`]. The files are produced by [`cases`] below; regenerate with
//! `BLOCKDRAFT_REGEN_CORPUS=1 cargo test -p blockdraft-gguf --test malformed`.

use std::path::PathBuf;

use blockdraft_gguf::{ErrorKind, GgufFile, GgufStreamReader};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf/malformed")
}

/// Byte-level GGUF builder that lets every field be wrong.
#[derive(Clone)]
struct Raw {
    version: u32,
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    kvs: Vec<Vec<u8>>,
    infos: Vec<Vec<u8>>,
    alignment: usize,
    data: Vec<u8>,
}

fn s(x: &str) -> Vec<u8> {
    bytes(x.as_bytes())
}

fn bytes(x: &[u8]) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(x);
    v
}

fn kv(key: &[u8], ty: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = bytes(key);
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

fn info(name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut v = bytes(name);
    v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v
}

const U32: u32 = 4;
const STRING: u32 = 8;
const ARRAY: u32 = 9;
const BOOL: u32 = 7;
const F32_T: u32 = 0;
const Q8_0_T: u32 = 8;

impl Raw {
    fn new() -> Raw {
        Raw {
            version: 3,
            n_tensors: None,
            n_kv: None,
            kvs: vec![kv(b"general.architecture", STRING, &s("llama"))],
            infos: vec![],
            alignment: 32,
            data: vec![],
        }
    }

    fn kv(mut self, k: Vec<u8>) -> Raw {
        self.kvs.push(k);
        self
    }

    fn tensor(mut self, i: Vec<u8>) -> Raw {
        self.infos.push(i);
        self
    }

    fn data(mut self, d: Vec<u8>) -> Raw {
        self.data = d;
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut v = b"GGUF".to_vec();
        v.extend_from_slice(&self.version.to_le_bytes());
        v.extend_from_slice(
            &self
                .n_tensors
                .unwrap_or(self.infos.len() as u64)
                .to_le_bytes(),
        );
        v.extend_from_slice(&self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for k in &self.kvs {
            v.extend_from_slice(k);
        }
        for i in &self.infos {
            v.extend_from_slice(i);
        }
        if !self.data.is_empty() {
            while v.len() % self.alignment != 0 {
                v.push(0);
            }
            v.extend_from_slice(&self.data);
        }
        v
    }
}

/// A valid file with one F32 tensor (4 elements) and one Q8_0 tensor.
fn valid() -> Raw {
    Raw::new()
        .tensor(info(b"a", &[4], F32_T, 0))
        .tensor(info(b"b", &[32], Q8_0_T, 32))
        .data(vec![1u8; 32 + 34])
}

fn truncate(mut v: Vec<u8>, n: usize) -> Vec<u8> {
    v.truncate(n);
    v
}

/// (file name, bytes). The kind is the file-name prefix before `__`.
fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let ok = valid().build();
    let mut nested = vec![];
    // 10 levels of array-of-array, innermost empty u8 array.
    for _ in 0..10 {
        nested.extend_from_slice(&ARRAY.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&0u32.to_le_bytes());
    nested.extend_from_slice(&0u64.to_le_bytes());
    let mut big_str_array = STRING.to_le_bytes().to_vec();
    big_str_array.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let mut big_u32_array = U32.to_le_bytes().to_vec();
    big_u32_array.extend_from_slice(&(1u64 << 61).to_le_bytes());
    let mut bad_elem_array = 77u32.to_le_bytes().to_vec();
    bad_elem_array.extend_from_slice(&1u64.to_le_bytes());
    let mut huge_str = (u64::MAX - 3).to_le_bytes().to_vec();
    huge_str.extend_from_slice(b"abc");
    let mut bad_bool_array = BOOL.to_le_bytes().to_vec();
    bad_bool_array.extend_from_slice(&3u64.to_le_bytes());
    bad_bool_array.extend_from_slice(&[0, 1, 9]);

    vec![
        ("truncated__empty_file.gguf", vec![]),
        ("truncated__inside_magic.gguf", b"GG".to_vec()),
        ("truncated__inside_counts.gguf", truncate(ok.clone(), 14)),
        // (Cut early enough, any file fails the count plausibility check
        // instead, so these cut files with few entries.)
        ("truncated__inside_metadata_value.gguf", {
            // A string cut short reports length_too_large; cut a u64 instead.
            let v = Raw::new().kv(kv(b"n", 10, &7u64.to_le_bytes())).build();
            truncate(v, 24 + 45 + 8 + 1 + 4 + 3)
        }),
        ("truncated__inside_tensor_info.gguf", {
            let v = Raw::new().tensor(info(b"a", &[4], F32_T, 0)).build();
            truncate(v, 24 + 45 + 10)
        }),
        ("bad_magic__ggml_magic.gguf", {
            let mut v = ok.clone();
            v[..4].copy_from_slice(b"ggml");
            v
        }),
        (
            "unsupported_version__v1.gguf",
            Raw {
                version: 1,
                ..valid()
            }
            .build(),
        ),
        (
            "unsupported_version__v4.gguf",
            Raw {
                version: 4,
                ..valid()
            }
            .build(),
        ),
        (
            "big_endian__v3_byte_swapped.gguf",
            Raw {
                version: 3u32.swap_bytes(),
                ..valid()
            }
            .build(),
        ),
        (
            "count_too_large__tensor_count.gguf",
            Raw {
                n_tensors: Some(u64::MAX / 2),
                ..valid()
            }
            .build(),
        ),
        (
            "count_too_large__metadata_count.gguf",
            Raw {
                n_kv: Some(1 << 40),
                ..valid()
            }
            .build(),
        ),
        (
            "count_too_large__u32_array_length.gguf",
            valid().kv(kv(b"arr", ARRAY, &big_u32_array)).build(),
        ),
        (
            "count_too_large__string_array_length.gguf",
            valid().kv(kv(b"toks", ARRAY, &big_str_array)).build(),
        ),
        ("length_too_large__key_length.gguf", {
            let mut k = (1u64 << 62).to_le_bytes().to_vec();
            k.extend_from_slice(b"key");
            valid().kv(k).build()
        }),
        (
            "length_too_large__string_value.gguf",
            valid().kv(kv(b"name", STRING, &huge_str)).build(),
        ),
        ("length_too_large__tensor_name.gguf", {
            let mut r = valid();
            let mut i = (1u64 << 50).to_le_bytes().to_vec();
            i.extend_from_slice(b"x");
            r.infos[0] = i;
            r.build()
        }),
        (
            "unknown_value_type__type_99.gguf",
            valid().kv(kv(b"k", 99, &[0; 8])).build(),
        ),
        (
            "unknown_value_type__array_element_type.gguf",
            valid().kv(kv(b"k", ARRAY, &bad_elem_array)).build(),
        ),
        (
            "invalid_utf8__key.gguf",
            valid()
                .kv(kv(b"bad\xff\xfekey", U32, &1u32.to_le_bytes()))
                .build(),
        ),
        (
            "invalid_utf8__string_value.gguf",
            valid().kv(kv(b"k", STRING, &bytes(b"\xc3\x28"))).build(),
        ),
        ("invalid_utf8__tensor_name.gguf", {
            let mut r = valid();
            r.infos[0] = info(b"\x80a", &[4], F32_T, 0);
            r.build()
        }),
        (
            "invalid_bool__value_2.gguf",
            valid().kv(kv(b"flag", BOOL, &[2])).build(),
        ),
        (
            "invalid_bool__array_element_9.gguf",
            valid().kv(kv(b"flags", ARRAY, &bad_bool_array)).build(),
        ),
        (
            "duplicate_key__architecture_twice.gguf",
            valid()
                .kv(kv(b"general.architecture", STRING, &s("qwen2")))
                .build(),
        ),
        (
            "nesting_too_deep__ten_nested_arrays.gguf",
            valid().kv(kv(b"deep", ARRAY, &nested)).build(),
        ),
        (
            "bad_alignment__48.gguf",
            valid()
                .kv(kv(b"general.alignment", U32, &48u32.to_le_bytes()))
                .build(),
        ),
        (
            "bad_alignment__0.gguf",
            valid()
                .kv(kv(b"general.alignment", U32, &0u32.to_le_bytes()))
                .build(),
        ),
        (
            "wrong_type__alignment_is_string.gguf",
            valid()
                .kv(kv(b"general.alignment", STRING, &s("32")))
                .build(),
        ),
        (
            "bad_dims__zero_dims.gguf",
            valid().tensor(info(b"c", &[], F32_T, 128)).build(),
        ),
        (
            "bad_dims__five_dims.gguf",
            valid()
                .tensor(info(b"c", &[1, 1, 1, 1, 1], F32_T, 128))
                .build(),
        ),
        (
            "unknown_tensor_type__removed_q4_2.gguf",
            valid().tensor(info(b"c", &[32], 4, 128)).build(),
        ),
        (
            "unknown_tensor_type__id_1000.gguf",
            valid().tensor(info(b"c", &[32], 1000, 128)).build(),
        ),
        (
            "bad_shape__row_not_whole_blocks.gguf",
            valid().tensor(info(b"c", &[33], Q8_0_T, 128)).build(),
        ),
        (
            "bad_shape__dim_above_i64_max.gguf",
            valid().tensor(info(b"c", &[1 << 63], F32_T, 128)).build(),
        ),
        (
            "overflow__element_count.gguf",
            valid()
                .tensor(info(b"c", &[1 << 32, 1 << 32], F32_T, 128))
                .build(),
        ),
        (
            "overflow__offset_plus_size.gguf",
            valid()
                .tensor(info(b"c", &[64], F32_T, u64::MAX - 31))
                .build(),
        ),
        (
            "duplicate_tensor__a_twice.gguf",
            valid()
                .tensor(info(b"a", &[4], F32_T, 128))
                .data(vec![0; 160])
                .build(),
        ),
        ("misaligned_tensor__offset_1.gguf", {
            let mut r = valid();
            r.infos[1] = info(b"b", &[32], Q8_0_T, 33);
            r.build()
        }),
        (
            "tensor_out_of_bounds__past_end.gguf",
            valid().tensor(info(b"c", &[64], F32_T, 96)).build(),
        ),
        (
            "tensor_out_of_bounds__data_section_cut.gguf",
            truncate(ok.clone(), ok.len() - 1),
        ),
        (
            "tensor_out_of_bounds__no_data_section.gguf",
            valid().data(vec![]).build(),
        ),
        ("overlapping_tensors__same_offset.gguf", {
            let mut r = valid();
            r.infos[1] = info(b"b", &[32], Q8_0_T, 0);
            r.build()
        }),
        (
            "overlapping_tensors__partial.gguf",
            valid()
                .tensor(info(b"c", &[16], F32_T, 64))
                .data(vec![0; 160])
                .build(),
        ),
    ]
}

#[test]
fn valid_base_file_parses() {
    let f = GgufFile::from_bytes(valid().build()).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.tensor_data("b").unwrap().len(), 34);
}

#[test]
fn zero_size_tensor_without_data_section_is_readable() {
    // Found by the fuzzer: a 0-element tensor in a file that ends before the
    // (aligned) data section must read as an empty slice, not an error.
    let f = GgufFile::from_bytes(Raw::new().tensor(info(b"z", &[0], F32_T, 0)).build()).unwrap();
    assert!(f.tensor_data("z").unwrap().is_empty());
}

#[test]
fn a_directory_is_an_io_error_that_says_so() {
    let e = GgufFile::open(std::env::temp_dir()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    let msg = e.to_string();
    assert!(msg.contains("is a directory, not a GGUF file"), "{msg}");
}

#[test]
fn corpus_files_match_generator() {
    let dir = corpus_dir();
    if std::env::var_os("BLOCKDRAFT_REGEN_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        for (name, bytes) in cases() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    for (name, bytes) in cases() {
        let on_disk = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e} (regenerate the corpus)"));
        assert_eq!(on_disk, bytes, "{name} is stale (regenerate the corpus)");
    }
}

#[test]
fn every_corpus_file_fails_with_its_kind() {
    let mut n = 0;
    for entry in std::fs::read_dir(corpus_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let kind_name = name.split("__").next().unwrap();
        let want = ErrorKind::from_name(kind_name)
            .unwrap_or_else(|| panic!("{name}: unknown kind {kind_name}"));

        let err = GgufFile::open(&path).expect_err(&name);
        assert_eq!(err.kind(), want, "{name}: {err}");
        assert!(
            err.to_string().contains(&name),
            "error should name the file: {err}"
        );

        // The stream must reject it too (same kind, except that a stream cannot
        // tell a cut file from one still arriving until `finish`).
        let bytes = std::fs::read(&path).unwrap();
        let mut s = GgufStreamReader::new().with_total_len(bytes.len() as u64);
        let mut got = None;
        for chunk in bytes.chunks(7) {
            if let Err(e) = s.push(chunk) {
                got = Some(e);
                break;
            }
        }
        let e = match got {
            Some(e) => e,
            None => s.finish().expect_err(&name),
        };
        assert_eq!(e.kind(), want, "{name} (stream): {e}");
        n += 1;
    }
    assert!(n >= 40, "only {n} corpus files");
}
