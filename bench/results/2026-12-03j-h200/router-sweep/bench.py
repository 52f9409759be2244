"""scratch: correctness and timing of routing.router_fused on CUDA (not part of the repo)."""
import importlib, json, os, sys, itertools
import torch
import torch.nn.functional as F
from writescope.layers import routing
variants = {"unroll": routing}
try:
    variants["loop"] = importlib.import_module("writescope.layers.routing_loop")
except ImportError:
    pass
dev = "cuda"
torch.manual_seed(0)
MODELS = {  # e, k, hid, wdt, renorm, scale, qwen-like weight dtype
    "qwen3": (128, 8, 2048, torch.bfloat16, True, 1.0),
    "deepseek": (64, 6, 2048, torch.float32, False, 1.0),
    "mixtral": (8, 2, 4096, torch.bfloat16, True, 1.0),
}
LAYERS = 160
res = {}
def graph_time(fn, reps=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(5):
        a.record()
        for _ in range(reps):
            g.replay()
        b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps / LAYERS)
    return min(ts)

for name, (e, k, hid, wdt, renorm, scale) in MODELS.items():
    Ws = [(torch.randn(e, hid, device=dev) * 0.02).to(wdt) for _ in range(LAYERS)]
    cs = [torch.zeros(1, dtype=torch.int32, device=dev) for _ in range(LAYERS)]
    for n in (1, 2, 4, 8, 16):
        xs = [torch.randn(n, hid, device=dev).bfloat16() for _ in range(LAYERS)]
        ldt = wdt
        # correctness
        lg = F.linear(xs[0].to(wdt), Ws[0])
        w0, i0 = routing.route_fused(lg, k, renorm, scale=scale)
        w1, i1 = routing.router_fused(xs[0], Ws[0], cs[0], k, renorm, scale=scale, logits_dtype=ldt)
        w2, i2 = routing.router_fused(xs[0], Ws[0], cs[0], k, renorm, scale=scale, logits_dtype=ldt)
        assert cs[0].item() == 0 and torch.equal(w1, w2) and torch.equal(i1, i2)
        r = {"ids_equal": (i0 == i1).float().mean().item(), "w_equal": torch.equal(w0, w1),
             "w_err": (w0 - w1).abs().max().item()}
        def base():
            for x, W in zip(xs, Ws):
                routing.route_fused(F.linear(x.to(wdt), W), k, renorm, scale=scale)
        r["base_us"] = graph_time(base)
        r["default"] = routing.router_blocks(n, hid)
        times = {}
        def fused():
            for x, W, c in zip(xs, Ws, cs):
                routing.router_fused(x, W, c, k, renorm, scale=scale, logits_dtype=ldt)
        times["default"] = round(graph_time(fused), 2)
        r["times"] = dict(sorted(times.items(), key=lambda kv: kv[1]))
        r["default_us"] = times["default"]
        res[f"{name} n={n}"] = r
        best = list(r["times"].items())[:5]
        print(name, n, {k_: v for k_, v in r.items() if k_ != "times"}, best, flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "sweep.json"), "w"), indent=1)
