//! Writer → reader round trips.

use blockdraft_gguf::{ArrayValue, ErrorKind, GgmlType, GgufFile, GgufWriter, Value};

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama")
        .add("u8", 1u8)
        .add("i8", -2i8)
        .add("u16", 3u16)
        .add("i16", -4i16)
        .add("u32", 5u32)
        .add("i32", -6i32)
        .add("u64", 7u64)
        .add("i64", -8i64)
        .add("f32", 9.5f32)
        .add("f64", -10.25f64)
        .add("bool", true)
        .add("str", "héllo")
        .add("tokens", vec!["<s>", "</s>", "", "ünï"])
        .add("scores", vec![0.5f32, -1.0])
        .add("types", vec![1i32, 2, 3])
        .add("bools", vec![true, false])
        .add("u64s", vec![u64::MAX, 0])
        .add(
            "nested",
            Value::Array(ArrayValue::Array(vec![
                ArrayValue::U8(vec![1, 2]),
                ArrayValue::String(vec!["x".into()]),
            ])),
        );
    w.add_f32_tensor("a", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    w.add_tensor("q", &[32, 2], GgmlType::Q8_0, vec![7u8; 68])
        .unwrap();
    w.add_tensor("k", &[256], GgmlType::Q4_K, (0..144u8).collect::<Vec<_>>())
        .unwrap();
    w
}

#[test]
fn every_value_type_and_tensor_round_trips() {
    let w = sample_writer();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.metadata(), w.metadata());
    let m = f.metadata();
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(
        m.get_str_array("tokens").unwrap(),
        vec!["<s>", "</s>", "", "ünï"]
    );
    assert_eq!(m.get_f32_array("scores").unwrap(), vec![0.5, -1.0]);
    assert_eq!(m.get_i32_array("types").unwrap(), vec![1, 2, 3]);
    assert_eq!(m.get_u32("u8").unwrap(), 1);
    assert_eq!(m.get_f32("f64").unwrap(), -10.25);
    assert!(m.get_bool("bool").unwrap());
    assert_eq!(f.tensors().len(), 3);
    let a = f.tensor_data("a").unwrap();
    assert_eq!(a.ty(), GgmlType::F32);
    assert_eq!(a.dims(), &[3, 2]);
    assert_eq!(a.len(), 24);
    assert_eq!(f32::from_le_bytes(a[4..8].try_into().unwrap()), 2.0);
    assert_eq!(&*f.tensor_data("q").unwrap(), &[7u8; 68][..]);
    assert_eq!(
        &*f.tensor_data("k").unwrap(),
        &(0..144u8).collect::<Vec<_>>()[..]
    );
    for t in f.tensors() {
        assert_eq!(t.offset % 32, 0);
        assert_eq!((f.data_offset() + t.offset) % 32, 0);
    }
    let e = f.tensor_data("nope").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MissingTensor);
}

#[test]
fn custom_alignment_and_version_2() {
    let mut w = sample_writer();
    w.set_alignment(64).unwrap().set_version(2).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    for t in f.tensors() {
        assert_eq!(t.offset % 64, 0);
    }
    assert_eq!(&*f.tensor_data("q").unwrap(), &[7u8; 68][..]);
    assert_eq!(
        w.set_alignment(48).unwrap_err().kind(),
        ErrorKind::BadAlignment
    );
}

#[test]
fn open_from_disk_names_the_path_in_errors() {
    let dir = std::env::temp_dir().join(format!("bd-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("ok.gguf");
    sample_writer().write_file(&p).unwrap();
    let f = GgufFile::open(&p).unwrap();
    let g = f.clone();
    let t = std::thread::spawn(move || g.tensor_data("q").unwrap())
        .join()
        .unwrap();
    assert_eq!(&*t, &[7u8; 68][..]);
    let e = f.metadata().get_u32("missing.key").unwrap_err();
    assert!(
        e.to_string().contains("ok.gguf") && e.to_string().contains("missing.key"),
        "{e}"
    );

    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0").unwrap();
    let e = GgufFile::open(&bad).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Truncated);
    assert!(e.to_string().contains("bad.gguf"), "{e}");
    let e = GgufFile::open(dir.join("absent.gguf")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    assert_eq!(
        w.add_tensor("x", &[31], GgmlType::Q8_0, vec![0; 34])
            .unwrap_err()
            .kind(),
        ErrorKind::BadShape
    );
    assert_eq!(
        w.add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 33])
            .unwrap_err()
            .kind(),
        ErrorKind::BadLength
    );
    w.add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 34])
        .unwrap();
    assert_eq!(
        w.add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 34])
            .unwrap_err()
            .kind(),
        ErrorKind::DuplicateTensor
    );
}

/// Releasing a mapped tensor's pages loses nothing: its bytes (and its
/// neighbours') read back unchanged.
#[test]
fn released_pages_read_back_unchanged() {
    let big: Vec<f32> = (0..64 * 1024).map(|i| i as f32 * 0.5).collect();
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama");
    w.add_f32_tensor("before", &[3], &[1.0, 2.0, 3.0]).unwrap();
    w.add_f32_tensor("big", &[1024, 64], &big).unwrap();
    w.add_f32_tensor("after", &[2], &[4.0, 5.0]).unwrap();
    let path = std::env::temp_dir().join(format!("blockdraft-release-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let data = f.tensor_data("big").unwrap();
    let want = data.to_vec();
    // Parts, unaligned and past the end (clamped), then the whole.
    data.release_pages_in(5000..70_001);
    data.release_pages_in(200_000..1 << 30);
    assert_eq!(&*data, &want[..]);
    data.release_pages();
    assert_eq!(&*data, &want[..]);
    assert_eq!(f.tensor_data("big").unwrap().to_f32().unwrap(), big);
    assert_eq!(
        f.tensor_data("before").unwrap().to_f32().unwrap(),
        [1.0, 2.0, 3.0]
    );
    assert_eq!(
        f.tensor_data("after").unwrap().to_f32().unwrap(),
        [4.0, 5.0]
    );
    // In-memory tensors ignore it.
    let mem = GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap();
    mem.tensor_data("big").unwrap().release_pages();
    assert_eq!(&*mem.tensor_data("big").unwrap(), &want[..]);
    std::fs::remove_file(&path).unwrap();
}
