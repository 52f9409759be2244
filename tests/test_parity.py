"""HF parity: greedy tokens identical to transformers' generate, chosen-token log-probabilities
and the five most likely tokens' within 1e-4 at every step (float32), for every architecture and
every placement of KV blocks."""
from __future__ import annotations

import functools

import pytest
import torch

from conftest import hf_model
from writescope import LLM, SamplingParams

PROMPT_LEN, NEW = 210, 32
TOP = 5  # alternatives checked per step

PLACEMENTS = {
    # name: engine options
    "all-G": dict(kv_policy="static", cpu_share=0.5),
    "all-T": dict(kv_policy="transfer", num_gpu_blocks=0),
    "all-C": dict(kv_policy="cpu", num_gpu_blocks=0),
    "mixed": dict(kv_policy="static", cpu_share=0.5, num_gpu_blocks=2),
}


def prompt_ids(vocab: int, n: int = PROMPT_LEN, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def finish_like(eng, want, logprob_tol: float | None = None) -> None:
    """Step ``eng`` until its requests ``r0, r1, ...`` finish: each gives ``want[i]``'s tokens
    (and log-probabilities within ``logprob_tol``), and every block is given back."""
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o
    for i, w in enumerate(want):
        assert outs[f"r{i}"].token_ids == w.token_ids
        if logprob_tol is not None:
            assert max(abs(x - y) for x, y in zip(outs[f"r{i}"].logprobs, w.logprobs)) \
                < logprob_tol
    assert all(n == 0 for n in eng.cache.live_blocks().values())


@functools.lru_cache(maxsize=None)
def reference(path: str, ids: tuple[int, ...], new: int = NEW
              ) -> tuple[list[int], list[float], list[torch.Tensor]]:
    """transformers' greedy tokens, their log-probabilities and each step's whole
    log-probability row, computed in float64: the engine's float32 error alone is measured
    (a float32 oracle adds its own, which differs between hosts' CPU kernels)."""
    return greedy_reference(hf_model(path, dtype=torch.float64), ids, new)


def greedy_reference(model, ids: tuple[int, ...], new: int = NEW
                     ) -> tuple[list[int], list[float], list[torch.Tensor]]:
    """A transformers model's greedy tokens after ``ids``, their log-probabilities and each
    step's whole log-probability row (float64)."""
    x = torch.tensor([list(ids)])
    with torch.no_grad():
        # the mask says every prompt token is real: without it transformers masks each prompt
        # token equal to pad_token_id
        g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                           do_sample=False, output_scores=True, return_dict_in_generate=True,
                           eos_token_id=None, pad_token_id=0)
    toks = g.sequences[0, x.shape[1]:].tolist()
    rows = [torch.log_softmax(s[0].double(), -1) for s in g.scores]
    return toks, [r[t].item() for r, t in zip(rows, toks)], rows


def engine(path, **kw) -> LLM:
    opts = dict(dtype="float32", device="cpu", block_size=16, max_num_batched_tokens=64,
                max_num_seqs=8, max_model_len=512)
    opts.update(kw)
    return LLM(str(path), **opts)


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, logprobs=TOP)


def check(out, ref_toks, ref_lps, ref_rows):
    """``out``: a RequestOutput (log-probabilities as floats) or one of its ``outputs``
    (vLLM's ``{token id: Logprob}`` per token)."""
    assert out.token_ids == ref_toks
    lps = out.logprobs
    if lps and isinstance(lps[0], dict):
        lps = [d[t].logprob for d, t in zip(lps, out.token_ids)]
    assert len(lps) == len(ref_lps) == len(out.top_logprobs)
    for step, (a, b) in enumerate(zip(lps, ref_lps)):
        assert abs(a - b) < 1e-4, f"step {step}: logprob {a} vs transformers {b}"
    for step, (top, row) in enumerate(zip(out.top_logprobs, ref_rows)):
        # the same values as transformers' five largest (ids compared by value: near-ties may
        # swap), each id's value transformers' own for that id
        assert len(top) == TOP
        want = torch.topk(row, TOP).values.tolist()
        assert max(abs(a - b) for a, b in zip(top.values(), want)) < 1e-4, f"step {step}"
        assert all(abs(v - row[t].item()) < 1e-4 for t, v in top.items()), f"step {step}"


def generate_checked(path, **engine_options) -> LLM:
    """Greedy generation after a 210-token prompt, checked against transformers; returns the LLM."""
    llm = engine(path, **engine_options)
    ids = prompt_ids(llm.engine.config.vocab_size)
    (out,) = llm.generate([ids], GREEDY)
    check(out, *reference(str(path), tuple(ids)))
    return llm


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_greedy_matches_transformers(all_tiny, placement):
    s = generate_checked(all_tiny, **PLACEMENTS[placement]).stats()
    assert s["kv.bytes_moved_after_placement"] == 0
    written = {r: s[f"kv.bytes_written.{r}"] for r in "GTC"}
    if placement == "all-G":
        assert written["G"] > 0 and written["T"] == written["C"] == 0
    elif placement == "all-T":
        assert written["T"] > 0 and written["G"] == written["C"] == 0
    elif placement == "all-C":
        assert written["C"] > 0 and written["G"] == written["T"] == 0
    else:
        assert all(v > 0 for v in written.values())
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW"), "every block returned"


def test_hub_style_configs_match_transformers(all_hub):
    generate_checked(all_hub, kv_policy="static", cpu_share=0.5, num_gpu_blocks=3)


def test_sharded_checkpoint_matches(tiny_qwen3_moe, tiny_qwen3_moe_sharded):
    ids = prompt_ids(320, 40)
    a = engine(tiny_qwen3_moe).generate([ids], GREEDY)[0]
    b = engine(tiny_qwen3_moe_sharded).generate([ids], GREEDY)[0]
    assert a.token_ids == b.token_ids


def test_batch_of_different_lengths_equals_one_at_a_time(all_tiny):
    lens = [5, 37, 210, 64, 1]
    prompts = [prompt_ids(320, n, seed=10 + i) for i, n in enumerate(lens)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1)
    batched = engine(all_tiny, kv_policy="static", cpu_share=0.5, num_gpu_blocks=6,
                     max_num_batched_tokens=48).generate(prompts, params)
    for p, b in zip(prompts, batched):
        single = engine(all_tiny, kv_policy="static", cpu_share=0.5, num_gpu_blocks=6).generate([p], params)[0]
        assert b.token_ids == single.token_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, single.logprobs)) < 1e-4


def test_cpu_experts_match_transformers(all_tiny):
    """Routed experts computed by the CPU kernel (experts="cpu") give transformers' tokens too."""
    llm = generate_checked(all_tiny, experts="cpu", kv_policy="static", cpu_share=0.5,
                           num_gpu_blocks=3)
    assert llm.stats()["engine.experts_on_cpu_layers"] == len(llm.engine.config.moe_layers)
    ids = prompt_ids(llm.engine.config.vocab_size)
    gpu = engine(all_tiny, experts="gpu", kv_policy="static", cpu_share=0.5, num_gpu_blocks=3)
    assert gpu.generate([ids], GREEDY)[0].token_ids == llm.generate([ids], GREEDY)[0].token_ids


@functools.lru_cache(maxsize=None)
def prompt_reference(path: str, ids: tuple[int, ...]) -> torch.Tensor:
    """transformers' log-probability rows over the prompt: row i predicts token i + 1."""
    with torch.no_grad():
        logits = hf_model(path)(torch.tensor([list(ids)])).logits[0]
    return torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("placement", ["all-G", "mixed"])
def test_prompt_logprobs_match_transformers(all_tiny, placement):
    """``prompt_logprobs=3`` over a 210-token prompt prefilled in chunks of 64: every prompt
    token's log-probability and the three most likely tokens at each position are
    transformers' (within 1e-4); the first token has none."""
    llm = engine(all_tiny, **PLACEMENTS[placement])
    ids = prompt_ids(llm.engine.config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=3)
    (out,) = llm.generate([ids], params)
    ref = prompt_reference(str(all_tiny), tuple(ids))
    assert len(out.prompt_token_logprobs) == len(out.prompt_top_logprobs) == len(ids)
    assert out.prompt_token_logprobs[0] is None and out.prompt_top_logprobs[0] is None
    for i in range(1, len(ids)):
        row = ref[i - 1]
        assert abs(out.prompt_token_logprobs[i] - row[ids[i]].item()) < 1e-4, f"token {i}"
        top = out.prompt_top_logprobs[i]
        want = torch.topk(row, 3).values.tolist()
        assert max(abs(a - b) for a, b in zip(top.values(), want)) < 1e-4, f"token {i}"
        assert all(abs(v - row[t].item()) < 1e-4 for t, v in top.items()), f"token {i}"
        # the rank: 1 + the tokens transformers finds clearly likelier (a near-tie either way)
        own = row[ids[i]].item()
        lo, hi = int((row > own + 1e-4).sum()) + 1, int((row > own - 1e-4).sum()) + 1
        assert lo <= out.prompt_ranks[i] <= hi, f"token {i}"
    assert out.prompt_ranks[0] is None and len(out.prompt_ranks) == len(ids)
    assert out.logprobs is None and out.top_logprobs is None
    # vLLM's form: per position {token id: Logprob}, the prompt token first with its rank,
    # then the three likeliest ranked 1, 2, 3, each with its text
    vl = out.prompt_logprobs
    assert vl[0] is None and len(vl) == len(ids)
    tok = llm.get_tokenizer()
    for i in range(1, len(ids)):
        d = vl[i]
        assert next(iter(d)) == ids[i]
        assert d[ids[i]].logprob == out.prompt_token_logprobs[i]
        assert d[ids[i]].rank == out.prompt_ranks[i]
        assert d[ids[i]].decoded_token == tok.decode([ids[i]])
        for r, (t, v) in enumerate(out.prompt_top_logprobs[i].items(), 1):
            assert d[t].logprob == v and (d[t].rank == r or t == ids[i])
        assert set(d) == {ids[i], *out.prompt_top_logprobs[i]}


def test_prompt_logprobs_zero_and_long_prompts_in_pieces(all_tiny, monkeypatch):
    """``prompt_logprobs=0``: the prompt tokens' log-probabilities only; the LM head taking a
    few rows at a time (``BLOCK_BYTES``) gives the same values."""
    from writescope.engine import prompt_logprobs as plp
    ids = prompt_ids(320, 150, seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    (a,) = engine(all_tiny).generate([ids], params)
    monkeypatch.setattr(plp, "BLOCK_BYTES", 4 * 320 * 7)  # 7 rows a pass
    (b,) = engine(all_tiny).generate([ids], params)
    assert a.prompt_top_logprobs is None and len(a.prompt_token_logprobs) == 150
    assert a.prompt_ranks == b.prompt_ranks and min(a.prompt_ranks[1:]) >= 1
    assert max(abs(x - y) for x, y in zip(a.prompt_token_logprobs[1:], b.prompt_token_logprobs[1:])) < 1e-5
    ref = prompt_reference(str(all_tiny), tuple(ids))
    assert max(abs(a.prompt_token_logprobs[i] - ref[i - 1, ids[i]].item())
               for i in range(1, 150)) < 1e-4


def prefix_cache_checked(path, **engine_options) -> dict:
    """A prompt that starts with an earlier one's prompt (its blocks sealed while prefilling)
    and one that starts with an earlier prompt *and its output* (blocks sealed while decoding,
    named when it finished) start from those blocks, and from the records of its kept partial
    last block as far as they share its tokens, wherever they were written, and still give
    transformers' tokens and log-probabilities. Returns the engine's stats."""
    llm = engine(path, **engine_options)
    vocab = llm.engine.config.vocab_size
    ids = prompt_ids(vocab)
    (head,) = llm.generate([ids[:150]], SamplingParams(temperature=0.0, max_tokens=8,
                                                       ignore_eos=True))
    (out,) = llm.generate([ids], GREEDY)
    # 9 of the 150-token prompt's blocks of 16 (144), then the first 6 records of its kept tail
    # (``kvcache/tails.py``: ids[144:150] and 7 of its outputs): this prompt goes on with
    # ids[150], not the first output, so the tail's first 6 tokens are all it shares
    assert head.token_ids[0] != ids[150]
    assert out.num_cached_tokens == 144 + 6
    check(out, *reference(str(path), tuple(ids)))
    # 100 prompt tokens + 39 decoded ones in the cache: 8 whole blocks, 2 made while decoding
    short = prompt_ids(vocab, 100, seed=7)
    (first,) = llm.generate([short], SamplingParams(temperature=0.0, max_tokens=40,
                                                    ignore_eos=True))
    follow = short + first.token_ids[:30] + [5]
    (out,) = llm.generate([follow], GREEDY)
    # its 8 blocks (128), then 2 records of the kept tail (its outputs 28..38): the prompt's
    # tokens after the blocks are outputs 28 and 29, then 5 -- its last, computed anyway
    assert out.num_cached_tokens == 128 + 2
    check(out, *reference(str(path), tuple(follow)))
    s = llm.stats()
    assert s["prefix.hit_tokens"] == 150 + 130
    assert s["kv.bytes_moved_after_placement"] == 0
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW"), "every block free or cached unused"
    return s


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_prefix_cache_hits_match_transformers(all_tiny, placement):
    prefix_cache_checked(all_tiny, **PLACEMENTS[placement])


def test_a_prompt_sharing_a_kept_tails_first_tokens_starts_from_those_records(all_tiny):
    """A finished request's partial last block is kept (``kvcache/tails.py``). A prompt equal to
    what it showed after it stopped on a stop token (the prompt and the answer before it: the
    tail holds the records of every one of those tokens, so a match of whole tails, which
    leaves the prompt's last token to compute, took none of it), and a next turn that goes
    another way after the answer's first tokens (a template that drops the answer's
    thinking), start from as many of the tail's records as they share tokens with it, and
    give the tokens and log-probabilities of an engine without prefix caching."""
    llm = engine(all_tiny, **PLACEMENTS["mixed"])
    off = engine(all_tiny, enable_prefix_caching=False, **PLACEMENTS["mixed"])
    ids = prompt_ids(llm.engine.config.vocab_size, 40, seed=11)  # 2 blocks of 16, then 8
    (free,) = off.generate([ids], SamplingParams(temperature=0.0, max_tokens=12,
                                                 ignore_eos=True))
    toks = free.token_ids
    # a stop token the answer reaches after 4 to 8 tokens (its records stay in block 2)
    j = next(j for j in range(4, 9) if toks[j] not in toks[:j])
    (first,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=12,
                                                  stop_token_ids=[toks[j]]))
    assert first.finish_reason == "stop" and first.token_ids[:j] == toks[:j]
    # its records: ids and toks[:j] (the stop token is never input); the last 8 + j of them
    # are the kept tail after ids' 2 blocks
    seen = ids + toks[:j]
    turn = ids + toks[:3] + [t for t in prompt_ids(llm.engine.config.vocab_size, 9, seed=12)
                             if t != toks[3]][:6]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
    want = off.generate([seen, turn], params)
    for prompt, w, cached in ((seen, want[0], 32 + 8 + j - 1), (turn, want[1], 32 + 8 + 3)):
        # 2 blocks, then the tail's records: seen's every token but its last (computed
        # anyway), turn's up to where it leaves the answer (ids[32:] and toks[:3])
        (out,) = llm.generate([prompt], params)
        assert out.num_cached_tokens == cached
        assert out.token_ids == w.token_ids
        assert max(abs(x - y) for x, y in zip(out.logprobs, w.logprobs)) < 1e-4
    s = llm.stats()
    assert s["prefix.tail_hit_tokens"] == (8 + j - 1) + (8 + 3)
    assert s["prefix.hit_tokens"] == (32 + 8 + j - 1) + (32 + 8 + 3)
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW"), "every block free or cached unused"


def test_completions_of_one_prompt_share_its_blocks(all_tiny):
    """``n=3``: the second and third completions wait for the first's prompt blocks (they are
    being prefilled) and start from them; each is transformers' greedy output."""
    llm = engine(all_tiny, **PLACEMENTS["mixed"])
    ids = prompt_ids(llm.engine.config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, logprobs=TOP, n=3)
    (out,) = llm.generate([ids], params)
    ref = reference(str(all_tiny), tuple(ids))
    for c in out.outputs:
        check(c, *ref)
    assert llm.stats()["prefix.hit_tokens"] == 2 * 208  # 13 whole blocks of the 210 tokens
