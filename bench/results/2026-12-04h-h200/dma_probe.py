"""2026-12-04h call 3: H2D copy rates from torch's pinned allocator against cudaHostRegister'ed
huge-page memory (hostmem.pageable_empty + pin_tensor, as the CPU experts' weights are held),
whole 1 GiB copies and one DeepSeek-V2-Lite expert's gate_up (11.5 MB) / down (5.8 MB) at a time."""
import time

import torch

from writescope.hostmem import pageable_empty, pin_tensor

dev = torch.device("cuda")
n = 2**30
src = {"torch-pinned": torch.empty(n, dtype=torch.uint8, pin_memory=True),
       "registered": pageable_empty((n,), torch.uint8)}
assert pin_tensor(src["registered"])
for t in src.values():
    t.fill_(1)
dst = torch.empty(n, dtype=torch.uint8, device=dev)
for name, s in src.items():
    for chunk in (n, 11_534_336, 5_767_168):
        k = n // chunk
        for rep in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for i in range(k):
                dst[i * chunk:(i + 1) * chunk].copy_(s[i * chunk:(i + 1) * chunk], non_blocking=True)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
        print(f"{name:13s} chunk {chunk / 2**20:7.1f} MiB x {k:4d}: {k * chunk / dt / 1e9:6.1f} GB/s",
              flush=True)
