// One core: how much of a DRAM stream does AMX work hide? Reads a 1 GiB array as 1 KB tiles
// (TILELOADD) with k dependent TDPBF16PS per tile (a stand-in for the attention kernel's work
// per KV byte), with and without a software prefetch (PREFETCHT1) d KB ahead, and prints the
// rate next to the same work on a cache-resident 64 KB window ("compute-only").
// Build and run (an AMX CPU, Linux): gcc -O2 -mamx-tile -mamx-bf16 -mavx512f amx_overlap.c -o ov
//   && ./ov 0 && ./ov 128      (argument: prefetch distance in KB, 0 = none)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct cfg_t { uint8_t palette, start_row, res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define SZ (1L << 30)

int main(int argc, char** argv) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { fprintf(stderr, "no AMX permission\n"); return 1; }
    struct cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
    for (int i = 0; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
    _tile_loadconfig(&c);
    char* buf = aligned_alloc(1 << 21, SZ);
    madvise(buf, SZ, MADV_HUGEPAGE);
    memset(buf, 1, SZ);
    const long pfd = argc > 1 ? atol(argv[1]) * 1024 : 0;
    _tile_zero(1); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    for (int k = 0; k <= 12; k += 3) {
        double best = 0;
        for (int rep = 0; rep < 2; rep++) {
            double t = now();
            for (long g = 0; g < SZ; g += 1024) {
                if (pfd && g + pfd < SZ)
                    for (int l = 0; l < 16; l++) _mm_prefetch(buf + g + pfd + l * 64, _MM_HINT_T1);
                _tile_loadd(4, buf + g, 64);
                _tile_dpbf16ps(0, 4, 5);
                for (int j = 0; j < k; j++) _tile_dpbf16ps(1, 6, 7);
            }
            double r = SZ / (now() - t) / 1e9;
            if (r > best) best = r;
        }
        double t = now();
        for (long g = 0; g < SZ / 16; g += 1024) {
            _tile_loadd(4, buf + (g & 65535), 64);
            _tile_dpbf16ps(0, 4, 5);
            for (int j = 0; j < k; j++) _tile_dpbf16ps(1, 6, 7);
        }
        double dc = (now() - t) * 16;
        printf("prefetch %ld KB ahead, %2d TDPs per KB: %5.1f GB/s (compute-only %5.1f GB/s)\n",
               pfd / 1024, k, best, SZ / dc / 1e9);
    }
    return 0;
}
