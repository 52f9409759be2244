// One core: the AMX CPU attention kernel's MLA Q.K over C-layout blocks (token pairs
// interleaved, [pairs][576][2] bf16), one 256-token pass held in L2, timed alone. The C layout
// needs the parity trick (each TDPBF16PS's 32-value depth is 16 dims x 2 tokens, the B operand
// zero for the other token): 576 tile products per pass where token-major rows need 288.
// "current" is the kernel's schedule (two groups per step share two B tiles); "one group,
// double-buffered B" frees the write-after-read waits on the B tiles at twice the B loads.
// Build and run: gcc -O2 -mamx-tile -mamx-bf16 -mavx512f amx_mla_qk.c -o qk && ./qk
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct cfg_t { uint8_t palette, start_row, res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define NK 36    /* 16-dim steps over 576 dims */
#define RS 2304  /* bytes between pair rows: 576 dims x 2 tokens x 2 bytes */

int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { fprintf(stderr, "no AMX permission\n"); return 1; }
    struct cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
    for (int i = 0; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
    _tile_loadconfig(&c);
    char* kv = aligned_alloc(64, 8 * 16 * RS);  /* 8 groups of 16 pair rows: 256 tokens */
    uint16_t* bq = aligned_alloc(64, 2 * NK * 1024);
    float* C = aligned_alloc(64, 4096 * 4);
    memset(kv, 0, 8 * 16 * RS);
    memset(bq, 0, 2 * NK * 1024);
    const long R = 20000;
    const double bytes = 8 * 16 * RS;
    for (int rep = 0; rep < 3; rep++) {
        double t = now();
        for (long r = 0; r < R; r++)
            for (int gp = 0; gp < 8; gp += 2) {
                const char *s0 = kv + gp * 16 * RS, *s1 = kv + (gp + 1) * 16 * RS;
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                for (int dc = 0; dc < NK; dc++) {
                    _tile_loadd(6, bq + dc * 512, 64);
                    _tile_loadd(7, bq + (NK + dc) * 512, 64);
                    _tile_loadd(4, s0 + 64 * dc, RS);
                    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                    _tile_loadd(5, s1 + 64 * dc, RS);
                    _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(0, C, 64); _tile_stored(1, C + 256, 64);
                _tile_stored(2, C + 512, 64); _tile_stored(3, C + 768, 64);
            }
        const double da = (now() - t) / R;
        t = now();
        for (long r = 0; r < R; r++)
            for (int g = 0; g < 8; g++) {
                const char* s0 = kv + g * 16 * RS;
                _tile_zero(0); _tile_zero(1);
                for (int dc = 0; dc < NK; dc += 2) {
                    _tile_loadd(4, bq + dc * 512, 64); _tile_loadd(5, bq + (NK + dc) * 512, 64);
                    _tile_loadd(2, s0 + 64 * dc, RS);
                    _tile_dpbf16ps(0, 2, 4); _tile_dpbf16ps(1, 2, 5);
                    _tile_loadd(6, bq + (dc + 1) * 512, 64); _tile_loadd(7, bq + (NK + dc + 1) * 512, 64);
                    _tile_loadd(3, s0 + 64 * (dc + 1), RS);
                    _tile_dpbf16ps(0, 3, 6); _tile_dpbf16ps(1, 3, 7);
                }
                _tile_stored(0, C, 64); _tile_stored(1, C + 256, 64);
            }
        const double db = (now() - t) / R;
        printf("MLA Q.K of a 256-token pass (288 KB in L2): current %.2f us (%.1f GB/s, %.1f ns per "
               "tile product); one group, double-buffered B %.2f us (%.1f GB/s)\n",
               da * 1e6, bytes / da / 1e9, da / 576 * 1e9, db * 1e6, bytes / db / 1e9);
    }
    return 0;
}
