// Checks the device's block decoding on the host (run by tests/host.rs):
// every value embed.cu dequantizes equals the reference dequantizer's (read
// from the file argv[1] names), and for every block, the sum of matmul.cu's
// unit contributions (decoded quants, integer dot, scale and min terms)
// equals the dot of the dequantized block with the activations.
#include "emulator.h"
#include "common.cuh"
#include "grids.cuh" // written by tests/host.rs from compile::grids_source
namespace E {
#include "embed.cu"
}
namespace M {
#include "matmul.cu"
}
typedef float (*Deq)(const u8 *, int);
typedef double (*UnitCheck)(const u8 *, const float *, unsigned &);

// Sum over all units of a block of the kernel's contribution (matmul.cu's
// unit_term on the decoded unit), vs the dequantized dot; one activation
// scale for the whole block.
template <class T> double unit_check(const u8 *blk, const float *deq, unsigned &seed) {
  typedef typename M::UnitOf<T>::type U;
  alignas(4) i8 xq[256]; int bs[16]; float xd = 0.37f;
  for (int i = 0; i < T::BL; i++) { seed = seed * 1103515245 + 12345; xq[i] = (i8)((seed >> 16) & 0xff); }
  for (int g = 0; g < T::BL / 16; g++) { bs[g] = 0; for (int l = 0; l < 16; l++) bs[g] += xq[16*g+l]; }
  double got = 0;
  for (int part = 0; part < T::UPB; part++) {
    U u; T::decode(blk, part, u);
    int e0 = part * T::UNIT, sum32 = 0;
    for (int i = 0; i < 32 && T::HAS_M; i++) sum32 += xq[e0 / 32 * 32 + i];
    float xs = xd * (float)sum32;
    got += M::unit_term<T>(u, (const int *)(xq + e0), &xd, &xs, 0, bs, e0 / 16);
  }
  double want = 0, mag = 0;
  for (int i = 0; i < T::BL; i++) { want += (double)deq[i] * xd * xq[i]; mag += fabs((double)deq[i] * xd * xq[i]); }
  return fabs(got - want) / (mag + 1e-9);
}

struct TypeInfo { const char *name; int bl, bytes; Deq deq; UnitCheck unit; };
// blockdraft_core::conformance::WEIGHT_TYPES, in its order.
#define QT(NAME, BL, BYTES, DEQ) {#NAME, BL, BYTES, E::DEQ, unit_check<M::NAME>}
static const TypeInfo TYPES[] = {
  {"F32",1,4,E::deq_f32,nullptr},{"F16",1,2,E::deq_f16,nullptr},{"BF16",1,2,E::deq_bf16,nullptr},
  QT(Q4_0,32,18,deq_q4_0), QT(Q4_1,32,20,deq_q4_1), QT(Q5_0,32,22,deq_q5_0), QT(Q5_1,32,24,deq_q5_1),
  QT(Q8_0,32,34,deq_q8_0), QT(Q8_1,32,36,deq_q8_1), QT(Q2_K,256,84,deq_q2_k), QT(Q3_K,256,110,deq_q3_k),
  QT(Q4_K,256,144,deq_q4_k), QT(Q5_K,256,176,deq_q5_k), QT(Q6_K,256,210,deq_q6_k), QT(Q8_K,256,292,deq_q8_k),
  QT(IQ4_NL,32,18,deq_iq4_nl), QT(IQ4_XS,256,136,deq_iq4_xs),
  QT(IQ2_XXS,256,66,deq_iq2_xxs), QT(IQ2_XS,256,74,deq_iq2_xs), QT(IQ2_S,256,82,deq_iq2_s),
  QT(IQ3_XXS,256,98,deq_iq3_xxs), QT(IQ3_S,256,110,deq_iq3_s), QT(IQ1_S,256,50,deq_iq1_s),
  QT(IQ1_M,256,56,deq_iq1_m), QT(TQ1_0,256,54,deq_tq1_0), QT(TQ2_0,256,66,deq_tq2_0),
  QT(MXFP4,32,17,deq_mxfp4), QT(NVFP4,64,36,deq_nvfp4)};
static const int N_TYPES = sizeof(TYPES) / sizeof(TYPES[0]);

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  FILE *f = fopen(argv[1], "rb");
  if (!f) return 2;
  int bad = 0;
  for (int t = 0; t < N_TYPES; t++) {
    u32 id, nb, nbytes;
    if (fread(&id, 4, 1, f) != 1 || fread(&nb, 4, 1, f) != 1 || fread(&nbytes, 4, 1, f) != 1 || id >= (u32)N_TYPES) return 2;
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
      double r = ti.unit(blk, dq, seed);
      worst = std::max(worst, r);
    }
    printf("%-7s dequant mismatches %d/%d, matmul unit rel err %.2e\n", ti.name, mism, n, worst);
    if (mism || worst > 1e-5) bad++;
  }
  printf(bad ? "BAD\n" : "ALL OK\n");
  return bad;
}
