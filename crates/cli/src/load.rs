//! Opening a model file: GGUF, decoder on the chosen backend, tokenizer.

use anyhow::{Context, Result};
use blockdraft_core::model::Decoder;
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_core::Backend;
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
    /// Worker threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Where the model runs: `cpu`, or `wgpu` (Vulkan, Metal or DX12).
    #[arg(long = "backend", value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// CPU: keep every weight in place in the memory map instead of moving
    /// each matrix into huge-page memory on first use, packed for the
    /// faster x86 kernels where they exist (Q4_K, Q4_0): a one-time cost of
    /// under a second per GB; memory use is about the same either way.
    #[arg(long = "no-repack")]
    pub no_repack: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Wgpu,
}

impl ModelArgs {
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

pub struct Loaded<B: Backend> {
    pub file: GgufFile,
    pub decoder: Decoder<B>,
    pub tokenizer: Tokenizer,
}

/// A command's work once the model is loaded, generic over the backend.
pub trait Job {
    fn run<B: Backend>(self, loaded: Loaded<B>) -> Result<()>;
}

/// Loads the model on the backend `args` names and runs `job` on it.
pub fn with_backend(args: &ModelArgs, job: impl Job) -> Result<()> {
    match args.backend {
        BackendKind::Cpu => {
            let mut backend = CpuBackend::new(args.threads());
            if args.no_repack {
                backend = backend.without_packing();
            }
            job.run(load(args, Arc::new(backend))?)
        }
        BackendKind::Wgpu => {
            let backend = WgpuBackend::new().context("cannot start the wgpu backend")?;
            job.run(load(args, Arc::new(backend))?)
        }
    }
}

pub fn open_gguf(path: &Path) -> Result<GgufFile> {
    GgufFile::open(path).with_context(|| format!("cannot load model {}", path.display()))
}

pub fn tokenizer(file: &GgufFile) -> Result<Tokenizer> {
    Tokenizer::from_gguf(file).context("cannot build the tokenizer from the model's metadata")
}

/// Loads model and tokenizer, with a progress bar on a terminal.
fn load<B: Backend>(args: &ModelArgs, backend: Arc<B>) -> Result<Loaded<B>> {
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
        .with_context(|| format!("cannot load model {}", args.model.display()))?;
    bar.finish_and_clear();
    Ok(Loaded {
        file,
        decoder,
        tokenizer,
    })
}
