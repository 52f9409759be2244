"""The AMX variant of the CPU attention kernel (csrc/attn_amx.cpp) on machines without AMX: the
kernel is built with -DWS_AMX_EMULATE, which replaces the tile instructions by the portable
emulation in csrc/attn_amx_emu.h (test-only; never in the production build), and checked against
the float64 oracle. The rest of the kernel (softmax, transposes, conversions) runs natively, so
the CPU needs AVX-512 BF16; skipped without it or without a compiler."""
from __future__ import annotations

import math
import platform
import shutil

import pytest
import torch

from writescope.attention import cpu
from writescope.attention.batch import BlockBatch
from writescope.kvcache.regions import KVSpec
from test_cpu_attention import check, make_pools, reference, write_valid


def _skip_reason() -> str | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "not x86-64"
    if not (shutil.which("g++") or shutil.which("c++")):
        return "no C++ compiler"
    if not cpu.available():
        return f"CPU kernel unavailable: {cpu.load_error()}"
    if not cpu.features()["avx512_bf16"]:
        return "the emulated AMX kernel still needs AVX-512 BF16 for its vector parts"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture(scope="module")
def emu_lib():
    return cpu.build_test_variant(("-DWS_AMX_EMULATE",))


def swap_in(lib, monkeypatch):
    """cpu.attend_cpu with isa "amx" runs ``lib`` (an emulated-tile build) until the test ends."""
    cpu.available()
    monkeypatch.setattr(cpu, "_lib", lib)
    monkeypatch.setattr(cpu, "_features", cpu._features | cpu._F_AMX)
    monkeypatch.setattr(cpu, "_amx_ok", True)
    cpu.set_isa("amx")


@pytest.fixture
def amx_emulated(emu_lib, monkeypatch):
    """cpu.attend_cpu with isa "amx" runs the emulated library."""
    swap_in(emu_lib, monkeypatch)
    yield
    cpu.set_isa("auto")
    cpu.set_num_threads(None)


def run(spec: KVSpec, hq: int, bs: int, seqs, seed: int, runs=((1, 0), (2, 64))):
    """seqs: (query rows, valid tokens per block); both layouts, the given (threads, chunk)."""
    gen = torch.Generator().manual_seed(seed)
    nblocks = sum(len(b) for _, b in seqs) + 2
    recs, cpool, gpool = make_pools(spec, nblocks, bs, gen)
    perm = torch.randperm(nblocks, generator=gen).tolist()
    qc = [r for r, _ in seqs]
    blocks = [[perm.pop() for _ in bl] for _, bl in seqs]
    lens = [[min(n, bs) for n in bl] for _, bl in seqs]
    write_valid(recs, cpool, gpool, blocks, lens)
    q = torch.randn(sum(qc), hq, spec.k_dim, generator=gen).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(spec.k_dim)
    ref_o, ref_l = reference(q.float(), recs, spec, qc, blocks, lens, scale)
    batch = BlockBatch.build(qc, blocks, lens)
    for threads, chunk in runs:
        cpu.set_num_threads(threads)
        for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
            out, lse = cpu.attend_cpu(q, pool, layout, spec, batch, scale, chunk_blocks=chunk)
            check(out, lse, ref_o, ref_l, 5e-3)


@pytest.mark.parametrize("bs", [16, 32, 64, 128])
def test_mla(amx_emulated, bs):
    """MLA 576/512, 16 heads: M = 16 (decode), 32, 64 (chunked prefill rows), single tokens,
    partial blocks anywhere, passes of several blocks and items longer than one pass.
    (bs 16 in the C layout is not AMX-eligible and takes the generic path.)"""
    spec = KVSpec.mla(1, 512, 64, torch.bfloat16)
    seqs = [(1, [bs] * 5 + [bs // 2 + 1]), (1, [1]), (2, [bs, bs - 1, 3]), (4, [5, bs]),
            (0, [bs]), (2, [])]
    run(spec, 16, bs, seqs, seed=bs)


@pytest.mark.parametrize("defines", [("-DWS_KSB=128",), ("-DWS_KSB=512",), ("-DWS_QK_TM=0",),
                                     ("-DWS_PV_PF=0",), ("-DWS_QK_PF=0",),
                                     ("-DWS_PV_PF=0", "-DWS_QK_PF=0"), ("-DWS_PV_PAR=0",),
                                     ("-DWS_PF_SPREAD=0",)])
def test_mla_with_the_kernels_compile_time_knobs(monkeypatch, defines):
    """The builds ``bench.cpu_phases --defines`` compares: shorter and longer online-softmax
    passes (token slots per pass), the C layout's Q.K in the parity form instead of on
    token-major copies, P.V without its L1 prefetch, the token-major Q.K without its own, neither,
    the GPU layout's P.V on a pair-interleaved copy of V instead of V in place, and the L2
    prefetch kept a block ahead during Q.K instead of spread over each pass (the default)
    compute the same as the oracle."""
    swap_in(cpu.build_test_variant(("-DWS_AMX_EMULATE",) + defines), monkeypatch)
    try:
        spec = KVSpec.mla(1, 512, 64, torch.bfloat16)
        seqs = [(1, [64] * 9 + [33]), (2, [64, 63, 3]), (1, [1]), (1, [64] * 2)]
        run(spec, 16, 64, seqs, seed=7)
        # GQA group 8: the C layout's parity form under the same knobs
        run(KVSpec.gqa(1, 2, 128, torch.bfloat16), 16, 64, [(1, [64] * 6 + [31]), (2, [64, 7])], seed=8)
    finally:
        cpu.set_isa("auto")
        cpu.set_num_threads(None)


@pytest.mark.parametrize("family", ["mla", "gqa"])
def test_the_scale_is_applied_to_fp32_scores_not_folded_into_bf16_queries(amx_emulated, family):
    """bf16 queries and keys: with one token the lse is that token's score, which the tile unit
    computes exactly in fp32. Folding scale * log2(e) into q before rounding it to bf16 (the
    kernel before the sixteenth session) put errors of ~5e-3 into it."""
    spec = KVSpec.mla(1, 512, 64, torch.bfloat16) if family == "mla" else KVSpec.gqa(1, 2, 128, torch.bfloat16)
    hq = 16 if family == "mla" else 8
    gen = torch.Generator().manual_seed(5)
    recs, cpool, gpool = make_pools(spec, 3, 64, gen)
    blocks, lens = [[1], [2]], [[1], [64]]
    write_valid(recs, cpool, gpool, blocks, lens)
    q = torch.randn(2, hq, spec.k_dim, generator=gen).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(spec.k_dim)
    ref_o, ref_l = reference(q.float(), recs, spec, [1, 1], blocks, lens, scale)
    batch = BlockBatch.build([1, 1], blocks, lens)
    for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
        out, lse = cpu.attend_cpu(q, pool, layout, spec, batch, scale)
        assert (lse[0].double() - ref_l[0]).abs().max() < 2e-5  # one token: fp32 rounding only
        check(out, lse, ref_o, ref_l, 5e-3)


def test_mla_few_heads(amx_emulated):
    """8 and 24 query heads on the latent: 16-row chunks with 8 valid rows (one B tile in the
    C layout's parity form)."""
    spec = KVSpec.mla(1, 512, 64, torch.bfloat16)
    for hq in (8, 24):
        run(spec, hq, 64, [(1, [64, 64, 64, 64, 64, 9]), (1, [64, 2])], seed=hq, runs=((1, 0),))


@pytest.mark.parametrize("group", [1, 4, 8])
def test_gqa(amx_emulated, group):
    """GQA head dim 128, group sizes 1/4/8 and 1..8 query rows (M from 1 to 64), empty blocks."""
    spec = KVSpec.gqa(1, 2, 128, torch.bfloat16)
    seqs = [(1, [64] * 6 + [31]), (8, [64, 64, 7]), (3, [1]), (2, [40, 64, 2, 64]),
            (1, [64, 0, 64, 0, 0]), (1, [0, 0])]
    run(spec, 2 * group, 64, seqs, seed=group)


def test_gqa_other_dims_and_blocks(amx_emulated):
    """Head dims 80 (Dk % 32 == 16: the GPU layout's zero-padded tail step; its P.V takes the
    V copy), 64 and 96 (the GPU layout's P.V in place: four 16-value column tiles a sweep, and a
    last sweep of two), block sizes 32 and 96 (the C layout's 32-token groups straddle block
    halves)."""
    for hd, bs in ((80, 32), (64, 96), (96, 32)):
        spec = KVSpec.gqa(1, 2, hd, torch.bfloat16)
        run(spec, 8, bs, [(1, [bs] * 9 + [bs - 3]), (2, [bs, 17])], seed=hd, runs=((1, 0),))


def _tile_read_checksum(lib, threads: int, reps: int, prefetch_bytes: int = 0) -> None:
    import ctypes
    x = torch.ones(64 * 1024 + 24, dtype=torch.float32)  # 256 KB and 96 bytes: 256 tiles
    chk = ctypes.c_double()
    dt = lib.ws_tile_read_seconds(x.data_ptr(), x.numel() * 4 // 1024 * 1024, threads, reps,
                                  prefetch_bytes, ctypes.byref(chk))
    assert dt > 0
    # every tile's first row is 16 floats of 1.0: as bf16 pairs 16 zeros and 16 ones
    assert chk.value == reps * 16 * 256


@pytest.mark.parametrize("threads,prefetch", [(1, 0), (3, 0), (3, 8192)])
def test_tile_read_probe_reads_every_tile(emu_lib, threads, prefetch):
    """The tile-load read probe (ws_tile_read_seconds) consumes every tile it times; threads
    split the tiles unevenly (256 over 3) without losing one, with or without the software
    prefetch ahead (which stops at the end of a thread's range)."""
    _tile_read_checksum(emu_lib, threads, 2, prefetch)


def test_tile_read_probe_on_this_cpus_tile_unit():
    """The same probe on the real tile unit, where the CPU has AMX; the Python wrapper gives a
    rate there and None elsewhere."""
    if "amx" not in cpu.isas():
        assert cpu.tile_read_bandwidth(1 << 20) is None
        pytest.skip("no AMX on this CPU")
    _tile_read_checksum(cpu._load(), 2, 1)
    _tile_read_checksum(cpu._load(), 2, 1, 65536)
    assert cpu.tile_read_bandwidth(1 << 20, threads=1, reps=1) > 0
    assert cpu.tile_read_bandwidth(1 << 20, threads=1, reps=1, prefetch_bytes=4096) > 0
    with pytest.raises(ValueError, match="1 KB"):
        cpu.tile_read_bandwidth(0, buffer=torch.ones(10))


def test_tile_read_bandwidth_is_none_without_amx(monkeypatch):
    monkeypatch.setattr(cpu, "isas", lambda: ["avx2", "avx512"])
    assert cpu.tile_read_bandwidth(1 << 20) is None


@pytest.mark.parametrize("family", ["mla", "gqa"])
def test_shared_reads(amx_emulated, family, monkeypatch):
    """Blocks several sequences list, read once for all their holders (attention/shared_reads.py):
    a shared set's group has the rows of every holder (MLA: 5 rows x 16 heads = 80 query
    vectors), merged into each holder's by the kernel."""
    from test_cpu_shared_reads import BLOCKS, Q_COUNTS, shared_case
    monkeypatch.setenv("WRITESCOPE_CPU_SHARED_READS", "all")  # (MLA reads each listing else)
    if family == "mla":
        spec, hq = KVSpec.mla(1, 512, 64, torch.bfloat16), 16
    else:
        spec, hq = KVSpec.gqa(1, 4, 128, torch.bfloat16), 32
    q, recs, cpool, gpool, lens = shared_case(spec, hq, 64, seed=11)
    q = q.to(torch.bfloat16)
    scale = 1.0 / math.sqrt(spec.k_dim)
    ref_o, ref_l = reference(q.float(), recs, spec, Q_COUNTS, BLOCKS, lens, scale)
    batch = BlockBatch.build(Q_COUNTS, BLOCKS, lens)
    for threads, chunk in ((1, 0), (2, 1)):
        cpu.set_num_threads(threads)
        for layout, pool in [("cpu", cpool), ("gpu", gpool)]:
            plan = cpu.CpuAttentionPlan(pool, layout, spec, batch, scale, q.shape[0], hq, q.dtype,
                                        chunk_blocks=chunk)
            assert plan.shared is not None
            out, lse = plan(q, pool)
            check(out, lse, ref_o, ref_l, 5e-3)
