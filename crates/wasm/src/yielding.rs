//! A backend whose read-backs first yield to the JS event loop. The CPU
//! backend's read-backs complete at once, so without this a whole
//! generation would run without the event loop turning: the worker would
//! see an abort message only after the last token. WebGPU needs no help
//! (each read-back awaits `mapAsync`). One yield per read-back (per token
//! or speculative round) costs a message round trip, well under 1 ms.

use blockdraft_core::backend::{
    AttentionMask, AttentionParams, Backend, BackendError, ConvParams, GatedActivation, RopeParams,
    WeightSource,
};
use blockdraft_core::sampling::SamplingParams;

pub struct Yielding<B>(pub B);

#[cfg(target_arch = "wasm32")]
async fn yield_now() {
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
async fn yield_now() {}

impl<B: Backend> Backend for Yielding<B> {
    type Tensor = B::Tensor;
    type Weight = B::Weight;

    fn name(&self) -> String {
        self.0.name()
    }
    fn load_weight(&self, src: WeightSource<'_>) -> Result<B::Weight, BackendError> {
        self.0.load_weight(src)
    }
    fn tensor(&self, rows: usize, cols: usize) -> B::Tensor {
        self.0.tensor(rows, cols)
    }
    fn shape(&self, t: &B::Tensor) -> (usize, usize) {
        self.0.shape(t)
    }
    fn reshape(&self, t: &mut B::Tensor, rows: usize, cols: usize) {
        self.0.reshape(t, rows, cols)
    }
    fn write(&self, t: &mut B::Tensor, data: &[f32]) {
        self.0.write(t, data)
    }
    async fn read(&self, t: &B::Tensor) -> Vec<f32> {
        yield_now().await;
        self.0.read(t).await
    }
    fn embed(&self, table: &B::Weight, ids: &[u32], out: &mut B::Tensor) {
        self.0.embed(table, ids, out)
    }
    fn matmul(&self, w: &B::Weight, x: &B::Tensor, out: &mut B::Tensor) {
        self.0.matmul(w, x, out)
    }
    fn add_bias(&self, x: &mut B::Tensor, bias: &B::Weight) {
        self.0.add_bias(x, bias)
    }
    fn rms_norm(&self, x: &B::Tensor, w: &B::Weight, group: usize, eps: f32, out: &mut B::Tensor) {
        self.0.rms_norm(x, w, group, eps, out)
    }
    fn rope(&self, x: &mut B::Tensor, pos0: usize, p: RopeParams) {
        self.0.rope(x, pos0, p)
    }
    fn gated(&self, act: GatedActivation, gate: &B::Tensor, up: &B::Tensor, out: &mut B::Tensor) {
        self.0.gated(act, gate, up, out)
    }
    fn add(&self, x: &mut B::Tensor, y: &B::Tensor) {
        self.0.add(x, y)
    }
    fn scale(&self, x: &mut B::Tensor, s: f32) {
        self.0.scale(x, s)
    }
    fn clamp_finite(&self, x: &mut B::Tensor, limit: f32) {
        self.0.clamp_finite(x, limit)
    }
    fn copy_rows(
        &self,
        src: &B::Tensor,
        src_row: usize,
        dst: &mut B::Tensor,
        dst_row: usize,
        dst_col: usize,
        n_rows: usize,
    ) {
        self.0
            .copy_rows(src, src_row, dst, dst_row, dst_col, n_rows)
    }
    fn attention(
        &self,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        mask: AttentionMask,
        p: AttentionParams,
        out: &mut B::Tensor,
    ) {
        self.0.attention(q, k, v, mask, p, out)
    }
    fn grouped_conv(
        &self,
        x: &B::Tensor,
        base: &B::Tensor,
        dynamic: &B::Tensor,
        p: ConvParams,
        out: &mut B::Tensor,
    ) {
        self.0.grouped_conv(x, base, dynamic, p, out)
    }
    async fn argmax(&self, x: &B::Tensor) -> Vec<u32> {
        yield_now().await;
        self.0.argmax(x).await
    }
    fn argmax_to(&self, x: &B::Tensor, out: &mut B::Tensor, row: usize, col: usize) {
        self.0.argmax_to(x, out, row, col)
    }
    fn embed_from(&self, table: &B::Weight, ids: &B::Tensor, row0: usize, out: &mut B::Tensor) {
        self.0.embed_from(table, ids, row0, out)
    }
    fn host_memory(&self) -> bool {
        self.0.host_memory()
    }
    fn softcap(&self, x: &mut B::Tensor, cap: f32) {
        self.0.softcap(x, cap)
    }
    fn top_k(&self, x: &B::Tensor, k: usize, values: &mut B::Tensor, ids: &mut B::Tensor) {
        self.0.top_k(x, k, values, ids)
    }
    fn sample_to(
        &self,
        x: &B::Tensor,
        p: &SamplingParams,
        counter: u64,
        out: &mut B::Tensor,
        row: usize,
        col: usize,
    ) {
        self.0.sample_to(x, p, counter, out, row, col)
    }
    fn add_slices(&self, x: &B::Tensor, w: &[f32], out: &mut B::Tensor) {
        self.0.add_slices(x, w, out)
    }
    fn selector_walk(
        &self,
        gates: &B::Tensor,
        pred: &B::Tensor,
        succ: &B::Tensor,
        unary: &B::Tensor,
        cand: &B::Tensor,
        out: &mut B::Tensor,
        col: usize,
    ) {
        self.0
            .selector_walk(gates, pred, succ, unary, cand, out, col)
    }
}
