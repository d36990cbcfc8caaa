//! Every kernel file compiles with NVRTC to a CUBIN for sm_80 and sm_90
//! (ptxas runs inside NVRTC, so what only machine code rejects is caught
//! too), defines every function the backend loads, and stays within the
//! register budget without spills. Runs without a GPU: it needs only
//! libnvrtc (`tests/fetch_nvrtc.sh`); without it the test says SKIPPED,
//! and fails instead under `BLOCKDRAFT_REQUIRE_NVRTC=1`.

use blockdraft_cuda::compile::{
    compile_cubin, cubin_cached, nvrtc_present, parse_usage, source, KERNEL_FILES,
};
use blockdraft_cuda::functions_of;

/// Registers a thread may use: 128-thread blocks at this budget still fit
/// several blocks per SM, and no kernel needs more.
const REGISTER_BUDGET: u32 = 128;

#[test]
fn every_kernel_compiles_to_cubin_for_sm80_and_sm90_without_spills() {
    if !nvrtc_present() {
        assert!(
            std::env::var("BLOCKDRAFT_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "BLOCKDRAFT_REQUIRE_NVRTC=1 but libnvrtc.so.13 is not found (tests/fetch_nvrtc.sh)"
        );
        eprintln!("SKIPPED: libnvrtc not found (run tests/fetch_nvrtc.sh, set LD_LIBRARY_PATH)");
        return;
    }
    let mut failures = Vec::new();
    for arch in ["sm_80", "sm_90"] {
        for (file, src) in KERNEL_FILES {
            let compiled = match compile_cubin(file, &source(file, src), arch, true) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
            // An ELF image, not PTX text.
            assert_eq!(&compiled.cubin[..4], b"\x7fELF", "{file} {arch}");
            let usage = parse_usage(&compiled.log);
            for name in functions_of(file) {
                if !usage.iter().any(|u| u.kernel == *name) {
                    failures.push(format!("{file}.cu for {arch}: no kernel `{name}`"));
                }
            }
            for u in &usage {
                eprintln!(
                    "{arch} {file:12} {:16} {:3} registers, {} B stack, {} B spill stores, {} B spill loads",
                    u.kernel, u.registers, u.stack_frame, u.spill_stores, u.spill_loads
                );
                if u.spill_stores > 0 || u.spill_loads > 0 || u.registers > REGISTER_BUDGET {
                    failures.push(format!("{arch} {}: {u:?}", u.kernel));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_broken_kernel_is_an_error_with_the_compiler_log() {
    if !nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc not found");
        return;
    }
    let e = compile_cubin(
        "broken",
        &source(
            "broken",
            "extern \"C\" __global__ void f() { undeclared(); }",
        ),
        "sm_90",
        false,
    )
    .err()
    .expect("a compile error");
    assert!(e.contains("undeclared"), "{e}");
}

#[test]
fn the_disk_cache_serves_concurrent_starts_whole_files() {
    if !nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc not found");
        return;
    }
    let dir = std::env::temp_dir().join(format!("blockdraft-cuda-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Only this test of the binary reads the cache.
    std::env::set_var("XDG_CACHE_HOME", &dir);
    let (name, src) = KERNEL_FILES[KERNEL_FILES.len() - 1];
    let cubins: Vec<Vec<u8>> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| cubin_cached(name, src, "sm_90").expect("compiles")))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert!(cubins
        .iter()
        .all(|c| c == &cubins[0] && c.starts_with(b"\x7fELF")));
    let files: Vec<String> = std::fs::read_dir(dir.join("blockdraft/cuda"))
        .expect("cache folder")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), 1, "one whole CUBIN, no leftovers: {files:?}");
    assert!(files[0].starts_with(name) && files[0].ends_with("-sm_90.cubin"));
    assert_eq!(cubin_cached(name, src, "sm_90").unwrap(), cubins[0]);
    let _ = std::fs::remove_dir_all(&dir);
}
