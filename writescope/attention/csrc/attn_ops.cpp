// Driver of the CPU decode-attention kernel: CPU feature detection, work split over
// (sequence, kv head, block chunk), OpenMP threads, and the log-sum-exp merge of the chunks.
// Built for the baseline ISA (x86-64); the item kernels it calls are in the ISA units.
// C ABI, called through ctypes from writescope/attention/cpu.py.
#include "attn_common.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define WS_X86 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

#ifdef WS_X86
uint64_t xgetbv0() {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

enum { F_AVX2 = 1, F_AVX512 = 2, F_AVX512BF16 = 4, F_AMX = 8 };

int detect() {
    int f = 0;
#ifdef WS_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const bool osxsave = c & (1u << 27), fma = c & (1u << 12);
    if (!osxsave) return 0;
    const uint64_t xcr0 = xgetbv0();
    const bool ymm_os = (xcr0 & 6) == 6, zmm_os = (xcr0 & 0xE6) == 0xE6, amx_os = (xcr0 & 0x60000) == 0x60000;
    unsigned mx = __get_cpuid_max(0, nullptr);
    if (mx < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30),
               vl = b & (1u << 31), amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    const bool bf16 = a1 & (1u << 5);
    if (avx2 && fma && ymm_os) f |= F_AVX2;
    if ((f & F_AVX2) && avx512f && dq && bw && vl && zmm_os) f |= F_AVX512;
    if ((f & F_AVX512) && bf16) f |= F_AVX512BF16;
    if ((f & F_AVX512BF16) && amx_bf16 && amx_tile && amx_os) f |= F_AMX;
#endif
    return f;
}

struct Item {
    int seq, head, chunk, M;
    int b0, b1;        // block range in kv_blocks
    int64_t qoff;      // offset of this (seq, head)'s packed queries
    int64_t poff;      // offset of this item's partial result
};

}  // namespace

extern "C" {

int ws_cpu_features() { return detect(); }

// Ask Linux for permission to use the AMX tile data (needed once per process).
int ws_amx_request() {
#if defined(WS_X86) && defined(__linux__)
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
#else
    return -1;
#endif
}

int ws_default_threads() {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

// isa: 0 avx2, 1 avx512, 2 amx, 3 avx512bf16. Returns 0, or a negative error code.
int ws_attend(const float* q, int nq, int Hq, const void* kv, int dtype, int layout,
              int64_t block_stride, int H, int bs, int R, int k_off, int Dk, int v_off, int Dv,
              const int32_t* q_indptr, const int32_t* kv_indptr, const int32_t* kv_blocks,
              const int32_t* kv_lens, int nseq, float scale, float* out, float* lse, int isa,
              int threads, int chunk_blocks) {
    if (H <= 0 || Hq % H != 0) return -1;
    const int G = Hq / H;
    ws_item_fn fn = isa == 3 ? ws_item_avx512bf16 : isa == 2 ? ws_item_amx
                  : isa == 1 ? ws_item_avx512 : ws_item_avx2;
    WsArgs args{kv, dtype, layout, block_stride, H, bs, R, k_off, Dk, v_off, Dv};
    if (threads <= 0) threads = ws_default_threads();

    // rows with no blocks: the empty partial (0, -inf)
    for (int64_t i = 0; i < (int64_t)nq * Hq; ++i) lse[i] = -INFINITY;
    memset(out, 0, sizeof(float) * (size_t)nq * Hq * Dv);

    int64_t total = 0;
    for (int s = 0; s < nseq; ++s)
        if (q_indptr[s + 1] > q_indptr[s]) total += (int64_t)(kv_indptr[s + 1] - kv_indptr[s]) * H;
    if (total == 0) return 0;
    int chunk = chunk_blocks;
    if (chunk <= 0) {  // >= 4 items per thread, >= 4 blocks per item
        int64_t c = (total + 4 * (int64_t)threads - 1) / (4 * (int64_t)threads);
        chunk = (int)std::max<int64_t>(4, c);
    }

    std::vector<Item> items;
    std::vector<int> sh_first;  // per (seq, head) group: first item index
    std::vector<int> sh_seq, sh_head, sh_count;
    std::vector<int64_t> sh_qoff;
    int64_t qtot = 0, ptot = 0;
    for (int s = 0; s < nseq; ++s) {
        const int nr = q_indptr[s + 1] - q_indptr[s], k0 = kv_indptr[s], k1 = kv_indptr[s + 1];
        if (nr <= 0 || k1 <= k0) continue;
        const int M = nr * G;
        for (int h = 0; h < H; ++h) {
            sh_first.push_back((int)items.size());
            sh_seq.push_back(s);
            sh_head.push_back(h);
            sh_qoff.push_back(qtot);
            int cnt = 0;
            for (int b = k0; b < k1; b += chunk, ++cnt) {
                items.push_back(Item{s, h, cnt, M, b, std::min(k1, b + chunk), qtot, ptot});
                ptot += (int64_t)M * (Dv + 2);
            }
            sh_count.push_back(cnt);
            qtot += (int64_t)M * Dk;
        }
    }
    std::vector<float> qpack((size_t)qtot), part((size_t)ptot);
    const float qs = scale * 1.4426950408889634f;  // scores in base-2 units
    const int nsh = (int)sh_first.size();

#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int g = 0; g < nsh; ++g) {  // queries of the group, row m = r * G + g
            const int s = sh_seq[g], h = sh_head[g], q0 = q_indptr[s], nr = q_indptr[s + 1] - q0;
            float* dst = qpack.data() + sh_qoff[g];
            for (int r = 0; r < nr; ++r)
                for (int j = 0; j < G; ++j) {
                    const float* src = q + ((int64_t)(q0 + r) * Hq + h * G + j) * Dk;
                    float* d = dst + (int64_t)(r * G + j) * Dk;
                    for (int x = 0; x < Dk; ++x) d[x] = src[x] * qs;
                }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < (int64_t)items.size(); ++i) {
            const Item& w = items[i];
            float* p = part.data() + w.poff;
            WsItem it{qpack.data() + w.qoff, w.M, w.head, kv_blocks + w.b0, kv_lens + w.b0, w.b1 - w.b0,
                      p + 2 * w.M, p, p + w.M};
            fn(&args, &it);
        }
#pragma omp for schedule(static)
        for (int g = 0; g < nsh; ++g) {  // merge the chunks of each (seq, head)
            const int s = sh_seq[g], h = sh_head[g], q0 = q_indptr[s];
            const Item* its = items.data() + sh_first[g];
            const int nc = sh_count[g], M = its[0].M;
            for (int m = 0; m < M; ++m) {
                const int r = m / G, j = m % G;
                float mx = -INFINITY;
                for (int c = 0; c < nc; ++c) {
                    const float* p = part.data() + its[c].poff;
                    if (p[M + m] > 0.0f) mx = std::max(mx, p[m]);
                }
                const int64_t row = (int64_t)(q0 + r) * Hq + h * G + j;
                if (mx == -INFINITY) continue;  // nothing valid: stays (0, -inf)
                float L = 0.0f;
                float* o = out + row * Dv;
                for (int c = 0; c < nc; ++c) {
                    const float* p = part.data() + its[c].poff;
                    const float l = p[M + m];
                    if (!(l > 0.0f)) continue;
                    const float w = exp2f(p[m] - mx);
                    L += l * w;
                    const float* po = p + 2 * M + (int64_t)m * Dv;
                    for (int d = 0; d < Dv; ++d) o[d] += w * po[d];
                }
                const float inv = 1.0f / L;
                for (int d = 0; d < Dv; ++d) o[d] *= inv;
                lse[row] = (mx + log2f(L)) * 0.6931471805599453f;
            }
        }
    }
    return 0;
}

// Seconds to sum `n` floats `reps` times with `threads` threads (DRAM read bandwidth probe).
double ws_read_seconds(const float* x, int64_t n, int threads, int reps, double* checksum) {
    if (threads <= 0) threads = ws_default_threads();
    double best = 1e30, total = 0.0;
    for (int rep = 0; rep < reps; ++rep) {
        double acc = 0.0;
#ifdef _OPENMP
        const double t0 = omp_get_wtime();
#endif
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : acc)
        for (int64_t blk = 0; blk < (n + 4095) / 4096; ++blk) {
            // integer sums vectorise without -ffast-math; the value is only a checksum
            const uint32_t* p = (const uint32_t*)(x + blk * 4096);
            const int64_t m = std::min<int64_t>(4096, n - blk * 4096);
            uint32_t s = 0;
            for (int64_t i = 0; i < m; ++i) s += p[i];
            acc += (double)s;
        }
#ifdef _OPENMP
        const double dt = omp_get_wtime() - t0;
#else
        const double dt = 1.0;
#endif
        best = std::min(best, dt);
        total += acc;
    }
    if (checksum) *checksum = total;
    return best;
}

}  // extern "C"
