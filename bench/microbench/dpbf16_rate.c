// One core's VDPBF16PS rate: 1 to 16 independent accumulator chains (register operands only),
// and 16 chains of VFMADD231PS beside it, plus the core clock from a chain of dependent adds.
// The floor of the AVX-512 BF16 CPU attention kernel (csrc/attn_bf16.cpp): per KV token and
// KV head, G query heads x (Dk + Dv) / 32 dot-product instructions.
// Build and run (x86-64 with AVX-512 BF16): gcc -O2 -mavx512f dpbf16_rate.c -o dpbf16 && ./dpbf16
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define D(r) "vdpbf16ps %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define F(r) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define REPORT(name, per) printf("%-16s %.2f G/s\n", name, (per) * (double)N / (now() - t0) / 1e9)
int main(void) {
    const long N = 100000000;
    double t0;
    __asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31" ::: "xmm30", "xmm31");
    t0 = now(); for (long i = 0; i < N; i++) __asm__ volatile(D(0) D(0) D(0) D(0) D(0) D(0) D(0) D(0) ::: "xmm0");
    REPORT("dpbf16 1 chain", 8);
    t0 = now(); for (long i = 0; i < N; i++) __asm__ volatile(D(0) D(1) D(0) D(1) D(0) D(1) D(0) D(1) ::: "xmm0", "xmm1");
    REPORT("dpbf16 2 chains", 8);
    t0 = now(); for (long i = 0; i < N; i++) __asm__ volatile(D(0) D(1) D(2) D(3) D(0) D(1) D(2) D(3) ::: "xmm0", "xmm1", "xmm2", "xmm3");
    REPORT("dpbf16 4 chains", 8);
    t0 = now(); for (long i = 0; i < N; i++) __asm__ volatile(D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7");
    REPORT("dpbf16 8 chains", 8);
    t0 = now(); for (long i = 0; i < N; i++) __asm__ volatile(D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11) D(12) D(13) D(14) D(15)
        ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    REPORT("dpbf16 16 chains", 16);
    t0 = now(); for (long i = 0; i < N; i++) __asm__ volatile(F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15)
        ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    REPORT("fma 16 chains", 16);
    long v = 1;
    t0 = now(); for (long i = 0; i < 10 * N; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(v));
    printf("clock ~ %.2f GHz (dependent adds)\n", 40.0 * N / (now() - t0) / 1e9);
    return 0;
}
