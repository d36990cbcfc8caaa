//! The kernels: `.cu` sources embedded in the binary, compiled at run time by
//! NVRTC to a CUBIN for the device's own architecture (ptxas runs inside
//! NVRTC), and cached on disk by a hash of source, options and NVRTC version.

use cudarc::nvrtc::{result, sys};
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Helpers every kernel file uses, prepended to each before compiling.
const COMMON: &str = include_str!("../kernels/common.cuh");

/// One op family per file, as `shaders/` holds the wgpu ones.
pub const KERNEL_FILES: &[(&str, &str)] = &[
    ("activation", include_str!("../kernels/activation.cu")),
    ("argmax", include_str!("../kernels/argmax.cu")),
    ("attention", include_str!("../kernels/attention.cu")),
    ("conv", include_str!("../kernels/conv.cu")),
    ("copy", include_str!("../kernels/copy.cu")),
    ("delta_net", include_str!("../kernels/delta_net.cu")),
    ("elementwise", include_str!("../kernels/elementwise.cu")),
    ("embed", include_str!("../kernels/embed.cu")),
    (
        "gated_attention",
        include_str!("../kernels/gated_attention.cu"),
    ),
    ("matmul", include_str!("../kernels/matmul.cu")),
    ("norm", include_str!("../kernels/norm.cu")),
    ("quantize", include_str!("../kernels/quantize.cu")),
    ("rope", include_str!("../kernels/rope.cu")),
];

/// The files that read the lattice grids ([`grids_source`]).
const GRID_FILES: &[&str] = &["embed", "matmul"];

/// Kernel file `name`'s full source: the common helpers, the lattice grids
/// where it reads them, then the file.
pub fn source(name: &str, file: &str) -> String {
    if GRID_FILES.contains(&name) {
        format!("{COMMON}\n{}\n{file}", grids_source())
    } else {
        format!("{COMMON}\n{file}")
    }
}

/// The lattice grids of the IQ1/IQ2/IQ3 types as device arrays, generated
/// from [`blockdraft_gguf::quants::grids`] so that there is one copy of
/// them: `u64` rows of 8 values, `u32` rows of 4, byte `j` = value `j`
/// (IQ1_S's bytes are i8 -1, 0, 1). Global memory rather than
/// `__constant__`: the lanes of a warp index different rows, which
/// constant memory would serialize. tests/host.rs writes the same text as
/// `grids.cuh` for the host build of the kernels.
pub fn grids_source() -> String {
    use blockdraft_gguf::quants::grids as g;
    use std::fmt::Write;
    let mut s = String::from("// Generated from blockdraft_gguf::quants::grids (compile.rs).\n");
    let mut table = |ty: &str, name: &str, rows: &mut dyn Iterator<Item = String>| {
        let rows: Vec<String> = rows.collect();
        let _ = writeln!(s, "__device__ const {ty} {name}[{}] = {{", rows.len());
        for line in rows.chunks(8) {
            let _ = writeln!(s, "    {},", line.join(", "));
        }
        s.push_str("};\n");
    };
    let wide = |t: &'static [u64]| t.iter().map(|r| format!("0x{r:016x}ull"));
    let narrow = |t: &'static [u32]| t.iter().map(|r| format!("0x{r:08x}u"));
    table("u64", "iq2xxs_grid", &mut wide(&g::IQ2XXS_GRID));
    table("u64", "iq2xs_grid", &mut wide(&g::IQ2XS_GRID));
    table("u64", "iq2s_grid", &mut wide(&g::IQ2S_GRID));
    table("u32", "iq3xxs_grid", &mut narrow(&g::IQ3XXS_GRID));
    table("u32", "iq3s_grid", &mut narrow(&g::IQ3S_GRID));
    table("u64", "iq1s_grid", &mut wide(&g::IQ1S_GRID));
    s
}

/// Whether NVRTC's library can be loaded (cudarc panics on first use
/// otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC options for `arch` (e.g. `sm_90`). FMA contraction is off so that
/// the float sequences written out in the kernels are the CPU backend's
/// (explicit `fmaf` where it has `mul_add`).
pub fn options(arch: &str, verbose: bool) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_string(),
        "--std=c++17".to_string(),
    ];
    if verbose {
        o.push("--ptxas-options=-v".to_string());
    }
    o
}

/// A compiled kernel file: the CUBIN and NVRTC's log (ptxas's register and
/// spill report with `verbose`).
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// Destroys the NVRTC program however compilation ends.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program` and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn log_of(prog: &Program) -> String {
    // SAFETY: `prog` is a live program.
    match unsafe { result::get_program_log(prog.0) } {
        Ok(raw) => {
            let bytes: Vec<u8> = raw
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// Compiles `src` to a CUBIN for `arch`; the error carries NVRTC's log.
/// Needs [`nvrtc_present`].
pub fn compile_cubin(name: &str, src: &str, arch: &str, verbose: bool) -> Result<Compiled, String> {
    let csrc = CString::new(src).map_err(|_| format!("{name}: NUL in the source"))?;
    let cname =
        CString::new(format!("{name}.cu")).map_err(|_| format!("{name}: NUL in the name"))?;
    let prog = Program(
        result::create_program(&csrc, Some(&cname))
            .map_err(|e| format!("{name}: nvrtcCreateProgram: {e:?}"))?,
    );
    let opts = options(arch, verbose);
    // SAFETY: `prog` is live; the options are plain strings without NUL.
    if let Err(e) = unsafe { result::compile_program(prog.0, &opts) } {
        return Err(format!("{name}.cu for {arch}: {e:?}\n{}", log_of(&prog)));
    }
    let log = log_of(&prog);
    let mut size = 0usize;
    // SAFETY: compiled program; the buffer is sized by NVRTC's answer.
    let cubin = unsafe {
        sys::nvrtcGetCUBINSize(prog.0, &mut size)
            .result()
            .map_err(|e| format!("{name}: nvrtcGetCUBINSize: {e:?}"))?;
        let mut buf = vec![0u8; size];
        sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr() as *mut c_char)
            .result()
            .map_err(|e| format!("{name}: nvrtcGetCUBIN: {e:?}"))?;
        buf
    };
    Ok(Compiled { cubin, log })
}

/// NVRTC's version, part of the cache key.
fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters.
    let _ = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// FNV-1a: a hash that stays the same across builds and Rust versions.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &b in *part {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `$XDG_CACHE_HOME/blockdraft/cuda` or `~/.cache/blockdraft/cuda`.
fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("blockdraft").join("cuda"))
}

/// The CUBIN of kernel file `name` for `arch`, from the disk cache or
/// compiled (and then cached; a cache that cannot be written is skipped).
pub fn cubin_cached(name: &str, file: &str, arch: &str) -> Result<Vec<u8>, String> {
    let src = source(name, file);
    let (major, minor) = nvrtc_version();
    let version = format!("{major}.{minor}");
    let opts = options(arch, false).join(" ");
    let key = fnv1a(&[src.as_bytes(), opts.as_bytes(), version.as_bytes()]);
    let path = cache_dir().map(|d| d.join(format!("{name}-{key:016x}-{arch}.cubin")));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if bytes.starts_with(b"\x7fELF") {
            return Ok(bytes);
        }
    }
    let compiled = compile_cubin(name, &src, arch, false)?;
    if let Some(p) = path {
        // Written whole under a name of its own first (backends start on
        // several threads at once), so that a reader never sees half a file.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = p.with_extension(format!("tmp{}-{n}", std::process::id()));
        let written = p
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(&tmp, &compiled.cubin))
            .and_then(|_| std::fs::rename(&tmp, &p));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(compiled.cubin)
}

/// Register and spill figures of one kernel, parsed from ptxas's `-v` log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelUsage {
    pub kernel: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
}

/// Parses ptxas's verbose report: `Compiling entry function 'NAME' for
/// 'sm_90'`, then `N bytes stack frame, N bytes spill stores, N bytes spill
/// loads` and `Used N registers`.
pub fn parse_usage(log: &str) -> Vec<KernelUsage> {
    let mut out: Vec<KernelUsage> = Vec::new();
    let number_before = |line: &str, word: &str| -> Option<u32> {
        let at = line.find(word)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("entry function '").nth(1) {
            let kernel = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelUsage {
                kernel,
                registers: 0,
                spill_stores: 0,
                spill_loads: 0,
                stack_frame: 0,
            });
        } else if let Some(k) = out.last_mut() {
            if let Some(n) = number_before(line, "bytes stack frame") {
                k.stack_frame = n;
            }
            if let Some(n) = number_before(line, "bytes spill stores") {
                k.spill_stores = n;
            }
            if let Some(n) = number_before(line, "bytes spill loads") {
                k.spill_loads = n;
            }
            if let Some(n) = line
                .split("Used ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
            {
                k.registers = n;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_are_parsed_per_kernel() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'matmul_Q4_K' for 'sm_90'\n\
            ptxas info    : Function properties for matmul_Q4_K\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 0 barriers, 404 bytes cmem[0]\n\
            ptxas info    : Compiling entry function 'add' for 'sm_90'\n\
            ptxas info    : Function properties for add\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 8 registers, used 0 barriers, 372 bytes cmem[0]\n";
        let usage = parse_usage(log);
        assert_eq!(usage.len(), 2);
        assert_eq!(
            usage[0],
            KernelUsage {
                kernel: "matmul_Q4_K".into(),
                registers: 40,
                spill_stores: 4,
                spill_loads: 12,
                stack_frame: 8,
            }
        );
        assert_eq!((usage[1].kernel.as_str(), usage[1].registers), ("add", 8));
    }

    #[test]
    fn the_cache_key_changes_with_any_part() {
        let a = fnv1a(&[b"src", b"opts"]);
        assert_ne!(a, fnv1a(&[b"src", b"opt"]));
        assert_ne!(a, fnv1a(&[b"srco", b"pts"]));
        assert_eq!(a, fnv1a(&[b"src", b"opts"]));
    }

    #[test]
    fn every_file_is_listed_once_and_sources_start_with_the_helpers() {
        let mut names: Vec<&str> = KERNEL_FILES.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KERNEL_FILES.len());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("kernels/")
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".cu").map(str::to_string)
            })
            .collect();
        on_disk.sort_unstable();
        assert_eq!(on_disk, names, "every kernels/*.cu is compiled");
        assert!(source("x", "y").starts_with(COMMON));
        for name in GRID_FILES {
            assert!(names.contains(name), "{name}");
        }
    }

    #[test]
    fn grids_are_generated_whole_and_only_where_read() {
        let grids = grids_source();
        for (name, rows) in [
            ("iq2xxs_grid", 256),
            ("iq2xs_grid", 512),
            ("iq2s_grid", 1024),
            ("iq3xxs_grid", 256),
            ("iq3s_grid", 512),
            ("iq1s_grid", 2048),
        ] {
            assert!(grids.contains(&format!("{name}[{rows}] = {{")), "{name}");
        }
        // Row 1 of ggml's iq1s_grid, as it prints it.
        assert!(grids.contains("0xffffffffffffff01ull"));
        for (name, src) in KERNEL_FILES {
            let uses = src.contains("_grid[");
            assert_eq!(uses, GRID_FILES.contains(name), "{name}");
            assert_eq!(source(name, src).contains(&grids), uses, "{name}");
        }
    }

    /// The kernels negate packed grid bytes as `(g ^ m) + (m & 1)` per
    /// byte, which stays within each byte only because no IQ2/IQ3 grid
    /// value is 0.
    #[test]
    fn signed_lattice_grids_have_no_zero_value() {
        use blockdraft_gguf::quants::grids as g;
        let bytes = |r: u64, n: usize| (0..n).map(move |j| (r >> (8 * j)) as u8);
        let wide = [&g::IQ2XXS_GRID[..], &g::IQ2XS_GRID[..], &g::IQ2S_GRID[..]];
        for t in wide {
            assert!(t
                .iter()
                .flat_map(|&r| bytes(r, 8))
                .all(|v| v != 0 && v < 128));
        }
        for t in [&g::IQ3XXS_GRID[..], &g::IQ3S_GRID[..]] {
            assert!(t
                .iter()
                .flat_map(|&r| bytes(r as u64, 4))
                .all(|v| v != 0 && v < 128));
        }
    }
}
