// Are the host's vCPUs whole cores, and what clock do they run under AMX load?
// 1. The clock: dependent adds (one a cycle) timed against CLOCK_MONOTONIC, on vCPU 0 alone,
//    then on all vCPUs at once, then on all vCPUs with tile products between the timed chains.
// 2. Pairs: the tile unit's rate (four chains of TDPBF16PS, no loads) on vCPU 0 alone and beside
//    the same loop on vCPU j, for every j. Two hyperthreads of one core share one tile unit: a
//    sibling would halve vCPU 0's rate; separate cores leave it alone.
// 3. Pairs again with a core-bound vector loop (FMA chains): SMT siblings share the ports.
// The CPU kernel's L2-resident MLA work per group took twice as long with 16 threads as with one
// on the H200 host (seventeenth session): a lower all-core clock or shared cores would do that.
// Build and run (an AMX CPU, Linux): gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f
//   amx_siblings.c -o sib && ./sib
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mb_common.h"

static void tiles_on(void) {
    tiles_config();
    static char b[4096] __attribute__((aligned(64)));
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, b, 64); _tile_loadd(5, b + 1024, 64); _tile_loadd(6, b + 2048, 64); _tile_loadd(7, b + 3072, 64);
}

static inline void products(long n) {
    for (long i = 0; i < n; i++) {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
}

// n x 100 dependent adds; returns GHz (adds per ns)
static double clock_ghz(long n) {
    uint64_t x = 1;
    double t = now();
    for (long i = 0; i < n; i++) {
        __asm__ volatile(
            ".rept 100\n\t"
            "add %1, %0\n\t"
            ".endr"
            : "+r"(x) : "r"((uint64_t)3));
    }
    return 100.0 * n / ((now() - t) * 1e9) + (double)(x & 0) ;
}

static double fma_chains(long n) {  // ns per FMA over 8 independent zmm chains
    __m512 a0 = _mm512_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    double t = now();
    for (long i = 0; i < n; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c); a2 = _mm512_fmadd_ps(a2, m, c); a3 = _mm512_fmadd_ps(a3, m, c);
        a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c); a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
    }
    double dt = now() - t;
    volatile float sink = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a6, a7)));
    (void)sink; (void)a2; (void)a3; (void)a4; (void)a5;
    return dt / (8.0 * n) * 1e9;
}

enum { CLOCK, CLOCK_AMX, TILES, TILES_BG, FMA, FMA_BG };
struct job { int cpu, mode; volatile int* stop; pthread_barrier_t* bar; double result; };

static void* worker(void* p) {
    struct job* j = p;
    pin(j->cpu);
    if (j->mode == CLOCK_AMX || j->mode == TILES || j->mode == TILES_BG) tiles_on();
    pthread_barrier_wait(j->bar);
    double t0 = now(), acc = 0; long reps = 0;
    switch (j->mode) {
    case CLOCK:  // 0.5 s of timed chains
        while (now() - t0 < 0.5) { acc += clock_ghz(20000); reps++; }
        j->result = acc / reps; break;
    case CLOCK_AMX:  // tile products, then a short timed chain, for 0.5 s
        while (now() - t0 < 0.5) { products(20000); acc += clock_ghz(200); reps++; }
        j->result = acc / reps; break;
    case TILES: {
        const long n = 1000000; double t = now();
        products(n);
        j->result = (now() - t) / (4.0 * n) * 1e9; break;
    }
    case TILES_BG: while (!*j->stop) products(10000); break;
    case FMA: j->result = fma_chains(20000000); break;
    case FMA_BG: while (!*j->stop) fma_chains(100000); break;
    }
    if (j->mode == CLOCK_AMX || j->mode == TILES || j->mode == TILES_BG) _tile_release();
    return NULL;
}

// run `n` jobs at once; the first one's result (or the mean over all when `mean`)
static double run_jobs(struct job* jobs, int n, int mean) {
    pthread_t th[256];
    pthread_barrier_t bar; pthread_barrier_init(&bar, NULL, n);
    volatile int stop = 0;
    for (int i = 0; i < n; i++) { jobs[i].bar = &bar; jobs[i].stop = &stop; pthread_create(&th[i], NULL, worker, &jobs[i]); }
    pthread_join(th[0], NULL);
    stop = 1;
    for (int i = 1; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    if (!mean) return jobs[0].result;
    double s = 0; for (int i = 0; i < n; i++) s += jobs[i].result;
    return s / n;
}

int main(void) {
    const int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    struct job jobs[256];
    memset(jobs, 0, sizeof jobs);
    jobs[0] = (struct job){0, CLOCK};
    printf("clock, vCPU 0 alone: %.2f GHz\n", run_jobs(jobs, 1, 0));
    for (int i = 0; i < ncpu; i++) jobs[i] = (struct job){i, CLOCK};
    printf("clock, all %d vCPUs: %.2f GHz (mean)\n", ncpu, run_jobs(jobs, ncpu, 1));
    jobs[0] = (struct job){0, CLOCK_AMX};
    printf("clock between tile products, vCPU 0 alone: %.2f GHz\n", run_jobs(jobs, 1, 0));
    for (int i = 0; i < ncpu; i++) jobs[i] = (struct job){i, CLOCK_AMX};
    printf("clock between tile products, all %d vCPUs: %.2f GHz (mean)\n", ncpu, run_jobs(jobs, ncpu, 1));
    for (int i = 0; i < ncpu; i++) jobs[i] = (struct job){i, i == 0 ? TILES : TILES_BG};
    printf("tile products, vCPU 0 beside all others: %.2f ns\n", run_jobs(jobs, ncpu, 0));

    jobs[0] = (struct job){0, FMA};
    const double f_alone = run_jobs(jobs, 1, 0);
    // three sweeps over j: a neighbour outside this VM that shares a core's tile unit now and
    // then slows vCPU 0 beside different j from sweep to sweep; a sibling inside it, always
    for (int sweep = 0; sweep < 3; sweep++) {
        jobs[0] = (struct job){0, TILES};
        const double t_alone = run_jobs(jobs, 1, 0);
        printf("sweep %d, vCPU 0 alone: tile product %.2f ns, FMA %.3f ns\n", sweep, t_alone, f_alone);
        printf(" j  tile ns beside j (x alone)%s\n", sweep ? "" : "  FMA ns beside j (x alone)");
        for (int j = 1; j < ncpu; j++) {
            jobs[0] = (struct job){0, TILES}; jobs[1] = (struct job){j, TILES_BG};
            const double t = run_jobs(jobs, 2, 0);
            printf("%2d  %6.2f (%.2fx)", j, t, t / t_alone);
            if (sweep == 0) {
                jobs[0] = (struct job){0, FMA}; jobs[1] = (struct job){j, FMA_BG};
                const double f = run_jobs(jobs, 2, 0);
                printf("              %6.3f (%.2fx)", f, f / f_alone);
            }
            printf("\n");
        }
    }
    return 0;
}
