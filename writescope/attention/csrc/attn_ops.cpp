// Driver of the CPU decode-attention kernel: CPU feature detection, work split over
// (sequence, kv head, block chunk), OpenMP threads, and the log-sum-exp merge of the chunks.
// Built for the baseline ISA (x86-64); the item kernels it calls are in the ISA units.
// C ABI, called through ctypes from writescope/attention/cpu.py.
//
// Scheduling (ws_attend): one OpenMP parallel region with no worksharing construct inside, so no
// barrier but the region's final join, and no thread owns a fixed share of the work. A call is a
// list of items (one KV head of one sequence over a run of its blocks, >= 8 per thread so the
// tail is short); every team member takes items from one atomic counter until none are left, so
// a member that loses its core delays only the item it holds. A sequence's items come chunk by
// chunk, each chunk's heads together (WS_ITEM_ORDER), so that the members working at once read
// whole blocks of the head-major C layout rather than one head's slice of many blocks.
//   * The queries of a (sequence, head) group are packed (scaled, row-interleaved, widened from
//     bf16 if need be) by the first member that needs them; a member that finds them being
//     packed packs a private copy rather than wait.
//   * Out of items, members take merge units (a few rows of one group) from a second counter,
//     each waiting for its group's last item (an atomic countdown per group), so the merge of a
//     long sequence's chunks is spread over the team instead of being one member's tail.
//   * Blocks several of the call's sequences list (WsShared: prefix caching, one document and
//     many questions) are read once for all of them: a shared set's group packs the queries of
//     all its holders, and each holder's merge takes that group's chunks at its own rows too.
//   * With a ready word and spin_s > 0 (flagged_call) the team starts before the queries land
//     and spins on the word, so that the work starts on awake cores.
//   * The final join still needs every member to have run once. A member out of items goes
//     straight to it (libgomp spins there, then sleeps). Making members sleep earlier, so that a
//     descheduled member could have their core, was measured to be worse: a sleeper then has to
//     get a core back before it can arrive. The team is capped at the usable CPUs.
// The team is the calling thread's OpenMP team, the one torch's parallel ops on that thread use
// too: a pool of the kernel's own threads was tried and competes for the cores with that team's
// spinning workers (libgomp's spin count is fixed once torch has loaded it), and on a 16-core
// host it stalled the same way beside a busy process once its threads filled every core.
// Per-call buffers (item list, partial results, packed queries) belong to the calling thread
// and are reused by its next call.
#include "attn_common.h"

// Items a team member gets at least (their size then follows from the call's blocks): more make
// the tail -- members out of items while the last ones run -- shorter, and add partials to merge.
#ifndef WS_ITEMS_PER_THREAD
#define WS_ITEMS_PER_THREAD 8
#endif
// Item order within a sequence: 1 (default), chunk by chunk, each chunk's heads in a row; 0,
// head by head, each head's chunks in a row (the order until 2026-12-05). On the 2-core AMX
// dev VM GQA 32/4/128 at 1 x 256K reads 1.027-1.04x with 1 (two runs, 13 of 15 rounds faster),
// 8 x 32K level; two 16-core hosts were too noisy to tell (1.035x and 0.95x by paired rounds,
// each round's rate moving 2-3x: bench/results/2026-12-05g-h100, calls 5 and 6). With one KV
// head (MLA) both orders are the same.
#ifndef WS_ITEM_ORDER
#define WS_ITEM_ORDER 1
#endif

#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define WS_X86 1
#endif
#if defined(WS_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef __linux__
#include <sys/prctl.h>
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

// ---------------------------------------------------------------------------------------------
// Work of one call.

struct Item {
    int group, b0, b1;  // block range [b0, b1) in its source's kv_blocks
    int src;            // 0: the call's pool, 1: its second pool (CallArgs::b), 2 and 3: the
                        // first's and the second's blocks that several sequences list (sh, sh2)
    int64_t poff;       // offset of this item's partial result (m[M], l[M], o[M][Dv])
};

// One (sequence, kv head), or one (shared set, kv head): its query vectors and its chunks.
// A shared set's group holds the rows of every holder, in holder order; it has no merge of its
// own: each holder's group merges that group's chunks at the holder's rows with its own.
struct Group {
    int seq, head, M, nchunks;
    int64_t qoff;  // offset of its packed queries
    int64_t poff;  // offset of its first chunk's partial; chunk c at poff + c * M * (Dv + 2)
    int set;       // -1: a sequence's group; k >= 0: shared set k's (seq is then -1) ...
    int pool;      // ... of the first pool's sets (0, CallArgs::sh) or the second's (1, sh2)
    int link0, nlinks;  // a sequence's group: its Links, plan.links[link0 .. link0 + nlinks)
};

struct Link {  // a sequence's rows in a shared set's group (same kv head): rows row0 .. + M
    int group, row0;
};

struct Unit {  // merge work: rows [m0, m1) of one group
    int group, m0, m1;
};

struct Job {
    const void* q;  // [nq][Hq][Dk], float32 or bfloat16
    int q_bf16, Hq, G, Dk, Dv;
    float qs;  // scale * log2(e)
    const int32_t* q_indptr;
    const int32_t* kv_blocks[4];  // per source (Item::src)
    const int32_t* kv_lens[4];
    ws_item_fn fn[4];
    WsArgs args[4];
    const WsShared* sh[2];  // per pool; null: no shared sets
    const Item* items;
    const Group* groups;
    const Link* links;
    const Unit* units;
    std::atomic<int>* pending;  // per group: items not finished
    std::atomic<int>* qstate;   // per group: 0 queries not packed, 1 being packed, 2 packed
    float* qpack;
    float* part;
    float* out;
    float* lse;
};

// Grow-only 64-byte aligned float buffer; released after a call that needed more than kKeep.
struct Buf {
    static constexpr size_t kKeep = (size_t)64 << 20;
    float* p = nullptr;
    size_t cap = 0;  // bytes
    Buf() = default;
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    ~Buf() { free(p); }
    float* get(size_t n) {
        const size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
        if (bytes > cap) {
            free(p);
            p = (float*)aligned_alloc(64, bytes);
            cap = p ? bytes : 0;
        }
        return p;
    }
    void trim() {
        if (cap > kKeep) {
            free(p);
            p = nullptr;
            cap = 0;
        }
    }
};

// A calling thread's plan buffers, reused by its next call (no page faults per call).
struct Plan {
    std::vector<Item> items;
    std::vector<Group> groups;
    std::vector<Link> links;
    std::vector<Unit> units;
    std::vector<unsigned char> covered;
    std::vector<std::atomic<int>> pending, qstate;
    Buf qpack, part;
};

inline void cpu_pause() {
#ifdef WS_X86
    __builtin_ia32_pause();
#endif
}

// ---------------------------------------------------------------------------------------------
// Items.

// Query rows q0 .. q0 + nr of kv head `head`, packed: row m = r * G + j.
void pack_rows(const Job& J, int q0, int nr, int head, float* dst) {
    const int G = J.G, Dk = J.Dk;
    for (int r = 0; r < nr; ++r)
        for (int j = 0; j < G; ++j) {
            const int64_t off = ((int64_t)(q0 + r) * J.Hq + head * G + j) * Dk;
            float* d = dst + (int64_t)(r * G + j) * Dk;
            if (J.q_bf16) {  // bf16 -> fp32 is exact: the high half of the float
                const uint16_t* src = (const uint16_t*)J.q + off;
                for (int x = 0; x < Dk; ++x) {
                    const uint32_t bits = (uint32_t)src[x] << 16;
                    float v;
                    memcpy(&v, &bits, sizeof v);
                    d[x] = v * J.qs;
                }
            } else {
                const float* src = (const float*)J.q + off;
                for (int x = 0; x < Dk; ++x) d[x] = src[x] * J.qs;
            }
        }
}

// A group's queries: its sequence's rows, or a shared set's holders' rows one after another.
void pack_q(const Job& J, const Group& g, float* dst) {
    if (g.set < 0) {
        pack_rows(J, J.q_indptr[g.seq], g.M / J.G, g.head, dst);
        return;
    }
    const WsShared& S = *J.sh[g.pool];
    for (int i = S.set_indptr[g.set]; i < S.set_indptr[g.set + 1]; ++i) {
        const int s = S.set_seqs[i], q0 = J.q_indptr[s], nr = J.q_indptr[s + 1] - q0;
        if (nr <= 0) continue;
        pack_rows(J, q0, nr, g.head, dst);
        dst += (int64_t)nr * J.G * J.Dk;
    }
}

// Calls f(partials, M, row offset, chunks) for the partial results a sequence's group merges:
// its own chunks, then those of each shared set it holds, at its rows there.
template <class F>
void each_partial(const Job& J, const Group& g, F f) {
    f(J.part + g.poff, g.M, 0, g.nchunks);
    for (int k = g.link0; k < g.link0 + g.nlinks; ++k) {
        const Link& L = J.links[k];
        const Group& s = J.groups[L.group];
        f(J.part + s.poff, s.M, L.row0, s.nchunks);
    }
}

// Whether a sequence's group, or a shared set's group it merges, has items still running.
bool group_busy(const Job& J, int gi) {
    if (J.pending[gi].load(std::memory_order_acquire) > 0) return true;
    const Group& g = J.groups[gi];
    for (int k = g.link0; k < g.link0 + g.nlinks; ++k)
        if (J.pending[J.links[k].group].load(std::memory_order_acquire) > 0) return true;
    return false;
}

const float* packed_q(const Job& J, int gi) {
    const Group& g = J.groups[gi];
    float* shared = J.qpack + g.qoff;
    std::atomic<int>& st = J.qstate[gi];
    int s = st.load(std::memory_order_acquire);
    if (s == 2) return shared;
    if (s == 0 && st.compare_exchange_strong(s, 1, std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
        pack_q(J, g, shared);
        st.store(2, std::memory_order_release);
        return shared;
    }
    if (s == 2) return shared;
    // another thread is packing them now: pack a private copy rather than wait for it
    static thread_local Buf mine;
    float* d = mine.get((size_t)g.M * J.Dk);
    if (!d) {  // out of memory: wait for the packer after all
        while (st.load(std::memory_order_acquire) != 2) cpu_pause();
        return shared;
    }
    pack_q(J, g, d);
    return d;
}

// Log-sum-exp merge of a sequence's group's chunks (and of the shared sets' chunks at its
// rows) into out / lse (natural log), rows [m0, m1) of its M; rows without any valid score get
// (0, -inf).
void merge(const Job& J, int gi, int m0, int m1) {
    const Group& g = J.groups[gi];
    const int G = J.G, Dv = J.Dv, q0 = J.q_indptr[g.seq];
    for (int m = m0; m < m1; ++m) {
        const int r = m / G, j = m % G;
        const int64_t row = (int64_t)(q0 + r) * J.Hq + g.head * G + j;
        float* o = J.out + row * Dv;
        memset(o, 0, sizeof(float) * (size_t)Dv);
        float mx = -INFINITY;
        each_partial(J, g, [&](const float* base, int M, int off, int nc) {
            const int64_t stride = (int64_t)M * (Dv + 2);
            for (int c = 0; c < nc; ++c) {
                const float* p = base + c * stride;
                if (p[M + off + m] > 0.0f) mx = std::max(mx, p[off + m]);
            }
        });
        if (mx == -INFINITY) {  // nothing valid: (0, -inf)
            J.lse[row] = -INFINITY;
            continue;
        }
        float L = 0.0f;
        each_partial(J, g, [&](const float* base, int M, int off, int nc) {
            const int64_t stride = (int64_t)M * (Dv + 2);
            for (int c = 0; c < nc; ++c) {
                const float* p = base + c * stride;
                const float l = p[M + off + m];
                if (!(l > 0.0f)) continue;
                const float w = exp2f(p[off + m] - mx);
                L += l * w;
                const float* po = p + 2 * M + (int64_t)(off + m) * Dv;
                for (int d = 0; d < Dv; ++d) o[d] += w * po[d];
            }
        });
        const float inv = 1.0f / L;
        for (int d = 0; d < Dv; ++d) o[d] *= inv;
        J.lse[row] = (mx + log2f(L)) * 0.6931471805599453f;
    }
}

void run_item(const Job& J, int i) {
    const Item& w = J.items[i];
    const Group& g = J.groups[w.group];
    float* p = J.part + w.poff;
    WsItem it{packed_q(J, w.group), g.M, g.head, J.kv_blocks[w.src] + w.b0,
              J.kv_lens[w.src] + w.b0, w.b1 - w.b0, p + 2 * g.M, p, p + g.M};
    J.fn[w.src](&J.args[w.src], &it);
    J.pending[w.group].fetch_sub(1, std::memory_order_acq_rel);
}

// Every member's share of one call: items from the shared counter, then merge units (rows of
// one group) from a second one, each waiting for its group's last item. The merge of a group
// reads all its chunks' partials (MLA: 16 rows x 514 floats x ~50 chunks = 1.6 MB); done by the
// one member that finished the group last, it was a serial tail of ~0.15 ms per call on the
// H200, a third of a 2-sequence split-step call. Spread over the team it is a few microseconds.
void run_share(const Job& J, int nitems, std::atomic<int>& next, int nunits,
               std::atomic<int>& next_unit) {
    for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < nitems;) run_item(J, i);
    for (int u; (u = next_unit.fetch_add(1, std::memory_order_relaxed)) < nunits;) {
        const Unit& x = J.units[u];
        // the group's last items are being computed: spin, then yield the core (on a machine
        // with more runnable threads than cores, the holder of such an item may be waiting
        // for one)
        for (int spins = 0; group_busy(J, x.group); ++spins) {
            if (spins < 4096) cpu_pause();
            else sched_yield();
        }
        merge(J, x.group, x.m0, x.m1);
    }
}

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nap_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, nullptr);
}

// The calling thread's timer slack, from WRITESCOPE_TIMER_SLACK_NS (default 1000 ns; "default":
// leave the kernel's 50 us). Linux lets a sleep run late by its thread's slack, so with the
// default a 20 us nap took 93 us on the dev VM (47 us at 1 us slack): a wait_ready that has gone
// to its naps then starts the layer's CPU work up to ~70 us after its ready word rose. Threads
// take their creator's slack, so the queue's thread sets it before its OpenMP team exists.
void precise_naps() {
#ifdef __linux__
    const char* v = getenv("WRITESCOPE_TIMER_SLACK_NS");
    long ns = 1000;
    if (v && *v) {
        if (!strcmp(v, "default")) return;
        char* end = nullptr;
        ns = strtol(v, &end, 10);
        if (*end || ns <= 0) return;  // the Python side rejects these before a queue starts
    }
    prctl(PR_SET_TIMERSLACK, (unsigned long)ns, 0, 0, 0);
#endif
}

// Wait until *ready >= value: spin (for spin_s, at least 256 pauses), then sleep 20 us at a
// time. Returns 0, -10 after timeout_s, or -11 once *cancel is nonzero.
int wait_ready(const volatile int64_t* ready, int64_t value, double timeout_s,
               const std::atomic<int>* cancel, double spin_s) {
    if (!ready) return 0;
    const double t0 = now_s();
    for (int spins = 0; __atomic_load_n(ready, __ATOMIC_ACQUIRE) < value;) {
        if (++spins < 256 || ((spins & 63) != 0 && spin_s > 0)) { cpu_pause(); continue; }
        const double t = now_s() - t0;
        if (t < spin_s) { cpu_pause(); continue; }
        if (cancel && cancel->load(std::memory_order_relaxed)) return -11;
        if (t > timeout_s) return -10;
        nap_us(20);
    }
    return 0;
}


// A call's second pool (ws_attend_flagged, ws_queue_submit with kv2 set): another region's blocks of the
// same sequences -- C blocks in the CPU layout and T blocks read in place -- attended in the
// same call, its chunks merged with the first pool's by the call's own log-sum-exp merge: one
// team start, tail and join a layer instead of two calls' and a merge job. (On the H200 the two
// forms measured the same: DeepSeek-V2-Lite 4 x 128K, bench/results/2026-12-03f-h200 call 3.)
struct Src2 {
    const void* kv;
    int dtype, layout;
    int64_t block_stride;
    const int32_t *kv_indptr, *kv_blocks, *kv_lens;
    int isa;
};

// The arguments of one ws_attend_ex call (b.kv set: a second pool, same spec and block size).
struct CallArgs {
    const void* q;
    int q_dtype, nq, Hq;
    const void* kv;
    int dtype, layout;
    int64_t block_stride;
    int H, bs, R, k_off, Dk, v_off, Dv;
    const int32_t *q_indptr, *kv_indptr, *kv_blocks, *kv_lens;
    int nseq;
    float scale;
    float* out;
    float* lse;
    int isa, threads, chunk_blocks;
    Src2 b;  // zero: none
    const WsShared* sh = nullptr;  // null (or no sets): no block is read for several sequences
    const WsShared* sh2 = nullptr;  // the same of the second pool
};

ws_item_fn isa_fn(int isa) {
    return isa == 4 ? ws_item_avx512bf16_l2 : isa == 3 ? ws_item_avx512bf16
         : isa == 2 ? ws_item_amx : isa == 1 ? ws_item_avx512 : ws_item_avx2;
}

int default_threads() {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

// Plans a call into the calling thread's Plan (items, groups, merge units) and fills J. Reads
// neither the queries nor the KV, and writes nothing the caller sees: it may run before the
// queries have landed. Returns 0 or a negative error code.
int plan_call(const CallArgs& a, Plan& plan, Job& J, int& nitems, int& nunits, int& team) {
    if (a.q_dtype != 0 && a.q_dtype != 1) return -3;
    if (a.H <= 0 || a.Hq % a.H != 0) return -1;
    const int H = a.H, G = a.Hq / a.H, Dk = a.Dk, Dv = a.Dv;
    const int nsrc = a.b.kv ? 2 : 1;
    const int32_t* indptr[2] = {a.kv_indptr, a.b.kv_indptr};
    // more threads than CPUs only add team members that the final join must wait for
    const int procs = default_threads();
    const int threads = a.threads <= 0 ? procs : std::min(a.threads, procs);

    const WsShared* shs[2] = {a.sh && a.sh->nsets > 0 ? a.sh : nullptr,
                              nsrc == 2 && a.sh2 && a.sh2->nsets > 0 ? a.sh2 : nullptr};
    auto rows_of = [&](int s) { return std::max(0, a.q_indptr[s + 1] - a.q_indptr[s]); };
    int64_t total = 0;  // (block, head) pairs to read
    for (int s = 0; s < a.nseq; ++s)
        if (rows_of(s) > 0)
            for (int x = 0; x < nsrc; ++x) total += (int64_t)(indptr[x][s + 1] - indptr[x][s]) * H;
    for (const WsShared* sh : shs)
        for (int k = 0; sh && k < sh->nsets; ++k)
            total += (int64_t)(sh->kv_indptr[k + 1] - sh->kv_indptr[k]) * H;
    int chunk = a.chunk_blocks;
    if (chunk <= 0) {  // >= WS_ITEMS_PER_THREAD items per thread (a short tail), >= 4 blocks each
        const int64_t per = WS_ITEMS_PER_THREAD * (int64_t)threads;
        chunk = (int)std::max<int64_t>(4, (total + per - 1) / per);
    }
    std::vector<Item>& items = plan.items;
    std::vector<Group>& groups = plan.groups;
    std::vector<Link>& links = plan.links;
    items.clear();
    groups.clear();
    links.clear();
    plan.units.clear();
    plan.covered.assign((size_t)std::max(a.nq, 0), 0);
    int64_t qtot = 0, ptot = 0, rows = 0;
    // The H groups of one sequence or shared set (seq or set -1) of M query vectors each, over
    // block ranges [k0, k1) of sources src; returns the first group's index.
    struct Range { int src, k0, k1; };
    auto add = [&](int seq, int set, int pool, int M, const Range* rg, int nrg) {
        int nc = 0;
        for (int x = 0; x < nrg; ++x) nc += (rg[x].k1 - rg[x].k0 + chunk - 1) / chunk;
        const int64_t stride = (int64_t)M * (Dv + 2);
        const int g0 = (int)groups.size();
        for (int h = 0; h < H; ++h) {
            groups.push_back(Group{seq, h, M, nc, qtot, ptot + h * (int64_t)nc * stride, set,
                                   pool, 0, 0});
            qtot += (int64_t)M * Dk;
        }
#if WS_ITEM_ORDER
        // chunk by chunk, each chunk's heads together: the items taken at once read whole blocks
        int c = 0;
        for (int x = 0; x < nrg; ++x)
            for (int b = rg[x].k0; b < rg[x].k1; b += chunk, ++c)
                for (int h = 0; h < H; ++h)
                    items.push_back(Item{g0 + h, b, std::min(rg[x].k1, b + chunk), rg[x].src,
                                         ptot + (h * (int64_t)nc + c) * stride});
#else
        for (int h = 0; h < H; ++h) {
            int c = 0;
            for (int x = 0; x < nrg; ++x)
                for (int b = rg[x].k0; b < rg[x].k1; b += chunk, ++c)
                    items.push_back(Item{g0 + h, b, std::min(rg[x].k1, b + chunk), rg[x].src,
                                         ptot + (h * (int64_t)nc + c) * stride});
        }
#endif
        ptot += H * (int64_t)nc * stride;
        return g0;
    };
    // shared sets first; each holder's (set's first group, its first row there)
    std::vector<std::array<int, 3>> held;  // {holder, set's first group, row0}
    for (int pool = 0; pool < 2; ++pool) {
        const WsShared* sh = shs[pool];
        for (int k = 0; sh && k < sh->nsets; ++k) {
            const int k0 = sh->kv_indptr[k], k1 = sh->kv_indptr[k + 1];
            int M = 0;
            for (int i = sh->set_indptr[k]; i < sh->set_indptr[k + 1]; ++i)
                M += rows_of(sh->set_seqs[i]) * G;
            if (M <= 0 || k1 <= k0) continue;
            const Range rg{2 + pool, k0, k1};
            const int g0 = add(-1, k, pool, M, &rg, 1);
            for (int i = sh->set_indptr[k], row0 = 0; i < sh->set_indptr[k + 1]; ++i) {
                const int s = sh->set_seqs[i], m = rows_of(s) * G;
                if (m > 0) held.push_back({s, g0, row0});
                row0 += m;
            }
        }
    }
    std::sort(held.begin(), held.end());
    size_t hx = 0;
    for (int s = 0; s < a.nseq; ++s) {
        const int q0 = a.q_indptr[s], nr = rows_of(s);
        while (hx < held.size() && held[hx][0] < s) ++hx;  // (guard: holders are visited in order)
        const size_t l0 = hx;
        while (hx < held.size() && held[hx][0] == s) ++hx;
        const int nl = (int)(hx - l0);
        Range rg[2];
        int nblocks = 0;
        for (int x = 0; x < nsrc; ++x) {
            rg[x] = Range{x, indptr[x][s], indptr[x][s + 1]};
            nblocks += rg[x].k1 - rg[x].k0;
        }
        if (nr <= 0 || (nblocks <= 0 && nl == 0)) continue;
        for (int r = std::max(q0, 0); r < std::min(q0 + nr, a.nq); ++r) plan.covered[r] = 1;
        const int M = nr * G;
        const int g0 = add(s, -1, 0, M, rg, nsrc);
        for (int h = 0; h < H; ++h) {
            Group& g = groups[g0 + h];
            g.link0 = (int)links.size();
            g.nlinks = nl;
            for (size_t i = l0; i < l0 + nl; ++i) links.push_back(Link{held[i][1] + h, held[i][2]});
            rows += M;
        }
    }
    nitems = (int)items.size();
    team = std::max(1, std::min(threads, nitems));
    // merge units: ~2 per member, never across groups
    const int per_unit = (int)std::max<int64_t>(1, (rows + 2 * team - 1) / (2 * team));
    for (int gi = 0; gi < (int)groups.size(); ++gi)
        for (int m = 0; groups[gi].set < 0 && m < groups[gi].M; m += per_unit)
            plan.units.push_back(Unit{gi, m, std::min(groups[gi].M, m + per_unit)});
    nunits = (int)plan.units.size();
    const int ngroups = (int)groups.size();
    if (plan.pending.size() < (size_t)ngroups) {
        plan.pending = std::vector<std::atomic<int>>((size_t)ngroups);
        plan.qstate = std::vector<std::atomic<int>>((size_t)ngroups);
    }
    for (int g = 0; g < ngroups; ++g) {
        plan.pending[g].store(groups[g].nchunks, std::memory_order_relaxed);
        plan.qstate[g].store(0, std::memory_order_relaxed);
    }
    float* qpack = plan.qpack.get((size_t)std::max<int64_t>(qtot, 1));
    float* part = plan.part.get((size_t)std::max<int64_t>(ptot, 1));
    if (!qpack || !part) return -2;
    const float qs = a.scale * 1.4426950408889634f;  // base-2 scores
    const WsArgs first{a.kv, a.dtype, a.layout, a.block_stride, H, a.bs, a.R, a.k_off, Dk,
                       a.v_off, Dv, qs};
    const WsArgs second{a.b.kv, a.b.dtype, a.b.layout, a.b.block_stride, H, a.bs, a.R, a.k_off,
                        Dk, a.v_off, Dv, qs};
    J = Job{a.q, a.q_dtype, a.Hq, G, Dk, Dv, qs, a.q_indptr,
            {a.kv_blocks, a.b.kv_blocks, shs[0] ? shs[0]->kv_blocks : nullptr,
             shs[1] ? shs[1]->kv_blocks : nullptr},
            {a.kv_lens, a.b.kv_lens, shs[0] ? shs[0]->kv_lens : nullptr,
             shs[1] ? shs[1]->kv_lens : nullptr},
            {isa_fn(a.isa), isa_fn(a.b.isa), isa_fn(a.isa), isa_fn(a.b.isa)},
            {first, second, first, second},
            {shs[0], shs[1]}, items.data(), groups.data(), links.data(), plan.units.data(), plan.pending.data(),
            plan.qstate.data(), qpack, part, a.out, a.lse};
    return 0;
}

// Rows no group writes: the empty partial (0, -inf).
void fill_uncovered(const CallArgs& a, const Plan& plan) {
    for (int r = 0; r < a.nq; ++r) {
        if (plan.covered[r]) continue;
        for (int j = 0; j < a.Hq; ++j) a.lse[(int64_t)r * a.Hq + j] = -INFINITY;
        memset(a.out + (int64_t)r * a.Hq * a.Dv, 0, sizeof(float) * (size_t)a.Hq * a.Dv);
    }
}

// The CPU's cores run one job queue's call at a time (ws_set_team_lock; on by default): a queued
// call takes this lock once its inputs are ready and holds it for its kernel only. Each queue's
// calls run in their own thread's team, so without it a step split into two sub-batches with
// routed experts on the CPU would run one sub-batch's attention team and the other's experts
// team at once, 2 x 15 threads on 16 cores (Qwen3-30B-A3B 4 x 128K on an H200 host: the
// experts took 209-215 ms a step so, 157 with the lock; bench/results/2026-12-07f-h200). A
// holder never waits for the device (its ready word was seen before it locked), so a call
// waiting for its inputs cannot hold up one whose inputs have landed. Uncontended -- one batch
// a step, whose attention and experts alternate -- it costs a lock and an unlock a call.
std::mutex g_team_mu;
std::atomic<int> g_team_lock{1};

std::mutex* team_lock() {
    return g_team_lock.load(std::memory_order_relaxed) ? &g_team_mu : nullptr;
}

// Plans and runs one call between the flag words (see ws_attend_flagged); `cancel` (optional)
// makes a wait give up (-11). times: {seconds waiting for ready (and for `cores`), seconds
// after it}; span: the kernel's own {start, end}. cores (optional): the team lock, taken once
// the ready word is seen, given back before done is stored.
//
// spin_s > 0 (with a ready word) starts the team *before* the wait: every member spins on it
// for up to spin_s (then sleeps 20 us at a time), so the work starts on awake cores the moment
// the queries land. Measured on the H200's Xeon (cpu_contention, MLA 2 x 13K,
// bench/results/2026-11-30e-h200): a plain call made 3 ms after the last one, by a thread that
// slept meanwhile, costs 0.75 ms against 0.52 ms 0.5 ms after; a flagged call whose master
// polls the word in 20 us naps (spin_s = 0) already runs 0.43 ms, and spinning gave 0.46 ms (14
// threads) -- no gain alone, and with all 16 cores in the team a 4-5 ms p90 (a spinning member
// displaced by the thread raising the word). Spinning keeps every core of the team busy while
// it waits, so the engine turns it off when CPU experts share those cores.
int flagged_call(const CallArgs& a, const volatile int64_t* ready, int64_t ready_value,
                 int64_t* done, int64_t done_value, double timeout_s, double spin_s,
                 const std::atomic<int>* cancel, double* times, std::mutex* cores = nullptr,
                 double* span = nullptr) {
    static thread_local Plan plan;
    const double t0 = now_s();
    double t1 = t0;
    Job J;
    int nitems = 0, nunits = 0, team = 1;
    int rc = plan_call(a, plan, J, nitems, nunits, team);
    const bool early = rc == 0 && ready && spin_s > 0 && nitems > 0;
    bool locked = false;  // `cores` held (by this thread: the parallel region's master is it)
    if (rc == 0 && !early) {
        rc = wait_ready(ready, ready_value, timeout_s, cancel, 0.0);
        if (rc == 0 && cores) { cores->lock(); locked = true; }
        t1 = now_s();  // (the wait for the cores counts as waiting, not as the kernel's)
        if (rc == 0) {
            fill_uncovered(a, plan);
            std::atomic<int> next{0}, next_unit{0};
            if (nitems > 0) {
#pragma omp parallel num_threads(team)
                run_share(J, nitems, next, nunits, next_unit);
            }
        }
    } else if (early) {
        std::atomic<int> state{0};  // 0: waiting for ready, 1: go, < 0: the wait failed
        std::atomic<int> next{0}, next_unit{0};
#pragma omp parallel num_threads(team)
        {
#ifdef _OPENMP
            const bool master = omp_get_thread_num() == 0;
#else
            const bool master = true;
#endif
            if (master) {
                const int w = wait_ready(ready, ready_value, timeout_s, cancel, spin_s);
                if (w == 0 && cores) { cores->lock(); locked = true; }
                t1 = now_s();
                state.store(w == 0 ? 1 : w, std::memory_order_release);
            } else {
                const double s0 = now_s();
                for (int spins = 0; state.load(std::memory_order_acquire) == 0;) {
                    if ((++spins & 63) != 0 || now_s() - s0 < spin_s) cpu_pause();
                    else nap_us(20);
                }
            }
            if (state.load(std::memory_order_acquire) == 1) {
                if (master) fill_uncovered(a, plan);
                run_share(J, nitems, next, nunits, next_unit);
            }
        }
        rc = state.load() == 1 ? 0 : state.load();
    }
    if (rc == 0 || rc == -10 || rc == -11) {
        plan.qpack.trim();
        plan.part.trim();
    }
    const double t2 = now_s();
    if (locked) cores->unlock();
    if (done) __atomic_store_n(done, done_value, __ATOMIC_RELEASE);
    if (times) {
        times[0] = t1 - t0;
        times[1] = t2 - t1;
    }
    if (span) {  // the kernel's own interval, inside the cores' lock where taken
        span[0] = t1;
        span[1] = t2;
    }
    return rc;
}

// A native function another library hands the queue (CPU routed experts: ws_moe_job); 0 or an
// error code. Its argument block stays the submitter's until the drain that covers the call.
typedef int (*JobFn)(void* arg);

struct QueuedCall {
    CallArgs a;
    const volatile int64_t* ready;
    int64_t ready_value;
    int64_t* done;
    int64_t done_value;
    double timeout_s, spin_s;
    JobFn fn = nullptr;  // set: run fn(arg) between the flags instead of the attention kernel
    void* arg = nullptr;
    // set: the job stores 0 into *ready once it has seen ready_value there, before it runs (a
    // call a CUDA graph replays again while the last replay may still be on the device: the
    // next replay raises the same word, so the job that saw it takes it back down)
    bool consume_ready = false;
};

// One finished call's figures, kept until the drain that covers it (calls finish in order).
struct CallRecord {
    double wait_s, kernel_s;
    int rc;
};

struct WsQueue {
    std::mutex mu;
    std::condition_variable cv, idle;
    std::deque<QueuedCall> jobs;
    std::thread th;
    std::atomic<int> stop{0};
    int64_t submitted = 0, completed = 0;  // under mu
    int64_t drained = 0;                    // calls a drain has covered, under mu
    std::deque<CallRecord> records;         // calls drained .. completed, under mu
    // per call since the last ws_queue_times: {popped, kernel starts (ready seen and the cores
    // taken), kernel ends (done is stored right after)} on CLOCK_MONOTONIC (Python's
    // time.perf_counter on Linux), at most kMaxTimes calls
    std::vector<double> times;
};
constexpr size_t kMaxTimes = 1 << 14;

// Append a call (-11 once the queue is stopping) and wake the worker.
int queue_push(WsQueue* Q, const QueuedCall& c) {
    {
        std::lock_guard<std::mutex> lk(Q->mu);
        if (Q->stop.load()) return -11;
        Q->jobs.push_back(c);
        ++Q->submitted;
    }
    Q->cv.notify_one();
    return 0;
}

void queue_main(WsQueue* Q) {
    precise_naps();
    for (;;) {
        QueuedCall c;
        {
            std::unique_lock<std::mutex> lk(Q->mu);
            Q->cv.wait(lk, [&] { return !Q->jobs.empty() || Q->stop.load(); });
            if (Q->jobs.empty()) return;  // stopped, nothing left
            c = Q->jobs.front();
            Q->jobs.pop_front();
        }
        double t[2] = {0.0, 0.0};
        const double popped = now_s();
        double span[2] = {popped, popped};  // the kernel's start and end
        int rc;
        if (Q->stop.load()) {  // not run: the device must not wait for it
            rc = -11;
            if (c.done) __atomic_store_n(c.done, c.done_value, __ATOMIC_RELEASE);
        } else if (c.fn) {
            const double t0 = now_s();
            rc = wait_ready(c.ready, c.ready_value, c.timeout_s, &Q->stop, c.spin_s);
            if (rc == 0 && c.consume_ready && c.ready)
                __atomic_store_n((int64_t*)c.ready, (int64_t)0, __ATOMIC_RELAXED);
            std::mutex* cores = rc == 0 ? team_lock() : nullptr;
            if (cores) cores->lock();
            const double t1 = now_s();
            if (rc == 0) rc = c.fn(c.arg);
            const double t2 = now_s();
            if (cores) cores->unlock();
            if (c.done) __atomic_store_n(c.done, c.done_value, __ATOMIC_RELEASE);
            t[0] = t1 - t0;
            t[1] = t2 - t1;
            span[0] = t1;
            span[1] = t2;
        } else {
            rc = flagged_call(c.a, c.ready, c.ready_value, c.done, c.done_value, c.timeout_s,
                              c.spin_s, &Q->stop, t, team_lock(), span);
        }
        {
            std::lock_guard<std::mutex> lk(Q->mu);
            ++Q->completed;
            Q->records.push_back(CallRecord{t[0], t[1], rc});
            if (Q->times.size() < 3 * kMaxTimes)
                Q->times.insert(Q->times.end(), {popped, span[0], span[1]});
        }
        Q->idle.notify_all();
    }
}

}  // namespace

// Best of `reps` timings of one parallel region of `threads` threads, each running
// part(thread, team size) and returning a checksum (summed over threads and reps).
template <class Part>
static double best_parallel_seconds(int threads, int reps, double* checksum, Part part) {
    if (threads <= 0) threads = default_threads();
    double best = 1e30, total = 0.0;
    for (int rep = 0; rep < reps; ++rep) {
        double acc = 0.0;
#ifdef _OPENMP
        const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : acc)
        acc += part(omp_get_thread_num(), omp_get_num_threads());
        const double dt = omp_get_wtime() - t0;
#else
        acc += part(0, 1);
        const double dt = 1.0;
#endif
        best = std::min(best, dt);
        total += acc;
    }
    if (checksum) *checksum = total;
    return best;
}

static int g_prefetch_blocks = 2;  // cpu.py sets it at load (its default, or the env var)
int ws_prefetch_blocks(void) { return g_prefetch_blocks; }

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

int ws_default_threads() { return default_threads(); }

void ws_set_prefetch_blocks(int n) { g_prefetch_blocks = n < 0 ? 0 : n > 64 ? 64 : n; }

// Whether the job queues' calls take the CPU's one-team-at-a-time lock (see g_team_mu); cpu.py
// sets it at load (WRITESCOPE_CPU_TEAM_LOCK, default on). Returns the setting before.
int ws_set_team_lock(int on) { return g_team_lock.exchange(on ? 1 : 0); }

// ws_attend_ex between two flag words, all without the caller's interpreter lock (ctypes drops it
// for the whole call): wait until *ready >= ready_value (the device stream raises it once this
// layer's queries have landed in host memory), attend, then store done_value into *done with
// release order (the device stream waits on it before merging the result). Between the kernel
// and the store there is no Python, so a launching thread that holds the GIL cannot delay the
// device's wait. spin_s > 0 starts the team before the wait (see flagged_call). Gives up after
// timeout_s (returns -10, and still stores done_value, so the device never waits for nothing).
// *times (if given) receives {seconds waiting for ready, seconds in the kernel}.
// kv2 (not null): a second pool of the same sequences (see Src2), whose blocks for sequence s
// are kv_blocks2[kv_indptr2[s] .. kv_indptr2[s+1]) (its own layout, block stride and ISA; the
// spec and block size are the first pool's): one result, as if the blocks were one pool's.
// sh, sh2 (not null): blocks of the first pool, and of the second, that several sequences list,
// read once for all of them (see WsShared); the sequences' own lists leave them out.
int ws_attend_flagged(const volatile int64_t* ready, int64_t ready_value, int64_t* done,
                      int64_t done_value, double timeout_s, double spin_s, double* times,
                      const void* q, int q_dtype, int nq, int Hq, const void* kv, int dtype,
                      int layout, int64_t block_stride, int H, int bs, int R, int k_off, int Dk,
                      int v_off, int Dv, const int32_t* q_indptr, const int32_t* kv_indptr,
                      const int32_t* kv_blocks, const int32_t* kv_lens, int nseq, float scale,
                      float* out, float* lse, int isa, int threads, int chunk_blocks,
                      const void* kv2, int dtype2, int layout2, int64_t block_stride2,
                      const int32_t* kv_indptr2, const int32_t* kv_blocks2,
                      const int32_t* kv_lens2, int isa2, const WsShared* sh,
                      const WsShared* sh2) {
    const CallArgs a{q, q_dtype, nq, Hq, kv, dtype, layout, block_stride, H, bs, R, k_off, Dk,
                     v_off, Dv, q_indptr, kv_indptr, kv_blocks, kv_lens, nseq, scale, out, lse,
                     isa, threads, chunk_blocks,
                     Src2{kv2, dtype2, layout2, block_stride2, kv_indptr2, kv_blocks2, kv_lens2, isa2},
                     sh, sh2};
    return flagged_call(a, ready, ready_value, done, done_value, timeout_s, spin_s, nullptr, times);
}

// ws_attend with the queries in float32 (q_dtype 0) or bfloat16 (q_dtype 1), contiguous
// [nq][Hq][Dk]. bf16 queries are widened while they are packed, so the caller needs no
// conversion op of its own (a torch op there is a parallel region of torch's whole team, with
// the same all-threads-at-once exposure this kernel avoids).
// isa: 0 avx2, 1 avx512, 2 amx, 3 avx512bf16, 4 avx512bf16-l2. Returns 0, or a negative error code.
int ws_attend_ex(const void* q, int q_dtype, int nq, int Hq, const void* kv, int dtype,
                 int layout, int64_t block_stride, int H, int bs, int R, int k_off, int Dk,
                 int v_off, int Dv, const int32_t* q_indptr, const int32_t* kv_indptr,
                 const int32_t* kv_blocks, const int32_t* kv_lens, int nseq, float scale,
                 float* out, float* lse, int isa, int threads, int chunk_blocks) {
    return ws_attend_flagged(nullptr, 0, nullptr, 0, 0.0, 0.0, nullptr, q, q_dtype, nq, Hq, kv,
                             dtype, layout, block_stride, H, bs, R, k_off, Dk, v_off, Dv,
                             q_indptr, kv_indptr, kv_blocks, kv_lens, nseq, scale, out, lse, isa,
                             threads, chunk_blocks, nullptr, 0, 0, 0, nullptr, nullptr, nullptr, 0,
                             nullptr, nullptr);
}

// float32 queries. isa: 0 avx2, 1 avx512, 2 amx, 3 avx512bf16, 4 avx512bf16-l2. Returns 0, or a
// negative error.
int ws_attend(const float* q, int nq, int Hq, const void* kv, int dtype, int layout,
              int64_t block_stride, int H, int bs, int R, int k_off, int Dk, int v_off, int Dv,
              const int32_t* q_indptr, const int32_t* kv_indptr, const int32_t* kv_blocks,
              const int32_t* kv_lens, int nseq, float scale, float* out, float* lse, int isa,
              int threads, int chunk_blocks) {
    return ws_attend_ex(q, 0, nq, Hq, kv, dtype, layout, block_stride, H, bs, R, k_off, Dk, v_off,
                        Dv, q_indptr, kv_indptr, kv_blocks, kv_lens, nseq, scale, out, lse, isa,
                        threads, chunk_blocks);
}

// A native job queue: one thread of its own runs the submitted calls in order, each as
// ws_attend_flagged. Submitting is a few microseconds under a mutex; between two calls the
// worker needs no interpreter lock (a Python worker needs it, and a launching thread holding it
// delays the next call by up to the interpreter's switch interval, 5 ms by default).
void* ws_queue_new() {
    WsQueue* Q = new WsQueue();
    Q->th = std::thread(queue_main, Q);
    return Q;
}

// Queue a call with ws_attend_flagged's arguments (kv2 null: one pool; sh, sh2: as there, kept
// alive by the submitter until the drain that covers the call).
int ws_queue_submit(void* queue, const volatile int64_t* ready, int64_t ready_value,
                    int64_t* done, int64_t done_value, double timeout_s, double spin_s,
                    const void* q, int q_dtype, int nq, int Hq, const void* kv, int dtype,
                    int layout, int64_t block_stride, int H, int bs, int R, int k_off, int Dk,
                    int v_off, int Dv, const int32_t* q_indptr, const int32_t* kv_indptr,
                    const int32_t* kv_blocks, const int32_t* kv_lens, int nseq, float scale,
                    float* out, float* lse, int isa, int threads, int chunk_blocks,
                    const void* kv2, int dtype2, int layout2, int64_t block_stride2,
                    const int32_t* kv_indptr2, const int32_t* kv_blocks2,
                    const int32_t* kv_lens2, int isa2, const WsShared* sh,
                    const WsShared* sh2) {
    WsQueue* Q = (WsQueue*)queue;
    QueuedCall c{CallArgs{q, q_dtype, nq, Hq, kv, dtype, layout, block_stride, H, bs, R, k_off,
                          Dk, v_off, Dv, q_indptr, kv_indptr, kv_blocks, kv_lens, nseq, scale,
                          out, lse, isa, threads, chunk_blocks,
                          Src2{kv2, dtype2, layout2, block_stride2, kv_indptr2, kv_blocks2,
                               kv_lens2, isa2},
                          sh, sh2},
                 ready, ready_value, done, done_value, timeout_s, spin_s};
    return queue_push(Q, c);
}

// Queue fn(arg) (see JobFn) between the same two flags as an attention call: wait until
// *ready >= ready_value (spinning for spin_s before the 20 us naps), run it, store done_value
// into *done (also when it fails or is not run).
// consume_ready: store 0 into *ready once it is seen (see QueuedCall).
int ws_queue_submit_fn_ex(void* queue, const volatile int64_t* ready, int64_t ready_value,
                          int64_t* done, int64_t done_value, double timeout_s, double spin_s,
                          void* fn, void* arg, int consume_ready) {
    WsQueue* Q = (WsQueue*)queue;
    if (!fn) return -2;
    QueuedCall c{};
    c.ready = ready;
    c.ready_value = ready_value;
    c.done = done;
    c.done_value = done_value;
    c.timeout_s = timeout_s;
    c.spin_s = spin_s;
    c.fn = (JobFn)fn;
    c.arg = arg;
    c.consume_ready = consume_ready != 0;
    return queue_push(Q, c);
}

int ws_queue_submit_fn(void* queue, const volatile int64_t* ready, int64_t ready_value,
                       int64_t* done, int64_t done_value, double timeout_s, double spin_s,
                       void* fn, void* arg) {
    return ws_queue_submit_fn_ex(queue, ready, ready_value, done, done_value, timeout_s, spin_s,
                                 fn, arg, 0);
}

// Merge a second partial result (o2, l2) into (o, l) in place, by log-sum-exp (the merge
// module's convention: natural log, an empty subset is (0, -inf)); `rows` (query, head) pairs of
// `dv` values. A job for ws_queue_submit_fn: a layer whose CPU side attends two regions (C blocks
// in the CPU layout, T blocks read in place) runs two kernel calls and this, then raises its
// flag, so the device still reads one partial from the CPU.
struct WsMergeJob {
    float* o;
    float* l;
    const float* o2;
    const float* l2;
    int64_t rows;
    int32_t dv;
};

int ws_merge_job(void* arg) {
    const WsMergeJob& m = *(const WsMergeJob*)arg;
    if (m.rows < 0 || m.dv <= 0) return -2;
    for (int64_t r = 0; r < m.rows; ++r) {
        const float a = m.l[r], b = m.l2[r];
        float* o = m.o + r * m.dv;
        const float* o2 = m.o2 + r * m.dv;
        if (b == -INFINITY) continue;  // the second is empty: the identity
        if (a == -INFINITY) {
            memcpy(o, o2, sizeof(float) * (size_t)m.dv);
            m.l[r] = b;
            continue;
        }
        const float mx = a > b ? a : b;
        const float wa = expf(a - mx), wb = expf(b - mx), sum = wa + wb;
        const float ca = wa / sum, cb = wb / sum;
        for (int d = 0; d < m.dv; ++d) o[d] = ca * o[d] + cb * o2[d];
        m.l[r] = mx + logf(sum);
    }
    return 0;
}

// Wait until the first `mark` calls ever submitted have finished (or timeout_s: returns -12; a
// mark past the calls submitted: all of them). stats (if given) receives {calls, seconds
// waiting for ready, seconds in the kernel} of the calls finished since the last drain up to
// the mark. Returns the first nonzero return code of those calls, else 0. Calls after the mark
// (a CUDA graph's next replay, queued while this one ran) are left for a later drain.
int ws_queue_drain_to(void* queue, int64_t mark, double timeout_s, double* stats) {
    WsQueue* Q = (WsQueue*)queue;
    std::unique_lock<std::mutex> lk(Q->mu);
    if (mark < 0 || mark > Q->submitted) mark = Q->submitted;
    const bool ok = Q->idle.wait_for(lk, std::chrono::duration<double>(timeout_s),
                                     [&] { return Q->completed >= mark; });
    if (!ok) {
        if (stats) stats[0] = stats[1] = stats[2] = 0.0;
        return -12;
    }
    double n = 0.0, w = 0.0, k = 0.0;
    int rc = 0;
    for (; Q->drained < mark; ++Q->drained) {
        const CallRecord r = Q->records.front();
        Q->records.pop_front();
        n += 1.0;
        w += r.wait_s;
        k += r.kernel_s;
        if (r.rc != 0 && rc == 0) rc = r.rc;
    }
    if (stats) {
        stats[0] = n;
        stats[1] = w;
        stats[2] = k;
    }
    return rc;
}

// Wait until every submitted call has finished: ws_queue_drain_to all of them.
int ws_queue_drain(void* queue, double timeout_s, double* stats) {
    return ws_queue_drain_to(queue, -1, timeout_s, stats);
}

// The calls' host times since the last call of this (oldest first, at most kMaxTimes): up to
// `max` triples {popped from the queue, the kernel starts, it ends (done is stored)} in
// seconds on CLOCK_MONOTONIC into out. Returns the number of triples written; the rest are
// dropped.
int ws_queue_times(void* queue, double* out, int max) {
    WsQueue* Q = (WsQueue*)queue;
    std::lock_guard<std::mutex> lk(Q->mu);
    const int n = (int)std::min<size_t>(Q->times.size() / 3, max < 0 ? 0 : (size_t)max);
    std::copy(Q->times.begin(), Q->times.begin() + 3 * n, out);
    Q->times.clear();
    return n;
}

// Stop the worker: calls not started yet are not run (their done words are still stored, and
// they count as failed, -11), a call waiting for its ready word gives up; then join and free.
void ws_queue_free(void* queue) {
    WsQueue* Q = (WsQueue*)queue;
    {
        std::lock_guard<std::mutex> lk(Q->mu);
        Q->stop.store(1);
    }
    Q->cv.notify_all();
    Q->th.join();
    delete Q;
}

// Seconds to sum `n` floats `reps` times with `threads` threads (DRAM read bandwidth probe).
// `prefetch_bytes` > 0: each 16 KB block's lines are first prefetched into L2 (PREFETCHT1) that
// far ahead in the thread's range; 0 (the probe's definition): the hardware prefetchers alone.
double ws_read_seconds(const float* x, int64_t n, int threads, int reps, int64_t prefetch_bytes,
                       double* checksum) {
    const int64_t nblk = (n + 4095) / 4096, ahead = prefetch_bytes > 0 ? (prefetch_bytes + 16383) / 16384 : 0;
    return best_parallel_seconds(threads, reps, checksum, [&](int id, int nt) {
        double acc = 0.0;
        const int64_t b1 = nblk * (id + 1) / nt;
        for (int64_t blk = nblk * id / nt; blk < b1; ++blk) {
            if (ahead && blk + ahead < b1)  // locality 2: PREFETCHT1 on x86
                for (int l = 0; l < 256; ++l) __builtin_prefetch((const char*)(x + (blk + ahead) * 4096) + 64 * l, 0, 2);
            // integer sums vectorise without -ffast-math; the value is only a checksum
            const uint32_t* p = (const uint32_t*)(x + blk * 4096);
            const int64_t m = std::min<int64_t>(4096, n - blk * 4096);
            uint32_t s = 0;
            for (int64_t i = 0; i < m; ++i) s += p[i];
            acc += (double)s;
        }
        return acc;
    });
}

// Seconds to stream `nbytes` (whole 1 KB tiles) through the AMX tile unit `reps` times with
// `threads` threads (ws_tile_stream), `prefetch_bytes` of software prefetch ahead (0: none):
// the ceiling of a kernel that reads its KV with tile loads, beside ws_read_seconds of the same
// buffer. On the 2-core development VM one core streams ~16 GB/s this way against ~19 GB/s of
// vector loads. The checksum is the sum of every tile's first row (bf16 values). AMX only.
double ws_tile_read_seconds(const void* x, int64_t nbytes, int threads, int reps,
                            int64_t prefetch_bytes, double* checksum) {
    const int64_t ntiles = nbytes / 1024, ahead = prefetch_bytes > 0 ? (prefetch_bytes + 1023) / 1024 : 0;
    return best_parallel_seconds(threads, reps, checksum, [&](int id, int nt) {
        return ws_tile_stream(x, ntiles * id / nt, ntiles * (id + 1) / nt, ahead);
    });
}

}  // extern "C"
