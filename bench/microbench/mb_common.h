// Helpers shared by the microbenchmarks that pin threads and use AMX tiles (Linux, x86-64): the
// time, pinning, the tile configuration, the clock from dependent adds, and a measurement on
// one vCPU and then on all of them.
#ifndef WS_MB_COMMON_H
#define WS_MB_COMMON_H
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

// the clock from a chain of dependent adds (one a cycle), GHz
static inline double mb_ghz(void) {
    uint64_t x = 0; double t = now();
    for (long i = 0; i < 200000000L; i++) __asm__ volatile("add $1, %0" : "+r"(x));
    return 0.2 / (now() - t);
}

// One measurement per thread: `fn(job)` pins itself to job->cpu, waits at job->bar when it is
// set (so that every thread starts together), and leaves its figure in job->value.
struct mb_job { int cpu, variant; long arg; double secs, value; pthread_barrier_t* bar; };
struct mb_spread { double one, mean, lo, hi; };

// fn alone on vCPU 0, then on every vCPU at once (each thread its own job): the lone figure,
// and the mean, least and most of the all-vCPU run
static inline struct mb_spread mb_one_then_all(void* (*fn)(void*), int variant, long arg, double secs) {
    const int n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    struct mb_spread r = {0, 0, 1e300, 0};
    struct mb_job one = {0, variant, arg, secs, 0, NULL};
    pthread_t th;
    pthread_create(&th, NULL, fn, &one);
    pthread_join(th, NULL);
    r.one = one.value;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, n);
    struct mb_job* js = calloc(n, sizeof *js);
    pthread_t* ts = calloc(n, sizeof *ts);
    for (int c = 0; c < n; c++) { js[c] = (struct mb_job){c, variant, arg, secs, 0, &bar}; pthread_create(&ts[c], NULL, fn, &js[c]); }
    for (int c = 0; c < n; c++) {
        pthread_join(ts[c], NULL);
        r.mean += js[c].value / n;
        if (js[c].value < r.lo) r.lo = js[c].value;
        if (js[c].value > r.hi) r.hi = js[c].value;
    }
    free(js); free(ts);
    pthread_barrier_destroy(&bar);
    return r;
}
#endif
