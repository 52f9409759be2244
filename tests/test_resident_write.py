"""The resident step's write of the new records into their W slots in one launch
(``attention/resident.write_rows``) against ``index_select`` + ``index_copy_``: under Triton's
CPU interpreter and on CUDA."""
from __future__ import annotations

import pytest
import torch
from triton_interp import run_interpreted

CASES = r"""
import torch
from writescope.attention.resident import write_rows
torch.manual_seed(0)
dev = DEVICE
# (heads, record size): Qwen3/Mixtral GQA records, DeepSeek's MLA latent, a small odd one
for h, r in ((4, 256), (8, 256), (1, 576), (3, 40)):
    for rdt, wdt in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
                     (torch.float32, torch.float32)):
        rows, n = 8, 5  # a step of 5 tokens padded to 8 rows
        rec = torch.randn(rows, h, r).to(dev, rdt)
        rec[n:] = rec[n - 1]  # padded rows repeat the last real token's values
        slots = torch.randperm(40)[:n].to(dev)
        src = torch.cat((torch.randperm(n), torch.full((rows - n,), n - 1))).to(dev)
        dst = torch.empty(rows, dtype=torch.long, device=dev)
        dst[:n] = slots[src[:n]]
        dst[n:] = dst[(src[:n] == n - 1).nonzero()[0, 0]]
        want = torch.randn(40, h, r).to(dev, wdt)
        got = want.clone()
        want.index_copy_(0, dst, rec.to(wdt).index_select(0, src))
        write_rows(rec, src, dst, got)
        if rdt != wdt and dev == "cpu":  # the interpreter's cast truncates: within one unit
            assert torch.allclose(got.float(), want.float(), rtol=2.0 ** -7, atol=0), (h, r)
        else:
            assert torch.equal(got, want), (h, r, rdt, wdt)
out = torch.zeros(4, 2, 8, device=dev)
write_rows(torch.zeros(0, 2, 8, device=dev), torch.zeros(0, dtype=torch.long, device=dev),
           torch.zeros(0, dtype=torch.long, device=dev), out)
try:
    write_rows(torch.zeros(2, 2, 4, device=dev), torch.zeros(2, dtype=torch.long, device=dev),
               torch.zeros(2, dtype=torch.long, device=dev), out)
    raise SystemExit("records of another size were written")
except ValueError:
    pass
print("ok")
"""


def test_write_rows_under_the_interpreter():
    pytest.importorskip("triton")
    r = run_interpreted(CASES.replace("DEVICE", '"cpu"'))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_write_rows_on_cuda():
    exec(CASES.replace("DEVICE", '"cuda"'), {})
