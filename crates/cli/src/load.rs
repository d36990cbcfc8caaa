//! Opening a model file: GGUF, decoder on the chosen backend, tokenizer.

use anyhow::{Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::KvType;
use blockdraft_core::model::Decoder;
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use blockdraft_wgpu::WgpuBackend;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

/// Options shared by every command that loads a model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Path to a GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: std::path::PathBuf,
    /// Worker threads (default, and at most: all cores).
    #[arg(short = 't', long = "threads", value_parser = crate::args::at_least(1))]
    pub threads: Option<usize>,
    /// Where the model runs: `cpu`, `wgpu` (Vulkan, Metal or DX12), or
    /// `cuda` (NVIDIA GPUs; needs the driver and libnvrtc.so.13).
    #[arg(long = "backend", value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// CPU: keep every weight in place in the memory map instead of moving
    /// each matrix into huge-page memory on first use, packed for the
    /// faster x86 kernels where they exist (Q4_K, Q4_0, Q4_1, Q5_0, Q8_0,
    /// IQ4_NL, Q6_K): a one-time cost of under a second per GB;
    /// memory use is about the same either way. Packed Q6_K and IQ4_NL
    /// round differently from llama.cpp (its tokens bit for bit on those
    /// types need this flag).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// CPU: kernels in blockdraft's own float sequences where llama.cpp's
    /// cost speed: attention over the f16 KV cache with f32 accumulators
    /// and keys shared by every row of a pass (up to 3x faster attention
    /// with AVX2, 3-5x with AVX-512: most of a step at depth), and x86
    /// Q4_1, Q5_0 and Q8_0 matmuls with one float sum per block (verify
    /// passes of several rows up to ~1.4x faster; AVX-512 kernels). Tokens
    /// then agree with llama.cpp's only to rounding; speculative output
    /// still equals plain decoding's.
    #[arg(long = "fast-kernels")]
    pub fast_kernels: bool,
    /// How the KV cache stores keys and values: `f16` (half the memory;
    /// on the CPU llama.cpp's default configuration, f16 cache with flash
    /// attention) or `f32` (llama.cpp's precise one,
    /// `-fa off -ctk f32 -ctv f32`).
    #[arg(long = "kv-type", value_enum, default_value_t = KvTypeArg::from(KvType::FRONT_END_DEFAULT))]
    pub kv_type: KvTypeArg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Wgpu,
    Cuda,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvTypeArg {
    F16,
    F32,
}

impl From<KvType> for KvTypeArg {
    fn from(ty: KvType) -> Self {
        match ty {
            KvType::F16 => KvTypeArg::F16,
            KvType::F32 => KvTypeArg::F32,
        }
    }
}

impl From<KvTypeArg> for KvType {
    fn from(ty: KvTypeArg) -> Self {
        match ty {
            KvTypeArg::F16 => KvType::F16,
            KvTypeArg::F32 => KvType::F32,
        }
    }
}

impl ModelArgs {
    /// The worker threads: `-t`, capped at the cores (more threads than
    /// cores only take turns, several times slower).
    pub fn threads(&self) -> usize {
        let cores = cores();
        self.threads.map_or(cores, |t| t.min(cores))
    }

    /// Warns about settings that do not apply as given, refuses those that
    /// cannot apply at all.
    fn check(&self) -> Result<()> {
        for (set, flag) in [
            (self.no_repack, "--no-repack"),
            (self.fast_kernels, "--fast-kernels"),
        ] {
            if set && self.backend != BackendKind::Cpu {
                anyhow::bail!("{flag} applies to the cpu backend only");
            }
        }
        match self.threads {
            Some(_) if self.backend != BackendKind::Cpu => {
                crate::out::warn("-t/--threads has no effect on the wgpu and cuda backends")
            }
            Some(t) if t > cores() => crate::out::warn(format!(
                "-t {t} is more than the {} cores; using {}",
                cores(),
                cores()
            )),
            _ => {}
        }
        Ok(())
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub struct Loaded<B: Backend> {
    pub file: GgufFile,
    /// Shared by every sequence (and a draft model's drafter).
    pub decoder: std::sync::Arc<Decoder<B>>,
    pub tokenizer: Tokenizer,
    /// Seconds to read the file and make the weights resident.
    pub load_seconds: f64,
    /// Seconds of the warm-up pass ([`Decoder::warm_up`]: repacking,
    /// shader compilation), so that no prefill figure includes it.
    pub warmup_seconds: f64,
}

/// A command's work once the model is loaded, generic over the backend.
pub trait Job {
    fn run<B: Backend>(self, loaded: Loaded<B>) -> Result<()>;
}

/// Loads the model on the backend `args` names and runs `job` on it.
pub fn with_backend(args: &ModelArgs, job: impl Job) -> Result<()> {
    args.check()?;
    match args.backend {
        BackendKind::Cpu => {
            let mut backend = CpuBackend::new(args.threads());
            if args.no_repack {
                backend = backend.without_packing();
            }
            if args.fast_kernels {
                backend = backend.with_fast_kernels();
            }
            job.run(load(args, Arc::new(backend))?)
        }
        BackendKind::Wgpu => {
            let backend = WgpuBackend::new().context("cannot start the wgpu backend")?;
            job.run(load(args, Arc::new(backend))?)
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let backend =
                blockdraft_cuda::CudaBackend::new().context("cannot start the cuda backend")?;
            job.run(load(args, Arc::new(backend))?)
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => {
            anyhow::bail!("this blockdraft was built without the `cuda` feature")
        }
    }
}

/// Opens a GGUF file; its errors name the file (and the part of a split
/// set) already.
pub fn open_gguf(path: &Path) -> Result<GgufFile> {
    GgufFile::open(path).context("cannot load model")
}

pub fn tokenizer(file: &GgufFile) -> Result<Tokenizer> {
    Tokenizer::from_gguf(file).context("cannot build the tokenizer from the model's metadata")
}

/// Loads model and tokenizer, with a progress bar on a terminal.
/// Loads the model at `path` with `args`' other options on `backend`, which
/// a model is already loaded on: a second model beside the first.
pub fn load_beside<B: Backend>(
    args: &ModelArgs,
    path: &Path,
    backend: Arc<B>,
) -> Result<Loaded<B>> {
    let args = ModelArgs {
        model: path.to_path_buf(),
        ..args.clone()
    };
    load(&args, backend)
}

fn load<B: Backend>(args: &ModelArgs, backend: Arc<B>) -> Result<Loaded<B>> {
    let started = std::time::Instant::now();
    let file = open_gguf(&args.model)?;
    let tokenizer = tokenizer(&file)?;
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes}")
                .expect("static template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let decoder = Decoder::load(&file, backend, &mut |done| bar.set_position(done))
        .with_context(|| format!("cannot load model {}", args.model.display()))?
        .with_kv_type(args.kv_type.into());
    bar.finish_and_clear();
    let load_seconds = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    pollster::block_on(decoder.warm_up()).context("the warm-up pass failed")?;
    Ok(Loaded {
        file,
        decoder: std::sync::Arc::new(decoder),
        tokenizer,
        load_seconds,
        warmup_seconds: started.elapsed().as_secs_f64(),
    })
}
