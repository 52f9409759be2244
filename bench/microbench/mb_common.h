// Helpers shared by the microbenchmarks that pin threads and use AMX tiles (Linux, x86-64).
#ifndef WS_MB_COMMON_H
#define WS_MB_COMMON_H
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>

struct cfg_t { uint8_t palette, start_row, res[14]; uint16_t colsb[16]; uint8_t rows[16]; };

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

// the calling thread onto vCPU `cpu`
static void pin(int cpu) {
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

// the AMX permission (ARCH_REQ_XCOMP_PERM for XTILEDATA) and eight 16 x 64-byte tiles
static void tiles_config(void) {
    syscall(SYS_arch_prctl, 0x1023, 18);
    struct cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
    for (int i = 0; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
    _tile_loadconfig(&c);
}
#endif
