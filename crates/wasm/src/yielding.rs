//! Yielding to the JS event loop before each CPU readback. The CPU
//! backend's readbacks complete at once, so without this a whole
//! generation would run without the event loop turning: the worker would
//! see an abort message only after the last token. WebGPU needs no help
//! (each readback awaits `mapAsync`). One yield per readback (per token or
//! speculative round) costs a message round trip, well under 1 ms.

use std::future::Future;
use std::pin::Pin;

#[cfg(target_arch = "wasm32")]
async fn next_task() {
    use wasm_bindgen::prelude::*;
    // A MessageChannel message is a task without setTimeout's 4 ms clamp.
    #[wasm_bindgen(inline_js = "export function next_task() {
        return new Promise((resolve) => {
            const c = new MessageChannel();
            c.port1.onmessage = () => { c.port1.close(); resolve(); };
            c.port2.postMessage(null);
        });
    }")]
    extern "C" {
        fn next_task() -> js_sys::Promise;
    }
    // The promise never rejects.
    let _ = wasm_bindgen_futures::JsFuture::from(next_task()).await;
}

#[cfg(not(target_arch = "wasm32"))]
async fn next_task() {}

/// The CPU backend's readback hook (`CpuBackend::with_readback_hook`).
pub fn yield_to_event_loop() -> Pin<Box<dyn Future<Output = ()>>> {
    Box::pin(next_task())
}
