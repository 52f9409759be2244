"""Block-wise FP8 routed experts on the CPU (``CpuExperts(fp8=...)``): the kernel's FP8 -> bf16
conversion value by value on every code path, and whole expert calls against a float64 oracle
over the weights the checkpoint dequantized at load would hold (bf16(q * scale)) or, for the
exact-products decode kernel (``fp8_exact``, the default), over q * scale itself."""
from __future__ import annotations

import ctypes

import pytest
import torch
from hypothesis import given, settings, strategies as st

from test_cpu_experts import _routing, bf16_tie_slack, ref64
from writescope.layers import cpu_experts as ce
from writescope.layers.cpu_experts import CpuExperts
from writescope.layers.expert_upload import ExpertUploader
from writescope.models.quantization import Fp8Blocks

ISAS = ce.available_isas()
pytestmark = pytest.mark.skipif(not ISAS, reason="FP8 experts need the compiled kernel")
FP8 = torch.float8_e4m3fn


def _all_codes() -> torch.Tensor:
    """Every finite float8_e4m3fn byte (0x7f and 0xff are NaN), zeros and subnormals included."""
    return torch.tensor([b for b in range(256) if b & 0x7f != 0x7f], dtype=torch.uint8)


@pytest.mark.parametrize("isa", ISAS)
def test_tile_conversion_is_bf16_of_q_times_scale(isa):
    """One packed tile of every code times scales of several magnitudes, K blocks of 32 (the
    last one partial: its padding takes the last scale), against torch's float32 product
    rounded to bf16."""
    lib = ce.get_lib()
    codes = _all_codes()
    kp, bk = 96, 32                          # 3 K blocks of 32 values
    nb = 3
    g = torch.Generator().manual_seed(0)
    q = codes[torch.randint(0, len(codes), (16, kp), generator=g)]
    q.view(-1)[:len(codes)] = codes  # each code at least once
    scales = torch.tensor([3.0e-3, 1.7, 2.0 ** -20], dtype=torch.float32)
    packed = q.view(16, kp // 2, 2).permute(1, 0, 2).contiguous()  # [Kp/2][16][2]
    out = torch.empty(kp // 2, 16, 2, dtype=torch.bfloat16)
    rc = lib.ws_fp8_tile_to_bf16(packed.data_ptr(), kp, scales.data_ptr(), bk, nb,
                                 out.data_ptr(), ce.ISA_NAMES.index(isa))
    assert rc == 0
    got = out.permute(1, 0, 2).reshape(16, kp)
    want = (q.view(FP8).float() * scales.repeat_interleave(bk)[None, :]).to(torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def _fp8_weights(E, H, I, block, seed=0, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    sch = Fp8Blocks(block)
    mats = (torch.randn(E, I, H, generator=g) * scale, torch.randn(E, I, H, generator=g) * scale,
            torch.randn(E, H, I, generator=g) * scale)
    return sch, [[sch.quantize(m[e]) for e in range(E)] for m in mats]


def _dequantized(sch, pairs):
    """The bf16 weights of a checkpoint dequantized at load: [E, O, K] per matrix."""
    return [torch.stack([sch.dequantize(q, s).to(torch.bfloat16) for q, s in m]) for m in pairs]


def _exact(sch, pairs):
    """q * scale in float64 (no rounding at all): [E, O, K] per matrix."""
    return [torch.stack([q.double() * sch.expand_scale(s, tuple(q.shape)).double()
                         for q, s in m]) for m in pairs]


def _decode_isas():
    """The instruction sets whose decode calls take the exact products: AVX-512 BF16 and AMX
    (bf16 of q * 2^-120, per-block sums times the scale), AVX2 and AVX-512F (fp32(q * s), one
    FMA a token)."""
    return [i for i in ISAS if ce.ISA_NAMES.index(i) >= ce.ISA_NAMES.index("avx2")]


# padding in both dims (80, 100: not multiples of 32; 100 rows: a partial row block), blocks
# smaller than the matrices (several scales a tile row) and larger (one scale), one token and
# register blocks of many tokens
CASES = [(8, 80, 100, 2, 1, (16, 32)), (8, 80, 100, 2, 37, (32, 16)),
         (4, 64, 96, 4, 40, (128, 128)), (6, 256, 128, 2, 5, (128, 128))]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("E,H,I,k,N,block", CASES)
def test_fp8_experts_match_float64_over_dequantized_weights(monkeypatch, isa, E, H, I, k, N,
                                                           block):
    """The converted tiles' products (``fp8_exact`` off; with it on, the calls of more than 16
    tokens an expert and every AMX call take them too)."""
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_ISA", isa)
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_AMX_MIN", "1")
    sch, pairs = _fp8_weights(E, H, I, block)
    layer = CpuExperts.from_fp8(*pairs, fp8=sch)
    layer.fp8_exact = False
    assert layer.gate_up.dtype == torch.uint8 and layer.fp8 == sch
    gate, up, down = _dequantized(sch, pairs)
    ids, w = _routing(N, E, k)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = layer.forward(x, ids, w, out_dtype=torch.float32)
    assert torch.equal(layer.wait(layer.submit(x, ids, w, out_dtype=torch.float32)), y)
    ref = ref64(x, ids, w, gate, up, down, round_h_to=torch.bfloat16)
    scale = ref.abs().max().item()
    # the kernel computes in fp32 from bf16 weights and activations: only sums' order and the h
    # rounding's ties differ from the oracle
    torch.testing.assert_close(y.double(), ref, rtol=8e-3, atol=4e-3 * scale)
    # and it equals the bf16 kernel over the dequantized weights (same tiles, same sums)
    plain = CpuExperts.from_weights(gate, up, down, dtype=torch.bfloat16)
    torch.testing.assert_close(y, plain.forward(x, ids, w, out_dtype=torch.float32),
                               rtol=0, atol=0)


@pytest.mark.parametrize("isa", _decode_isas() or ["none"])
@pytest.mark.parametrize("E,H,I,k,N,block", [c for c in CASES if c[3] * c[4] <= 16 * c[0]]
                         + [(3, 96, 64, 3, 16, (16, 32))])  # (16 tokens: two passes of 8)
def test_exact_fp8_products_match_float64_over_q_times_scale(monkeypatch, isa, E, H, I, k, N,
                                                             block):
    """Decode calls (at most 16 tokens an expert, no AMX) on the codes as they are: every product
    q * x is exact in fp32, so the only differences from float64 over q * scale are fp32 sums
    (and a bf16 rounding tie of h now and then) -- far inside the 2^-9 that rounding each weight
    to bf16 costs, which the converted tiles' products (previous test) show."""
    if isa == "none":
        pytest.skip("no AVX2 here")
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_ISA", isa)
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_AMX_MIN", "1000")
    sch, pairs = _fp8_weights(E, H, I, block)
    layer = CpuExperts.from_fp8(*pairs, fp8=sch)
    assert layer.fp8_exact
    ids, w = _routing(N, E, k)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = layer.forward(x, ids, w, out_dtype=torch.float32)
    assert torch.equal(layer.wait(layer.submit(x, ids, w, out_dtype=torch.float32)), y)
    ref = ref64(x, ids, w, *_exact(sch, pairs), round_h_to=torch.bfloat16)
    scale = ref.abs().max().item()
    torch.testing.assert_close(y.double(), ref, rtol=2e-5, atol=2e-5 * scale)
    rounded = ref64(x, ids, w, *_dequantized(sch, pairs), round_h_to=torch.bfloat16)
    assert (rounded - ref).abs().max().item() > 20 * (y.double() - ref).abs().max().item()


@pytest.mark.parametrize("isa", _decode_isas() or ["none"])
def test_exact_fp8_products_with_subnormal_codes_and_extreme_activations(monkeypatch, isa):
    """Codes drawn from every finite e4m3 value (1 in 8 a subnormal: the lines that hold one take
    the kernel's second product), scales of several magnitudes and activation rows from 2^-40
    to 2^30 (h = silu(g) * u from ~2^-80 to 2^100; each row scaled to just under 2^127 and back), against float64 over q * scale."""
    if isa == "none":
        pytest.skip("no AVX2 here")
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_ISA", isa)
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_AMX_MIN", "1000")
    E, H, I, block = 3, 160, 96, (32, 32)
    sch = Fp8Blocks(block)
    g = torch.Generator().manual_seed(5)
    codes = _all_codes()

    def mat(o, i):
        q = codes[torch.randint(0, len(codes), (o, i), generator=g)].view(FP8)
        sc = 2.0 ** torch.randint(-12, 1, sch.scale_shape((o, i)), generator=g).float()
        return q, sc * (1 + torch.rand(sc.shape, generator=g))

    pairs = [[mat(I, H) for _ in range(E)], [mat(I, H) for _ in range(E)],
             [mat(H, I) for _ in range(E)]]
    layer = CpuExperts.from_fp8(*pairs, fp8=sch)
    # every line flagged holds a subnormal code, and some lines are flagged
    flagged = int(layer._mark_subnormal_lines(0, E))
    assert flagged > 0
    N, k = 6, 2
    ids, w = _routing(N, E, k)
    x = torch.randn(N, H, generator=g)
    x *= (2.0 ** torch.tensor([-40.0, -15.0, 0.0, 5.0, 15.0, 30.0]))[:, None]
    x = x.to(torch.bfloat16)
    y = layer.forward(x, ids, w, out_dtype=torch.float32)
    ref = ref64(x, ids, w, *_exact(sch, pairs), round_h_to=torch.bfloat16)
    for t in range(N):  # each row against its own magnitude
        sc = ref[t].abs().max().item()
        assert sc > 0
        torch.testing.assert_close(y[t].double(), ref[t], rtol=2e-5, atol=2e-5 * sc)


def test_line_masks_flag_the_lines_with_subnormal_codes():
    """ws_fp8_line_masks against a torch reading of the same bytes: a line (32 bytes of a tile)
    is flagged when a byte has exponent field 0 and a mantissa that is not (zeros are not)."""
    lib = ce.get_lib()
    g = torch.Generator().manual_seed(3)
    ntiles, kp = 5, 200  # 100 lines a tile: two mask words, the second partial
    b = torch.randint(0, 256, (ntiles, kp // 2, 32), generator=g, dtype=torch.int64)
    b[b.bitwise_and(0x78) == 0] |= 0x08  # no subnormals nor zeros ...
    b[0, 3, 7] = 0x05                    # ... but these: subnormals
    b[1, 99, 31] = 0x81
    b[2, 64, 0] = 0x00                   # and zeros, which are not flagged
    b[2, 65, 5] = 0x80
    b[3, 10:80:7, 9] = 0x87
    b = b.to(torch.uint8).contiguous()
    out = torch.full((ntiles, 2), -1, dtype=torch.int64)
    n = lib.ws_fp8_line_masks(b.data_ptr(), ntiles, kp, out.data_ptr(), 2)
    sub = ((b.long() & 0x78) == 0) & ((b.long() & 0x07) != 0)
    lines = sub.any(-1)                            # [tiles, lines]
    assert n == int(lines.sum()) == 2 + len(range(10, 80, 7))
    want = torch.zeros(ntiles, 2, dtype=torch.int64)
    for t, l in lines.nonzero().tolist():
        want[t, l // 64] |= 1 << (l % 64) if l % 64 < 63 else -(1 << 63)
    assert torch.equal(out, want)
    assert lib.ws_fp8_line_masks(b.data_ptr(), 1, 3, out.data_ptr(), 1) == -2


def test_layout_bytes_and_unpacking():
    E, H, I = 4, 80, 100
    sch, pairs = _fp8_weights(E, H, I, (16, 32))
    layer = CpuExperts.from_fp8(*pairs, fp8=sch)
    gate, up, down = _dequantized(sch, pairs)
    for e in range(E):
        g, u, d = layer.expert_weights(e)
        assert torch.equal(g, gate[e]) and torch.equal(u, up[e]) and torch.equal(d, down[e])
    assert layer.expert_bytes == 3 * H * I + 4 * (2 * 7 * 3 + 5 * 4)
    bf = CpuExperts.from_weights(gate, up, down, dtype=torch.bfloat16)
    assert layer.nbytes < 0.52 * bf.nbytes + 4096
    assert "fp8 (e4m3, 16x32 blocks)" in repr(layer)


def test_quantizing_float_weights_and_random_fp8_experts():
    """``from_weights``/``random`` with ``fp8``: float weights are quantized block by block
    (amax -> 448); seeded random FP8 experts have one scale and the draw's spread."""
    E, H, I = 3, 64, 48
    sch = Fp8Blocks((16, 32))
    g = torch.Generator().manual_seed(3)
    mats = [torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g),
            torch.randn(E, H, I, generator=g)]
    fp8 = CpuExperts(E, H, I, torch.bfloat16, fp8=sch)
    for e in range(E):
        fp8._set_expert(e, mats[0][e], mats[1][e], mats[2][e])
        for j, got in enumerate(fp8.expert_weights(e)):
            want = sch.dequantize(*sch.quantize(mats[j][e])).to(torch.bfloat16)
            assert torch.equal(got, want)
            assert (got.float() - mats[j][e]).abs().max() <= mats[j][e].abs().max() / 16
    r = CpuExperts.random(4, 256, 128, seed=1, fp8=Fp8Blocks())
    assert torch.all(r.gate_up_scale == r.gate_up_scale.view(-1)[0])
    w = torch.cat([t.float().view(-1) for t in r.expert_weights(1)])
    assert abs(w.std().item() - 0.02) < 0.002 and w.abs().max() <= 3.47 * 0.02 * 1.07
    r2 = CpuExperts.random(4, 256, 128, seed=1, fp8=Fp8Blocks(), unique_experts=2)
    assert torch.equal(r2.expert_weights(3)[2], r2.expert_weights(1)[2])


def test_uploader_dequantizes_fp8_experts_on_the_device_path(monkeypatch):
    E, H, I = 6, 64, 48
    sch, pairs = _fp8_weights(E, H, I, (16, 16))
    layer = CpuExperts.from_fp8(*pairs, fp8=sch)
    gate, up, down = _dequantized(sch, pairs)
    upl = ExpertUploader("cpu", min_tokens=4)
    upl.register(layer)
    x = torch.randn(9, H).to(torch.bfloat16)
    ids, w = _routing(9, E, 2)
    got = upl.forward(layer, x, ids, w)
    ref = ref64(x, ids, w, gate, up, down, round_h_to=torch.bfloat16)
    assert (got.double() - ref).norm() / ref.norm() < 1e-2
    assert upl.bytes == layer.gate_up.numel() + layer.down.numel()
    scales = (layer.gate_up_scale, layer.down_scale)
    gu, dn = layer.unpack_experts(layer.gate_up, layer.down, 2, 5, scales)
    for j in range(3):  # a range as its experts one by one: bf16(q * scale)
        one = layer.unpack_expert(layer.gate_up, layer.down, 2 + j, scales)
        assert torch.equal(gu[j], one[0]) and torch.equal(dn[j], one[1])
        assert torch.equal(one[0], torch.cat([gate[2 + j], up[2 + j]]).to(torch.bfloat16))
    from writescope.layers import moe
    monkeypatch.setattr(moe, "GROUP_WEIGHTS", 2 * 3 * H * I)  # ranges of two experts
    assert torch.equal(upl.forward(layer, x, ids, w), got)


def test_bad_fp8_inputs():
    sch = Fp8Blocks((16, 32))
    with pytest.raises(ValueError, match="bfloat16"):
        CpuExperts(2, 64, 32, torch.float32, fp8=sch)
    with pytest.raises(ValueError, match="multiple of 16"):
        CpuExperts(2, 64, 32, torch.bfloat16, fp8=Fp8Blocks((8, 32)))
    with pytest.raises(ValueError, match="torch"):
        CpuExperts(2, 64, 32, torch.bfloat16, backend="torch", fp8=sch)
    assert CpuExperts.fp8_unsupported(sch, torch.float32) is not None
    assert CpuExperts.fp8_unsupported(sch, torch.bfloat16) is None
    layer = CpuExperts(2, 64, 32, torch.bfloat16, fp8=sch)
    q, s = sch.quantize(torch.randn(32, 64))
    with pytest.raises(ValueError, match="scale of shape"):
        layer._set_expert_fp8(0, (q, s[:1]), (q, s), sch.quantize(torch.randn(64, 32)))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        layer._set_expert_fp8(0, (q.float(), s), (q, s), sch.quantize(torch.randn(64, 32)))
    with pytest.raises(IndexError, match="out of range"):
        layer.forward(torch.randn(1, 64), torch.tensor([[0, 2]]), torch.ones(1, 2))


@settings(max_examples=12, deadline=None)
@given(E=st.integers(1, 5), H=st.integers(1, 3).map(lambda m: 32 * m + 16),
       I=st.integers(1, 4).map(lambda m: 16 * m), k=st.integers(1, 3), N=st.integers(1, 20),
       seed=st.integers(0, 2**16), exact=st.booleans())
def test_random_shapes(E, H, I, k, N, seed, exact):
    """Either product form against float64 over its own weights: bf16(q * scale) for the
    rounded one, q * scale for the exact one (fewer tokens than AMX takes, so every expert's
    call is a decode call where the CPU has AVX2; the generic code's converted tiles
    otherwise)."""
    k = min(k, E)
    if exact:
        N = min(N, ce.AMX_MIN_TOKENS - 1)
    sch, pairs = _fp8_weights(E, H, I, (16, 16), seed=seed)
    layer = CpuExperts.from_fp8(*pairs, fp8=sch)
    layer.fp8_exact = exact
    decode = exact and min(ce.detected_isa(), ce.isa_cap()) >= ce.ISA_NAMES.index("avx2")
    gate, up, down = _exact(sch, pairs) if decode else _dequantized(sch, pairs)
    ids, w = _routing(N, E, k, seed=seed + 1)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    y = layer.forward(x, ids, w, out_dtype=torch.float32)
    ref = ref64(x, ids, w, gate, up, down, round_h_to=torch.bfloat16)
    tol = 1e-3 if decode else 8e-3
    # an h within float32's error of a bf16 midpoint may round either way (seed 5802 of
    # E=2, H=I=48, N=4: h = -2.78906263, 1.3e-8 past -2.7890625): allowed that one ulp
    slack = bf16_tie_slack(x, ids, w, gate, up, down)
    err = (y.double() - ref).abs()
    bound = tol / 2 * ref.abs().max().item() + tol * ref.abs() + slack
    assert (err <= bound).all(), (err - bound).max().item()


def test_conversion_entry_point_refuses_bad_arguments():
    lib = ce.get_lib()
    buf = (ctypes.c_uint8 * 64)()
    sc = (ctypes.c_float * 1)(1.0)
    dst = (ctypes.c_uint16 * 64)()
    assert lib.ws_fp8_tile_to_bf16(ctypes.addressof(buf), 3, ctypes.addressof(sc), 2, 1,
                                   ctypes.addressof(dst), 0) == -2
    assert lib.ws_fp8_tile_to_bf16(ctypes.addressof(buf), 2, ctypes.addressof(sc), 0, 1,
                                   ctypes.addressof(dst), 0) == -2


def test_bench_times_both_fp8_product_forms(tmp_path):
    """``bench.cpu_experts --weights fp8 fp8-rounded``: the two forms on the same seeded experts,
    each row checked against float32 over q * scale before it is timed; the exact products err
    less (the rounded ones add each weight's bf16 rounding)."""
    import json

    from writescope.bench import cpu_experts as bench
    isa = ISAS[-1]
    out = tmp_path / "r.json"
    assert bench.main(["--models", "deepseek-v2-lite", "--tokens", "1", "--backends", "cpp",
                       "--weights", "fp8", "fp8-rounded", "--isas", isa, "--footprint-gb", "0.01",
                       "--min-layers", "1", "--routings", "1", "--min-seconds", "0.01",
                       "--dram-gib", "0.0625", "--json", str(out)]) == 0
    rows = {r["weights"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"fp8", "fp8-rounded"}
    assert rows["fp8"]["variant"].endswith("-fp8") and rows["fp8-rounded"]["variant"].endswith("-fp8r")
    assert all(r["correct"] for r in rows.values())
    if isa != "generic":  # (the generic code has only the converted tiles: the same numbers)
        assert rows["fp8"]["rel_err_vs_fp32_torch"] < rows["fp8-rounded"]["rel_err_vs_fp32_torch"]
