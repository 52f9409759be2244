// AVX-512 (F/BW/VL/DQ) build of the generic kernel (16 fp32 lanes); fp32 FMAs on bf16 rows
// widened by a shift. Used for fp32 KV and where AMX is absent or not applicable.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include "attn_common.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace {

#include "attn_v512.h"
#include "attn_impl.h"

}  // namespace

void ws_item_avx512(const WsArgs* a, const WsItem* it) { ws_item_dispatch(a, it); }
