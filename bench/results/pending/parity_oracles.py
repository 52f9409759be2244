"""Device diagnostic (fiftieth session): the step-29 top-5 gap of tiny_mixtral on CUDA -- the
engine on CUDA and on the CPU against transformers in float32 with its default grouped_mm experts,
in float32 with eager experts and in float64. Usage: python parity_oracles.py TESTS_DIR"""
import sys, tempfile
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[1])
from conftest import build_tiny_checkpoint
import test_parity as tp
import writescope
from transformers import AutoModelForCausalLM
print("writescope from", writescope.__file__, "torch threads", torch.get_num_threads())
root = Path(tempfile.mkdtemp())
p = build_tiny_checkpoint("mixtral", root / "mixtral", seed=1, tokenizer_dir=None)


def refrows(threads, dtype, experts, device="cpu"):
    torch.set_num_threads(threads)
    kw = {} if experts is None else {"experts_implementation": experts}
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, attn_implementation="eager",
                                                 **kw).eval().to(device)
    print("hf", device, threads, dtype, {k: v for k, v in vars(model.config).items() if "impl" in k})
    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        g = model.generate(x, max_new_tokens=tp.NEW, do_sample=False, output_scores=True,
                           return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    toks = g.sequences[0, x.shape[1]:].tolist()
    return toks, [torch.log_softmax(s[0].double().cpu(), -1) for s in g.scores]


def report(name, out, toks, rows):
    worst = []
    for step, (top, row) in enumerate(zip(out.top_logprobs, rows)):
        want = torch.topk(row, 5).values.tolist()
        worst.append((round(max(abs(a - b) for a, b in zip(top.values(), want)), 7), step))
    worst.sort(reverse=True)
    print(name, "tokens equal", out.token_ids == toks, "worst", worst[:3])


ids = None
outs = {}
for dev, pl in (("cuda", "all-G"), ("cuda", "all-C"), ("cpu", "all-G")):
    if dev == "cuda" and not torch.cuda.is_available():
        continue
    llm = tp.engine(p, device=dev, **tp.PLACEMENTS[pl])
    ids = ids or tp.prompt_ids(llm.engine.config.vocab_size)
    (outs[dev, pl],) = llm.generate([ids], tp.GREEDY)
    print("engine", dev, pl, "step29", [(t, round(v, 6)) for t, v in outs[dev, pl].top_logprobs[29].items()])
    del llm
refs = {"cpu16-f32-default": refrows(16, torch.float32, None),
        "cpu1-f32-default": refrows(1, torch.float32, None),
        "cpu16-f32-eager": refrows(16, torch.float32, "eager"),
        "cpu16-f64-eager": refrows(16, torch.float64, "eager")}
if torch.cuda.is_available():
    refs["cuda-f32-default"] = refrows(16, torch.float32, None, "cuda")
    refs["cuda-f64-eager"] = refrows(16, torch.float64, "eager", "cuda")
for rn, (toks, rows) in refs.items():
    print("reference", rn, "step29", [round(v, 6) for v in torch.topk(rows[29], 6).values.tolist()],
          torch.topk(rows[29], 6).indices.tolist())
    for k, out in outs.items():
        report(f"  engine {k} vs ref {rn}:", out, toks, rows)
