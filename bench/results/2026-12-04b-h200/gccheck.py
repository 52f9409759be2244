"""Does a forward like the engine's activation measurement leave tensors in reference cycles
(freed only when the cyclic collector runs, so the measured peak would depend on its timing)?"""
import gc
import sys

import torch

from writescope.attention.selfattn import causal_self_attention
from writescope.engine.engine import LLMEngine

name, layers, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
eng = LLMEngine(name, random_weights=True, max_num_seqs=2, max_model_len=4096,
                max_num_batched_tokens=n, kv_policy="transfer", device="cpu",
                config_overrides={"num_hidden_layers": layers})
spec, scale = eng.config.kv_spec(eng.dtype), eng.config.softmax_scale


class WarmupContext:
    def attention(self, layer, q, records, dense=None):
        m = q.shape[0]
        if dense is not None and dense(0, m, records):
            return q.new_zeros(m, q.shape[1], spec.v_dim)
        return causal_self_attention(q, records, spec, [m], scale)[0].to(q.dtype)


gc.collect()
gc.disable()
gc.set_debug(gc.DEBUG_SAVEALL)
with torch.no_grad():
    ids = torch.randint(0, eng.config.vocab_size, (n,))
    hidden = eng.model(ids, torch.arange(n), WarmupContext())
    eng.model.compute_logits(hidden[-min(n, 256):])
del hidden
found = gc.collect()
tensors = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
print(name, "cyclic garbage objects", found, "tensors", len(tensors),
      "MB", round(sum(t.numel() * t.element_size() for t in tensors) / 1e6, 1))
for t in tensors[:10]:
    print("  ", tuple(t.shape), t.dtype)
kinds = {}
for o in gc.garbage:
    kinds[type(o).__name__] = kinds.get(type(o).__name__, 0) + 1
print(sorted(kinds.items(), key=lambda kv: -kv[1])[:15])
