// Reference timing of ggml's CPU mul_mat on the shapes of
// examples/matmul_bench.rs, to compare blockdraft's kernels with llama.cpp's
// on the same machine (interleave the two; this machine is shared).
//
// Build against a llama.cpp build (GGML_NATIVE, CPU backend):
//   gcc -O2 ggml_matmul_ref.c -I$LLAMA/ggml/include -L$LLAMA/build/bin \
//       -lggml -lggml-base -lggml-cpu -Wl,-rpath,$LLAMA/build/bin -o ggml_matmul_ref
//   ./ggml_matmul_ref Q4_K 1536 1536 8 1     # TYPE ROWS COLS N THREADS
// Prints median ms, median / best GB/s of weight bytes and, with 1 thread,
// GB/s over the thread's CPU time. Note ggml_graph_compute_with_ctx starts
// its threads per call, so its multi-thread numbers include that cost.
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static double tcpu(void){struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  enum ggml_type ty = strcmp(argv[1],"Q6_K")==0?GGML_TYPE_Q6_K: strcmp(argv[1],"Q8_0")==0?GGML_TYPE_Q8_0: strcmp(argv[1],"Q4_0")==0?GGML_TYPE_Q4_0: GGML_TYPE_Q4_K;
  int rows=atoi(argv[2]), cols=atoi(argv[3]), n=atoi(argv[4]), nt=atoi(argv[5]);
  ggml_cpu_init();
  size_t wbytes = ggml_row_size(ty, cols)*rows;
  struct ggml_init_params ip = { wbytes + (size_t)n*cols*4 + (size_t)n*rows*4 + 64*1024*1024, NULL, false };
  struct ggml_context*ctx=ggml_init(ip);
  struct ggml_tensor*W=ggml_new_tensor_2d(ctx,ty,cols,rows);
  struct ggml_tensor*X=ggml_new_tensor_2d(ctx,GGML_TYPE_F32,cols,n);
  unsigned long long s=0x1234567;
  unsigned char*wd=W->data; for(size_t i=0;i<wbytes;i++){s^=s>>12;s^=s<<25;s^=s>>27; wd[i]=(s*0x2545F4914F6CDD1DULL)>>56;}
  size_t bb = ggml_row_size(ty, 256);  // bytes per 256 elements
  size_t blk = (ty==GGML_TYPE_Q4_K)?144:(ty==GGML_TYPE_Q6_K)?210:(ty==GGML_TYPE_Q8_0)?34:18;
  unsigned short h=0x211f; // f16 0.01
  for(size_t b=0;b<wbytes/blk;b++){unsigned char*p=wd+b*blk; if(ty==GGML_TYPE_Q4_K){memcpy(p,&h,2);memcpy(p+2,&h,2);} else if(ty==GGML_TYPE_Q6_K) memcpy(p+208,&h,2); else memcpy(p,&h,2);}
  (void)bb;
  float*xd=X->data; for(long i=0;i<(long)n*cols;i++) xd[i]=(float)rand()/RAND_MAX*2-1;
  struct ggml_tensor*Y=ggml_mul_mat(ctx,W,X);
  struct ggml_cgraph*g=ggml_new_graph(ctx); ggml_build_forward_expand(g,Y);
  ggml_graph_compute_with_ctx(ctx,g,nt);
  double ts[400]; int k=0; double t0=now(), c0=tcpu();
  while(k<5 || (now()-t0<0.3 && k<400)){ double a=now(); ggml_graph_compute_with_ctx(ctx,g,nt); ts[k++]=now()-a; }
  double cpu=tcpu()-c0;
  qsort(ts,k,sizeof(double),cmp);
  printf("ggml  %-5s %6d x %5d %4d %3d %10.3f %7.2f   best %7.2f  cpu %7.2f\n", argv[1], rows, cols, nt, n, ts[k/2]*1e3, wbytes/ts[k/2]/1e9, wbytes/ts[0]/1e9, nt==1? wbytes*(double)k/cpu/1e9 : 0.0);
  return 0; }
