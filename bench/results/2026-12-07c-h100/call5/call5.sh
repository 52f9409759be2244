#!/bin/bash
# Seventy-fifth session, call 5 (about 370 s of device time left): do issue 8's slow shapes
# (timed calls at 24-47 GB/s where the same run's variant sweep of the shape read 66-81) meet a
# KV pool in 4 KiB pages? The host's THP settings, a 1.76 GiB pageable_empty pool's huge-page
# share after its first touch and after MADV_COLLAPSE, then the table with each shape's
# huge-page share (bench.cpu_attention's new pool_huge_page_frac_*). Carry .whl. CALL_S=110.
source bench/results/run-helper.sh
call_begin ${CALL_S:-110}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
( uname -r; for f in enabled defrag khugepaged/pages_to_scan khugepaged/scan_sleep_millisecs khugepaged/defrag; do
    echo "$f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>&1)"; done
  grep -E "MemFree|MemAvailable|AnonHugePages" /proc/meminfo; cat /proc/buddyinfo ) 2>&1 | tee $R/thp.txt
run collapse 30 python - <<'PY'
import ctypes, time, torch
from writescope.hostmem import huge_page_fraction, pageable_empty
t = pageable_empty((int(1.76 * 2**30),), torch.uint8)
t0 = time.perf_counter(); t.fill_(1); print(f"first touch {time.perf_counter() - t0:.2f} s, huge pages {huge_page_fraction(t):.3f}")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
start = t.data_ptr() // 4096 * 4096; n = t.data_ptr() + t.numel() - start
t0 = time.perf_counter(); rc = libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(n), 25)
print(f"MADV_COLLAPSE rc {rc} errno {ctypes.get_errno()} in {time.perf_counter() - t0:.2f} s, huge pages {huge_page_fraction(t):.3f}")
PY
cat $R/collapse.log
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
tail -12 $R/cpu-attn.log
call_end
