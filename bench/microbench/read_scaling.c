// How many cache lines can one core keep in flight from DRAM, and does the read bandwidth of the
// whole machine scale with the cores reading?
// 1. Latency: a pointer chase over a random cyclic permutation of the lines of a 1 GiB array
//    (one load at a time), alone and beside T-1 threads that stream.
// 2. Read bandwidth with 1, 2, 4, 8, ... threads (each sums its own slice of a 4 GiB array with
//    64-byte vector loads): plain loads (the hardware prefetchers alone) and with PREFETCHT0 /
//    PREFETCHT1 a distance ahead. Per thread GB/s x latency / 64 B is the number of lines that
//    thread kept in flight: a core whose L1 miss buffers (16 on Golden Cove / Raptor Cove) bound
//    it holds about 16, and then the machine's read grows with every core added.
// Build and run (x86-64 with AVX-512, Linux): gcc -O2 -pthread -mavx512f read_scaling.c -o rs && ./rs
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }

static void* big(size_t n) {
    void* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    madvise(p, n, MADV_HUGEPAGE);
    return p;
}

#define CHASE (1L << 30)
#define ARR (4L << 30)
static uint64_t* chase;  // line i holds the index of the next line
static char* arr;

static double chase_ns(double seconds) {
    uint64_t i = 0; long n = 0;
    double t0 = now(), t;
    do {
        for (int k = 0; k < 10000; k++) i = chase[i * 8];
        n += 10000;
    } while ((t = now()) - t0 < seconds);
    if (i == 0xFFFFFFFFFFFFFFFFull) puts("");
    return (t - t0) / n * 1e9;
}

enum { PLAIN, PF_T0, PF_T1 };
struct job { int cpu, mode, dist; size_t off, len; volatile int* stop; pthread_barrier_t* bar; double gbps; };

static double stream(const char* p, size_t len, int mode, int dist, volatile int* stop, double seconds) {
    __m512i acc = _mm512_setzero_si512();
    size_t bytes = 0;
    double t0 = now(), t;
    do {
        for (size_t o = 0; o < len; o += 256) {
            if (mode == PF_T0) { _mm_prefetch(p + o + dist, _MM_HINT_T0); _mm_prefetch(p + o + dist + 64, _MM_HINT_T0);
                                 _mm_prefetch(p + o + dist + 128, _MM_HINT_T0); _mm_prefetch(p + o + dist + 192, _MM_HINT_T0); }
            if (mode == PF_T1) { _mm_prefetch(p + o + dist, _MM_HINT_T1); _mm_prefetch(p + o + dist + 64, _MM_HINT_T1);
                                 _mm_prefetch(p + o + dist + 128, _MM_HINT_T1); _mm_prefetch(p + o + dist + 192, _MM_HINT_T1); }
            acc = _mm512_add_epi64(acc, _mm512_load_si512(p + o));
            acc = _mm512_add_epi64(acc, _mm512_load_si512(p + o + 64));
            acc = _mm512_add_epi64(acc, _mm512_load_si512(p + o + 128));
            acc = _mm512_add_epi64(acc, _mm512_load_si512(p + o + 192));
            if ((o & ((1 << 20) - 1)) == 0 && stop && *stop) break;
        }
        bytes += len;
    } while (!(stop && *stop) && (t = now()) - t0 < seconds);
    t = now();
    volatile long long sink = _mm512_reduce_add_epi64(acc); (void)sink;
    return bytes / (t - t0) / 1e9;
}

static void* worker(void* v) {
    struct job* j = v;
    pin(j->cpu);
    pthread_barrier_wait(j->bar);
    if (j->mode < 0) { j->gbps = chase_ns(1.0); return NULL; }  // the chase beside the others
    j->gbps = stream(arr + j->off, j->len, j->mode, j->dist, j->stop, j->stop ? 1e9 : 1.0);
    return NULL;
}

// nthr threads stream (thread 0 also streams unless `chase_first`); returns thread 0's figure,
// and the sum over the streaming threads in *total
static double run(int nthr, int mode, int dist, int chase_first, double* total) {
    struct job jobs[128]; pthread_t th[128];
    pthread_barrier_t bar; pthread_barrier_init(&bar, NULL, nthr);
    volatile int stop = 0;
    const size_t slice = (ARR / nthr) & ~((size_t)(1 << 21) - 1);
    for (int i = 0; i < nthr; i++) {
        jobs[i] = (struct job){i, mode, dist, slice * i, slice, NULL, &bar, 0};
        if (chase_first && i == 0) jobs[i].mode = -1;
        else if (chase_first) jobs[i].stop = &stop;
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    pthread_join(th[0], NULL);
    stop = 1;
    for (int i = 1; i < nthr; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    double s = 0;
    for (int i = chase_first ? 1 : 0; i < nthr; i++) s += jobs[i].gbps;
    if (total) *total = s;
    return jobs[0].gbps;
}

int main(void) {
    const int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    chase = big(CHASE); arr = big(ARR);
    memset(arr, 1, ARR);
    const long lines = CHASE / 64;
    uint64_t* perm = malloc(sizeof(uint64_t) * lines);
    for (long i = 0; i < lines; i++) perm[i] = i;
    srand(1);
    for (long i = lines - 1; i > 0; i--) { long j = ((long)rand() * RAND_MAX + rand()) % (i + 1); uint64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (long i = 0; i < lines; i++) chase[perm[i] * 8] = perm[(i + 1) % lines];
    free(perm);
    pin(0);
    const double lat = chase_ns(1.0);
    printf("latency alone: %.0f ns\n", lat);
    for (int n = 2; n <= ncpu; n *= 2) {
        double tot;
        const double l = run(n, PLAIN, 0, 1, &tot);
        printf("latency beside %2d streaming threads (%.1f GB/s): %.0f ns\n", n - 1, tot, l);
    }
    const struct { int mode, dist; const char* name; } modes[] = {
        {PLAIN, 0, "plain loads"}, {PF_T0, 1024, "PREFETCHT0 +1 KB"}, {PF_T0, 4096, "PREFETCHT0 +4 KB"},
        {PF_T1, 4096, "PREFETCHT1 +4 KB"}, {PF_T1, 16384, "PREFETCHT1 +16 KB"}};
    printf("%-18s thr  GB/s total  per thread  lines in flight (x %.0f ns)\n", "read", lat);
    for (unsigned m = 0; m < sizeof modes / sizeof modes[0]; m++)
        for (int n = 1; n <= ncpu; n = n < ncpu && 2 * n > ncpu ? ncpu : 2 * n) {
            double tot;
            run(n, modes[m].mode, modes[m].dist, 0, &tot);
            printf("%-18s %3d  %10.1f  %10.2f  %6.1f\n", modes[m].name, n, tot, tot / n, tot / n * lat / 64.0);
        }
    return 0;
}
