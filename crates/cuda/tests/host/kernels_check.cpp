// Runs kernels on the host (tests/host.rs, through emulator.h) against
// straightforward references: activation quantization bit for bit as the
// CPU backend's rules, whole matmuls (several row tiles, warp sums) against
// the dequantized dot, attention over f32 and f16 caches with every mask of
// the conformance suite, argmax ties and NaN, RMS norm, rope, row copies
// into an f16 cache, the grouped convolution, embedding rows by f32 ids,
// slice sums and the sanitiser, the hybrid blocks' convolution, delta rule
// (two column blocks, shared key heads) and gates. Prints each check; exits
// non-zero on any failure.
#include "emulator.h"
#include "common.cuh"
#include "grids.cuh" // written by tests/host.rs from compile::grids_source
namespace Q {
#include "quantize.cu"
}
namespace MM {
#include "matmul.cu"
}
namespace EM {
#include "embed.cu"
}
namespace AT {
#include "attention.cu"
}
namespace AR {
#include "argmax.cu"
}
namespace NO {
#include "norm.cu"
}
namespace RO {
#include "rope.cu"
}
namespace CP {
#include "copy.cu"
}
namespace CV {
#include "conv.cu"
}
namespace EL {
#include "elementwise.cu"
}
namespace DN {
#include "delta_net.cu"
}
namespace GA {
#include "gated_attention.cu"
}
std::mt19937 rng(5);
float uni(float s) { return (std::uniform_real_distribution<float>(-1, 1)(rng)) * s; }
int bad = 0;
void check(bool ok, const char *what) { printf("%s %s\n", ok ? "ok  " : "FAIL", what); bad += !ok; }

// The CPU backend's quantization rules (crates/cpu/src/kernels/scalar.rs).
void ref_q8_0(const float *x, int nb, bool q81, std::vector<i8> &q, std::vector<float> &d, std::vector<float> &s) {
  q.resize(nb * 32); d.resize(nb); s.resize(nb);
  for (int b = 0; b < nb; b++) {
    float amax = 0; for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b*32+i]));
    float id = amax > 0 ? 127.0f / amax : 0; int sum = 0;
    for (int i = 0; i < 32; i++) { int v = (int)rintf(x[b*32+i] * id); q[b*32+i] = v; sum += v; }
    d[b] = round_f16(amax / 127.0f);
    s[b] = q81 ? round_f16(amax / 127.0f * (float)sum) : d[b] * (float)sum;
  }
}
void ref_q8_k(const float *x, int nb, std::vector<i8> &q, std::vector<float> &d, std::vector<int> &bs) {
  q.resize(nb * 256); d.resize(nb); bs.resize(nb * 16);
  for (int b = 0; b < nb; b++) {
    const float *xb = x + b * 256; float mx = 0;
    for (int i = 0; i < 256; i++) if (fabsf(xb[i]) > fabsf(mx)) mx = xb[i];
    if (mx == 0) { for (int i = 0; i < 256; i++) q[b*256+i] = 0; for (int g = 0; g < 16; g++) bs[b*16+g] = 0; d[b] = 0; continue; }
    float is = -127.0f / mx;
    for (int i = 0; i < 256; i++) q[b*256+i] = (i8)(int)fminf(rintf(is * xb[i]), 127.0f);
    for (int g = 0; g < 16; g++) { int s = 0; for (int l = 0; l < 16; l++) s += q[b*256+16*g+l]; bs[b*16+g] = s; }
    d[b] = 1.0f / is;
  }
}

void test_quantize() {
  int n = 3, cols = 512; std::vector<float> x(n * cols); for (auto &v : x) v = uni(3);
  for (int k = 0; k < 32; k++) x[32 + k] = k - 15.5f; x[63] = 127; for (int k = 64; k < 96; k++) x[k] = 0;
  x[cols + 7] = -9; x[cols + 100] = 9; for (int k = 0; k < 256; k++) x[2*cols + 256 + k] = 0;
  for (int q81 = 0; q81 < 2; q81++) {
    int nb = n * cols / 32; std::vector<i8> q(nb*32); std::vector<float> d(nb), s(nb);
    launch({(unsigned)((nb + 3) / 4),1,1}, {32,4,1}, [&]{ Q::quantize_q8_0(x.data(), nb, q81, q.data(), d.data(), s.data()); });
    std::vector<i8> rq; std::vector<float> rd, rs; ref_q8_0(x.data(), nb, q81, rq, rd, rs);
    check(q == rq && !memcmp(d.data(), rd.data(), 4*nb) && !memcmp(s.data(), rs.data(), 4*nb), q81 ? "quantize_q8_0 (q8_1 sums)" : "quantize_q8_0");
  }
  int nb = n * cols / 256; std::vector<i8> q(nb*256); std::vector<float> d(nb); std::vector<int> bs(nb*16);
  launch({(unsigned)((nb + 3) / 4),1,1}, {32,4,1}, [&]{ Q::quantize_q8_k(x.data(), nb, q.data(), d.data(), bs.data()); });
  std::vector<i8> rq; std::vector<float> rd; std::vector<int> rbs; ref_q8_k(x.data(), nb, rq, rd, rbs);
  check(q == rq && !memcmp(d.data(), rd.data(), 4*nb) && bs == rbs, "quantize_q8_k");
}

// `fix`: makes a random block's scale finite where random bytes could
// overflow f32 (MXFP4's exponent), or nullptr.
template <class T, class KERN, class DEQ>
void test_matmul(const char *name, int bl, int bytes_per, int act, KERN kern, DEQ deq,
                 void (*fix)(u8 *) = nullptr) {
  int rows = 37, cols = bl == 256 ? 512 : bl == 64 ? 192 : 96, nb = cols / bl;
  std::vector<u8> w(rows * nb * bytes_per); for (auto &b : w) b = rng();
  if (fix) for (int b = 0; b < rows * nb; b++) fix(w.data() + b * bytes_per);
  // Random bytes: blocks whose scales are not finite are skipped below.
  for (int n : {1, 9, 17}) {
    std::vector<float> x(n * cols); std::mt19937 r2(n); for (auto &v : x) v = std::uniform_real_distribution<float>(-2, 2)(r2);
    std::vector<i8> q; std::vector<float> d, s; std::vector<int> bs;
    if (act == 0) ref_q8_0(x.data(), n * cols / 32, false, q, d, s); // exact sums: the reference is the plain dot
    else ref_q8_k(x.data(), n * cols / 256, q, d, bs);
    if (bs.empty()) bs.resize(n * cols / 16); if (s.empty()) s.resize(n * cols / 32);
    std::vector<float> out(n * rows, -1);
    launch({(unsigned)((rows + 3) / 4), (unsigned)((n + 7) / 8), 1}, {32,4,1}, [&]{ kern(w.data(), rows, cols, n, q.data(), d.data(), s.data(), bs.data(), out.data()); });
    double worst = 0, mag = 1e-9;
    for (int r = 0; r < n; r++) for (int o = 0; o < rows; o++) {
      double want = 0; float blocksz = act == 0 ? 32 : 256;
      for (int c = 0; c < cols; c++) {
        float wv = deq(w.data() + ((size_t)o * nb + c / bl) * bytes_per, c % bl);
        float xv = d[(r * cols + c) / (int)blocksz] * q[r * cols + c];
        want += (double)wv * xv;
      }
      if (!std::isfinite(want)) continue;
      worst = std::max(worst, fabs(want - out[r * rows + o])); mag = std::max(mag, fabs(want));
    }
    char msg[100]; snprintf(msg, 100, "matmul %s n=%d rel err %.2e", name, n, worst / mag);
    check(worst / mag < 1e-5, msg);
  }
}

void test_attention(bool f16) {
  struct C { int nh, nkv, hd, rows, qp, cap, causal, window; };
  for (C c : {C{4,2,64,1,0,8,1,-1}, C{4,1,64,1,150,200,1,-1}, C{2,2,128,7,90,128,1,-1}, C{6,2,32,16,300,400,0,-1}, C{4,4,256,5,60,80,1,16}, C{8,2,64,3,0,3,0,2}}) {
    int qc = c.nh * c.hd, kvc = c.nkv * c.hd, kvr = std::max(c.cap, c.qp + c.rows), kv_len = c.qp + c.rows;
    std::vector<float> q(c.rows * qc), k(kvr * kvc), v(kvr * kvc), out(c.rows * qc, -7);
    for (auto &x : q) x = uni(2); for (auto &x : k) x = uni(2); for (auto &x : v) x = uni(1);
    if (f16) { for (auto &x : k) x = round_f16(x); for (auto &x : v) x = round_f16(x); }
    std::vector<u16> k16(k.size()), v16(v.size()); for (size_t i = 0; i < k.size(); i++) { k16[i] = f32_to_f16(k[i]); v16[i] = f32_to_f16(v[i]); }
    float scale = 1.0f / sqrtf((float)c.hd);
    launch({(unsigned)c.nh, (unsigned)c.rows, 1}, {32,4,1}, [&]{
      if (f16) AT::attention_f16(q.data(), k16.data(), v16.data(), out.data(), c.qp, kv_len, c.causal, c.window, c.nh, c.nkv, c.hd, scale);
      else AT::attention_f32(q.data(), k.data(), v.data(), out.data(), c.qp, kv_len, c.causal, c.window, c.nh, c.nkv, c.hd, scale); });
    double worst = 0, mag = 1e-9;
    for (int r = 0; r < c.rows; r++) for (int h = 0; h < c.nh; h++) {
      int pos = c.qp + r, hi = c.causal ? std::min(pos + 1, kv_len) : kv_len, lo = c.window >= 0 ? std::max(pos + 1 - c.window, 0) : 0; lo = std::min(lo, hi);
      int kh = h / (c.nh / c.nkv);
      std::vector<double> sc; double m = -1e300;
      for (int j = lo; j < hi; j++) { double dot = 0; for (int d = 0; d < c.hd; d++) dot += (double)q[r*qc + h*c.hd + d] * k[j*kvc + kh*c.hd + d]; sc.push_back(dot * scale); m = std::max(m, dot * scale); }
      double l = 0; for (auto &s : sc) { s = exp(s - m); l += s; }
      for (int d = 0; d < c.hd; d++) { double o = 0; for (int j = lo; j < hi; j++) o += sc[j - lo] * v[j*kvc + kh*c.hd + d]; o = l > 0 ? o / l : 0;
        worst = std::max(worst, fabs(o - out[r*qc + h*c.hd + d])); mag = std::max(mag, fabs(o)); }
    }
    char msg[120]; snprintf(msg, 120, "attention %s nh=%d hd=%d rows=%d causal=%d window=%d rel err %.2e", f16 ? "f16" : "f32", c.nh, c.hd, c.rows, c.causal, c.window, worst / mag);
    check(worst / mag < 2e-6, msg);
  }
}

void test_argmax() {
  int rows = 5, cols = 151936; std::vector<float> x(rows * cols); for (auto &v : x) v = uni(10);
  x[5] = 50; x[900] = 50; x[cols + cols - 1] = 60; x[2*cols] = 70; x[3*cols] = NAN; x[4*cols + 3] = NAN; x[4*cols + 10] = 99; x[4*cols+11] = 99;
  std::vector<float> out(rows * 3, -1);
  launch({(unsigned)rows,1,1}, {256,1,1}, [&]{ AR::argmax_rows(x.data(), cols, out.data(), 3, 0, 1); });
  for (int r = 0; r < rows; r++) { int best = 0; for (int i = 0; i < cols; i++) if (x[r*cols+i] > x[r*cols+best]) best = i;
    char msg[80]; snprintf(msg, 80, "argmax row %d: got %g want %d", r, out[r*3+1], best); check(out[r*3+1] == best, msg); }
}

void test_norm_rope() {
  int rows = 3, cols = 300, group = 300; std::vector<float> x(rows*cols), w(group), out(rows*cols);
  for (auto &v : x) v = uni(3); for (auto &v : w) v = uni(1);
  launch({(unsigned)(cols/group),(unsigned)rows,1}, {256,1,1}, [&]{ NO::rms_norm(x.data(), w.data(), cols, group, 1e-6f, out.data()); });
  double worst = 0;
  for (int r = 0; r < rows; r++) { double s = 0; for (int i = 0; i < cols; i++) s += (double)(x[r*cols+i]*x[r*cols+i]);
    float mean = (float)(s / cols); float sc = 1.0f / sqrtf(mean + 1e-6f);
    for (int i = 0; i < cols; i++) worst = std::max(worst, (double)fabsf((x[r*cols+i]*sc)*w[i] - out[r*cols+i])); }
  check(worst < 1e-6, "rms_norm");
  for (int neox = 0; neox < 2; neox++) {
    int nh = 3, hd = 64, nrot = 32, pos0 = 4000, rr = 2, cc = nh * hd; std::vector<float> y(rr * cc); for (auto &v : y) v = uni(2);
    std::vector<float> ref = y; float ts = powf(10000.0f, -2.0f / nrot);
    for (int r = 0; r < rr; r++) { float th = (float)(pos0 + r); for (int i = 0; i < nrot/2; i++) { float s = sinf(th), c = cosf(th);
      for (int h = 0; h < nh; h++) { float *hh = &ref[r*cc + h*hd]; int a = neox ? i : 2*i, b = neox ? i + nrot/2 : 2*i+1; float x0 = hh[a], x1 = hh[b];
        hh[a] = fmaf(x0, c, -(x1*s)); hh[b] = fmaf(x0, s, x1*c); } th *= ts; } }
    launch({(unsigned)((nh*nrot/2 + 127)/128),(unsigned)rr,1}, {128,1,1}, [&]{ RO::rope(y.data(), cc, pos0, nh, hd, nrot, ts, neox); });
    check(y == ref, neox ? "rope neox" : "rope normal");
  }
}

void test_misc() {
  // copy_rows f32 -> f16 at an offset: rows 2..5 of a 6x40 into rows 5..8, column 60, of a 9x100.
  std::vector<float> src(6*40); for (auto &v : src) v = uni(1); src[80] = 65520; src[81] = 1e-6f; src[82] = -3e-8f;
  std::vector<u16> dst(9*100, 0x1234);
  launch({(3*40+255)/256,1,1}, {256,1,1}, [&]{ CP::copy_f32_f16(src.data(), 40, 2, dst.data(), 100, 5, 60, 3); });
  bool ok = true;
  for (int r = 0; r < 9; r++) for (int c = 0; c < 100; c++) {
    u16 want = (r >= 5 && r < 8 && c >= 60) ? f32_to_f16(src[(r - 5 + 2)*40 + c - 60]) : 0x1234;
    ok &= dst[r*100+c] == want; }
  check(ok, "copy_f32_f16 offsets");
  // grouped_conv vs the CPU loop.
  int n = 7, d = 64, T = 3, G = 16, groups = d / G, dc = 2*T*groups;
  std::vector<float> x(n*d), base(2*T*d), dyn(n*dc), out(n*d), want(n*d);
  for (auto &v : x) v = uni(1); for (auto &v : base) v = uni(1); for (auto &v : dyn) v = uni(.5);
  for (int side = 0; side < 2; side++) {
    for (int i = 0; i < n; i++) for (int c = 0; c < d; c++) { float o = 0; for (int t = 0; t < std::min(T, i+1); t++) { int k = side*T + t;
      o += (base[k*d + c] + dyn[i*dc + k*groups + c/G]) * x[(i-t)*d + c]; } want[i*d+c] = o; }
    launch({(unsigned)((n*d+255)/256),1,1}, {256,1,1}, [&]{ CV::grouped_conv(x.data(), base.data(), dyn.data(), n, d, T, G, side, out.data()); });
    check(!memcmp(out.data(), want.data(), 4*n*d), side ? "grouped_conv side 1" : "grouped_conv side 0");
  }
  // embed through the kernel: F32 table 19x64, ids in column 0 of a 5x2 tensor from row 1.
  std::vector<float> table(19*64); for (auto &v : table) v = uni(1);
  std::vector<float> ids = {3,-1, 0,-1, 18,-1, 3,-1, 7,-1}; std::vector<float> eo(3*64, -5);
  launch({1,3,1}, {256,1,1}, [&]{ EM::embed_F32((const u8*)table.data(), 19, 64, ids.data(), 2, 1, eo.data()); });
  ok = true; int want_ids[3] = {0, 18, 3};
  for (int r = 0; r < 3; r++) for (int c = 0; c < 64; c++) ok &= eo[r*64+c] == table[want_ids[r]*64+c];
  check(ok, "embed_from rows (stride 2, row 1)");
  // add_slices
  int rows = 2, dd = 8, nw = 70; std::vector<float> xs(rows*dd*nw), w(nw), o(rows*dd), ow(rows*dd);
  for (auto &v : xs) v = uni(2); for (auto &v : w) v = uni(1); for (int i = 0; i < rows*dd; i++) o[i] = ow[i] = uni(1);
  for (int r = 0; r < rows; r++) for (int j = 0; j < nw; j++) for (int c = 0; c < dd; c++) ow[r*dd+c] += w[j] * xs[r*dd*nw + j*dd + c];
  launch({1,1,1}, {256,1,1}, [&]{ EL::add_slices(xs.data(), w.data(), nw, dd, rows*dd, o.data()); });
  check(!memcmp(o.data(), ow.data(), 4*rows*dd), "add_slices");
  std::vector<float> sp = {NAN, INFINITY, -INFINITY, 1e9f, -7e4f, 3.5f, -0.0f, 65504};
  launch({1,1,1}, {256,1,1}, [&]{ EL::clamp_finite(sp.data(), 65504, 8); });
  check(sp[0] == 0 && sp[1] == 65504 && sp[2] == -65504 && sp[3] == 65504 && sp[4] == -65504 && sp[5] == 3.5f && sp[7] == 65504, "clamp_finite");
}

// The hybrid blocks against straightforward loops (the same sums in the
// same order, so the same floats up to libm's exp).
void test_hybrid() {
  // causal_conv_silu: 3 rows, 4 taps, 300 channels, from a non-zero state.
  int n = 3, c = 300, taps = 4, hist = taps - 1;
  std::vector<float> x(n*c), w(c*taps), st(hist*c), out(n*c), want(n*c);
  for (auto &v : x) v = uni(1); for (auto &v : w) v = uni(1); for (auto &v : st) v = uni(1);
  std::vector<float> win(st); win.insert(win.end(), x.begin(), x.end());
  for (int t = 0; t < n; t++) for (int ch = 0; ch < c; ch++) { float s = 0;
    for (int k = 0; k < taps; k++) s = s + win[(t+k)*c + ch] * w[ch*taps + k]; want[t*c+ch] = s / (1.0f + expf(-s)); }
  std::vector<float> want_st(win.begin() + n*c, win.end());
  launch({(unsigned)((c+255)/256),1,1}, {256,1,1}, [&]{ DN::causal_conv_silu(x.data(), (const unsigned char*)w.data(), n, c, taps, st.data(), out.data()); });
  check(out == want && st == want_st, "causal_conv_silu");
  // gated_delta_rule: 2 key heads under 4 value heads of 48 keys by 160 values (two column blocks), 3 rows.
  int hk = 2, hv = 4, dk = 48, dv = 160, width = 2*hk*dk + hv*dv;
  std::vector<float> xr(n*width), al(n*hv), be(n*hv), dt(hv), a(hv), s(hv*dk*dv), o(n*hv*dv), wo(n*hv*dv);
  for (auto &v : xr) v = uni(1); for (auto &v : al) v = uni(2); for (auto &v : be) v = uni(2);
  for (auto &v : dt) v = uni(.5); for (auto &v : a) v = -fabsf(uni(1)); for (auto &v : s) v = uni(.5);
  std::vector<float> ws(s);
  for (int t = 0; t < n; t++) { const float *row = &xr[t*width];
    for (int h = 0; h < hv; h++) { int kh = h % hk; float qq = 0, kk = 0;
      for (int i = 0; i < dk; i++) { qq += row[kh*dk+i]*row[kh*dk+i]; kk += row[(hk+kh)*dk+i]*row[(hk+kh)*dk+i]; }
      float qs = (1.0f / sqrtf((float)dk)) / fmaxf(sqrtf(qq), 1e-6f), ks = 1.0f / fmaxf(sqrtf(kk), 1e-6f);
      float u = al[t*hv+h] + dt[h]; float g = expf((u > 20 ? u : logf(1 + expf(u))) * a[h]); float b = 1 / (1 + expf(-be[t*hv+h]));
      for (int j = 0; j < dv; j++) { float *col = &ws[(size_t)h*dk*dv + j]; float sk = 0;
        for (int i = 0; i < dk; i++) { float e = col[i*dv] * g; col[i*dv] = e; sk += e * (row[(hk+kh)*dk+i]*ks); }
        float d = (row[2*hk*dk + h*dv + j] - sk) * b; float acc = 0;
        for (int i = 0; i < dk; i++) { float e = col[i*dv] + (row[(hk+kh)*dk+i]*ks)*d; col[i*dv] = e; acc += e * (row[kh*dk+i]*qs); }
        wo[(t*hv+h)*dv + j] = acc; } } }
  launch({(unsigned)hv,(unsigned)((dv+127)/128),1}, {128,1,1}, [&]{ DN::gated_delta_rule(xr.data(), al.data(), be.data(), dt.data(), a.data(), n, hk, hv, dk, dv, 1e-6f, s.data(), o.data()); });
  double worst = 0, scale = 1e-6;
  for (size_t i = 0; i < wo.size(); i++) { worst = std::max(worst, (double)fabsf(o[i] - wo[i])); scale = std::max(scale, (double)fabsf(wo[i])); }
  for (size_t i = 0; i < ws.size(); i++) worst = std::max(worst, (double)fabsf(s[i] - ws[i]) / 10);
  check(worst <= 1e-5 * scale, "gated_delta_rule (two column blocks, shared key heads)");
  // split_heads, sigmoid_mul
  int heads = 3, hd = 5, rows = 2; std::vector<float> q(rows*heads*2*hd), f1(rows*heads*hd), f2(rows*heads*hd);
  for (auto &v : q) v = uni(4);
  launch({1,1,1}, {256,1,1}, [&]{ GA::split_heads(q.data(), rows*heads*hd, hd, f1.data(), f2.data()); });
  bool ok = true;
  for (int e = 0; e < rows*heads*hd; e++) ok &= f1[e] == q[(e/hd)*2*hd + e%hd] && f2[e] == q[(e/hd)*2*hd + hd + e%hd];
  check(ok, "split_heads");
  std::vector<float> gx(f1), want_g(f1);
  for (size_t e = 0; e < gx.size(); e++) want_g[e] = want_g[e] / (1.0f + expf(-f2[e]));
  launch({1,1,1}, {256,1,1}, [&]{ GA::sigmoid_mul(f2.data(), (int)gx.size(), gx.data()); });
  check(gx == want_g, "sigmoid_mul");
}

int main() {
  test_quantize();
  test_matmul<MM::Q4_K>("Q4_K", 256, 144, 1, MM::matmul_Q4_K, EM::deq_q4_k);
  test_matmul<MM::Q6_K>("Q6_K", 256, 210, 1, MM::matmul_Q6_K, EM::deq_q6_k);
  test_matmul<MM::Q4_1>("Q4_1", 32, 20, 0, MM::matmul_Q4_1, EM::deq_q4_1);
  test_matmul<MM::Q5_0>("Q5_0", 32, 22, 0, MM::matmul_Q5_0, EM::deq_q5_0);
  test_matmul<MM::IQ2_XXS>("IQ2_XXS", 256, 66, 1, MM::matmul_IQ2_XXS, EM::deq_iq2_xxs);
  test_matmul<MM::IQ2_XS>("IQ2_XS", 256, 74, 1, MM::matmul_IQ2_XS, EM::deq_iq2_xs);
  test_matmul<MM::IQ2_S>("IQ2_S", 256, 82, 1, MM::matmul_IQ2_S, EM::deq_iq2_s);
  test_matmul<MM::IQ3_XXS>("IQ3_XXS", 256, 98, 1, MM::matmul_IQ3_XXS, EM::deq_iq3_xxs);
  test_matmul<MM::IQ3_S>("IQ3_S", 256, 110, 1, MM::matmul_IQ3_S, EM::deq_iq3_s);
  test_matmul<MM::IQ1_S>("IQ1_S", 256, 50, 1, MM::matmul_IQ1_S, EM::deq_iq1_s);
  test_matmul<MM::IQ1_M>("IQ1_M", 256, 56, 1, MM::matmul_IQ1_M, EM::deq_iq1_m);
  test_matmul<MM::TQ1_0>("TQ1_0", 256, 54, 1, MM::matmul_TQ1_0, EM::deq_tq1_0);
  test_matmul<MM::TQ2_0>("TQ2_0", 256, 66, 1, MM::matmul_TQ2_0, EM::deq_tq2_0);
  test_matmul<MM::MXFP4>("MXFP4", 32, 17, 0, MM::matmul_MXFP4, EM::deq_mxfp4, [](u8 *b) { b[0] = 100 + b[0] % 50; });
  test_matmul<MM::NVFP4>("NVFP4", 64, 36, 0, MM::matmul_NVFP4, EM::deq_nvfp4);
  test_attention(false); test_attention(true);
  test_argmax();
  test_norm_rope();
  test_misc();
  test_hybrid();
  printf(bad ? "BAD %d\n" : "ALL OK\n", bad);
  return bad != 0;
}
