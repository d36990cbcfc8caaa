//! The CUDA backend for a test, or a visible skip where the machine has no
//! CUDA device or driver (`BLOCKDRAFT_REQUIRE_CUDA=1` makes that a failure).
//! Any other start-up error (a kernel that does not compile) fails.

use blockdraft_cuda::{CudaBackend, CudaError};

pub fn cuda() -> Option<CudaBackend> {
    match CudaBackend::new() {
        Ok(b) => Some(b),
        Err(CudaError::NoDevice(why)) => {
            assert!(
                std::env::var("BLOCKDRAFT_REQUIRE_CUDA").as_deref() != Ok("1"),
                "BLOCKDRAFT_REQUIRE_CUDA=1 but there is no CUDA device / driver: {why}"
            );
            eprintln!("SKIPPED: no CUDA device ({why})");
            None
        }
        Err(e) => panic!("the CUDA backend does not start: {e}"),
    }
}
