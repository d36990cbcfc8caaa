// Checks the device's block decoding on the host (run by tests/host_decode.rs):
// every value embed.cu dequantizes equals the reference dequantizer's (read
// from the file argv[1] names), and for every block, the sum of matmul.cu's
// unit contributions (decoded quants, integer dot, scale and min terms)
// equals the dot of the dequantized block with the activations.
#include "emulator.h"
#include "common.cuh"
namespace E {
#include "embed.cu"
}
namespace M {
#include "matmul.cu"
}
typedef float (*Deq)(const u8 *, int);
struct TypeInfo { const char *name; int bl, bytes; Deq deq; };
static TypeInfo TYPES[15] = {
  {"F32",1,4,E::deq_f32},{"F16",1,2,E::deq_f16},{"BF16",1,2,E::deq_bf16},
  {"Q4_0",32,18,E::deq_q4_0},{"Q4_1",32,20,E::deq_q4_1},{"Q5_0",32,22,E::deq_q5_0},{"Q5_1",32,24,E::deq_q5_1},
  {"Q8_0",32,34,E::deq_q8_0},{"Q8_1",32,36,E::deq_q8_1},{"Q2_K",256,84,E::deq_q2_k},{"Q3_K",256,110,E::deq_q3_k},
  {"Q4_K",256,144,E::deq_q4_k},{"Q5_K",256,176,E::deq_q5_k},{"Q6_K",256,210,E::deq_q6_k},{"Q8_K",256,292,E::deq_q8_k}};

// Sum over all units of a block of the kernel's contribution, vs the dequantized dot.
template <class T> double unit_check(const u8 *blk, const float *deq, unsigned &seed) {
  typedef typename M::UnitOf<T>::type U;
  i8 xq[256]; int bs[16]; float xd = 0.37f;
  for (int i = 0; i < T::BL; i++) { seed = seed * 1103515245 + 12345; xq[i] = (i8)((seed >> 16) & 0xff); }
  for (int g = 0; g < T::BL / 16; g++) { bs[g] = 0; for (int l = 0; l < 16; l++) bs[g] += xq[16*g+l]; }
  int sum32 = 0; for (int i = 0; i < T::BL && T::BL == 32; i++) sum32 += xq[i];
  float xs = xd * (float)sum32;
  double got = 0;
  for (int part = 0; part < T::UPB; part++) {
    U u; T::decode(blk, part, u);
    const int *x = (const int *)(xq + part * T::UNIT);
    int s = 0; for (int k = 0; k < T::UNIT / 4; k++) s = __dp4a(u.q[k], x[k], s);
    if (T::K) got += xd * (u.a * (float)(u.sc * s) - u.b * (float)(u.mn * bs[part]));
    else if (T::HAS_M) got += u.a * xd * (float)s + u.b * xs;
    else got += u.a * xd * (float)s;
  }
  double want = 0, mag = 0;
  for (int i = 0; i < T::BL; i++) { want += (double)deq[i] * xd * xq[i]; mag += fabs((double)deq[i] * xd * xq[i]); }
  return fabs(got - want) / (mag + 1e-9);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  FILE *f = fopen(argv[1], "rb");
  if (!f) return 2;
  int bad = 0;
  for (int t = 0; t < 15; t++) {
    u32 id, nb, nbytes;
    if (fread(&id, 4, 1, f) != 1 || fread(&nb, 4, 1, f) != 1 || fread(&nbytes, 4, 1, f) != 1 || id >= 15) return 2;
    std::vector<u8> bytes(nbytes);
    if (fread(bytes.data(), 1, nbytes, f) != nbytes) return 2;
    TypeInfo ti = TYPES[id];
    int n = nb * ti.bl;
    std::vector<float> want(n);
    if (fread(want.data(), 4, n, f) != (size_t)n) return 2;
    int mism = 0;
    for (int e = 0; e < n; e++) {
      float got = ti.deq(bytes.data() + (e / ti.bl) * ti.bytes, e % ti.bl);
      if (memcmp(&got, &want[e], 4) != 0) { if (mism < 3) printf("%s e=%d got %g want %g\n", ti.name, e, got, want[e]); mism++; }
    }
    double worst = 0; unsigned seed = 7;
    for (u32 b = 0; b < nb && ti.bl > 1; b++) {
      const u8 *blk = bytes.data() + b * ti.bytes; const float *dq = want.data() + b * ti.bl;
      double r = 0;
      switch (id) {
        case 3: r = unit_check<M::Q4_0>(blk, dq, seed); break; case 4: r = unit_check<M::Q4_1>(blk, dq, seed); break;
        case 5: r = unit_check<M::Q5_0>(blk, dq, seed); break; case 6: r = unit_check<M::Q5_1>(blk, dq, seed); break;
        case 7: r = unit_check<M::Q8_0>(blk, dq, seed); break; case 8: r = unit_check<M::Q8_1>(blk, dq, seed); break;
        case 9: r = unit_check<M::Q2_K>(blk, dq, seed); break; case 10: r = unit_check<M::Q3_K>(blk, dq, seed); break;
        case 11: r = unit_check<M::Q4_K>(blk, dq, seed); break; case 12: r = unit_check<M::Q5_K>(blk, dq, seed); break;
        case 13: r = unit_check<M::Q6_K>(blk, dq, seed); break; case 14: r = unit_check<M::Q8_K>(blk, dq, seed); break;
      }
      worst = std::max(worst, r);
    }
    printf("%-5s dequant mismatches %d/%d, matmul unit rel err %.2e\n", ti.name, mism, n, worst);
    if (mism || worst > 1e-5) bad++;
  }
  printf(bad ? "BAD\n" : "ALL OK\n");
  return bad;
}
