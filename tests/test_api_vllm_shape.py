"""Code written for vLLM's offline API (``LLM``, ``SamplingParams``, ``RequestOutput``) runs
unchanged on writescope and reads the same shapes."""
from __future__ import annotations

import pytest

from writescope import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8, max_model_len=256,
               max_num_seqs=8, num_gpu_blocks=4, kv_policy="static", cpu_share=0.5)


GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def test_llm_engine_and_get_tokenizer(llm):
    assert llm.llm_engine is llm.engine
    tok = llm.get_tokenizer()
    # vLLM hands out the Hugging Face tokenizer: its own apply_chat_template(tokenize=False)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == llm.tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert tok.encode("hello there", add_special_tokens=False) == \
        llm.tokenizer.encode("hello there", add_special_tokens=False)
    assert llm.llm_engine.has_unfinished_requests() is False


def test_chat_takes_a_chat_template(llm):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    out = llm.chat(msgs, GREEDY, chat_template=template)[0]
    assert out.prompt == "[system] S\n[user] hello\n"
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt, add_special_tokens=False)
    same = llm.generate({"prompt_token_ids": out.prompt_token_ids}, GREEDY)[0]
    assert same.outputs[0].token_ids == out.outputs[0].token_ids
    # the model's own template otherwise; several conversations at once
    two = llm.chat([msgs, msgs[1:]], GREEDY)
    assert [o.prompt for o in two] == [llm.tokenizer.render_chat(msgs),
                                       llm.tokenizer.render_chat(msgs[1:])]
    with pytest.raises(ValueError, match="chat_template"):
        llm.chat(msgs, GREEDY, chat_template_kwargs={"chat_template": template})


def test_detokenize_false_and_clone(llm):
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    plain = llm.generate("hello there", sp)[0].outputs[0]
    bare = llm.generate("hello there", SamplingParams(temperature=0, max_tokens=5,
                                                       ignore_eos=True, detokenize=False,
                                                       logprobs=1))[0]
    assert bare.outputs[0].text == "" and bare.outputs[0].token_ids == plain.token_ids
    # no text anywhere: log-probabilities' decoded_token is None too (vLLM's)
    assert all(lp.decoded_token is None for d in bare.outputs[0].logprobs for lp in d.values())
    assert plain.text and bare.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=["x"], detokenize=False)
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(detokenize="no")
    a = SamplingParams(stop=["x"], stop_token_ids=[3], temperature=0.5)
    b = a.clone()
    assert b == a and b is not a
    b.stop.append("y")
    assert a.stop == ["x"]


def test_completion_logprobs_are_vllm_dicts(llm):
    """``outputs[i].logprobs``: per token ``{token id: Logprob(logprob, rank, decoded_token)}``,
    the sampled token's entry among them; vLLM code indexes it by the sampled id."""
    from writescope import Logprob
    tok = llm.tokenizer
    # computed from nothing cached, as the step run below: a kept tail of an earlier "hello"
    # prompt would start a run from its records (``kvcache/tails.py``), whose log-probabilities
    # differ in the last float bits from a run that computes every prompt token
    assert llm.reset_prefix_cache()
    o = llm.generate("hello there", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                   logprobs=3))[0]
    c = o.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 4
    for t, lp, step, top in zip(c.token_ids, o.logprobs, c.logprobs, o.top_logprobs):
        assert isinstance(step, dict) and all(isinstance(v, Logprob) for v in step.values())
        assert step[t].logprob == lp and step[t].rank == 1  # greedy: the likeliest
        assert step[t].decoded_token == tok.decode([t], skip_special_tokens=False)
        assert set(step) == set(top) and len(step) == 3
        assert sorted(v.rank for v in step.values()) == [1, 2, 3]
        assert all(step[k].logprob == v for k, v in top.items())
    assert c.cumulative_logprob == pytest.approx(sum(v[t].logprob
                                                     for t, v in zip(c.token_ids, c.logprobs)))
    # logprobs=0: the sampled token's only; n > 1: every completion's
    zero = llm.generate("hello", SamplingParams(temperature=0.9, seed=1, n=2, max_tokens=3,
                                                ignore_eos=True, logprobs=0))[0]
    for comp in zero.outputs:
        assert [list(d) for d in comp.logprobs] == [[t] for t in comp.token_ids]
    # a sampled token outside the alternatives asked for still has its rank (vLLM's)
    hot = llm.generate("hello", SamplingParams(temperature=50.0, seed=5, max_tokens=8,
                                               ignore_eos=True, logprobs=1))[0]
    assert hot.ranks is not None and len(hot.ranks) == 8
    off = [(t, d) for t, d in zip(hot.outputs[0].token_ids, hot.outputs[0].logprobs)
           if len(d) == 2]
    assert off, "a temperature of 50 draws tokens outside the top 1"
    for t, d in off:
        (alt,) = (a for a in d if a != t)
        assert d[alt].rank == 1 and d[t].logprob < d[alt].logprob and d[t].rank > 1
    none = llm.generate("hello", SamplingParams(max_tokens=2))[0].outputs[0]
    assert none.logprobs is None and none.cumulative_logprob is None
    # the same through the engine's step outputs
    eng = llm.llm_engine
    assert llm.reset_prefix_cache()
    eng.add_request("lp-step", "hello there", SamplingParams(temperature=0, max_tokens=4,
                                                             ignore_eos=True, logprobs=3))
    last = None
    while eng.has_unfinished_requests():
        for out in eng.step():
            last = out
    assert last.finished and last.outputs[0].logprobs == c.logprobs
    assert last.num_cached_tokens == o.num_cached_tokens == 0


def test_engine_takes_prompt_dicts_and_aborts_a_list(llm):
    """vLLM's ``LLMEngine.add_request(id, TokensPrompt/TextPrompt, params)`` and
    ``abort_request([ids])``."""
    eng = llm.llm_engine
    ids = llm.tokenizer.encode("hello there")
    eng.add_request("d-text", {"prompt": "hello there"}, GREEDY)
    eng.add_request("d-ids", {"prompt_token_ids": ids}, GREEDY)
    eng.add_request("d-gone", {"prompt_token_ids": ids}, GREEDY)
    eng.add_request("d-gone2", "hello", GREEDY)
    with pytest.raises(ValueError, match="prompt"):
        eng.add_request("d-bad", {"text": "x"}, GREEDY)
    eng.step()
    eng.abort_request(["d-gone", "d-gone2", "never-added"])
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            assert out.request_id not in ("d-gone", "d-gone2")
            if out.finished:
                done[out.request_id] = out
    assert set(done) == {"d-text", "d-ids"}
    assert done["d-text"].prompt == "hello there" and done["d-ids"].prompt is None
    assert done["d-text"].prompt_token_ids == done["d-ids"].prompt_token_ids == ids
    assert done["d-text"].token_ids == done["d-ids"].token_ids


def test_llm_takes_vllm_constructor_options(tiny_qwen3_moe):
    """``LLM(model, trust_remote_code=True, tensor_parallel_size=1)``, common in vLLM scripts."""
    opts = dict(dtype="float32", device="cpu", block_size=8, max_model_len=64, max_num_seqs=2,
                num_gpu_blocks=4, kv_policy="static")
    llm = LLM(str(tiny_qwen3_moe), trust_remote_code=True, tensor_parallel_size=1, **opts)
    assert llm.generate("hello", GREEDY)[0].outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(str(tiny_qwen3_moe), tensor_parallel_size=2, **opts)


def test_output_kind_delta_and_final_only(llm):
    """vLLM's ``SamplingParams.output_kind`` as ``LLMEngine.step`` applies it."""
    from writescope import RequestOutputKind
    eng = llm.llm_engine
    kw = dict(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0, prompt_logprobs=0,
              stop=["zzz"])
    for kind in RequestOutputKind:
        eng.add_request(f"k-{kind.name}", "hello there", SamplingParams(**kw, output_kind=kind))
    seen = {k.name: [] for k in RequestOutputKind}
    while eng.has_unfinished_requests():
        for out in eng.step():
            seen[out.request_id[2:]].append(out)
    whole = seen["CUMULATIVE"][-1]
    assert len(seen["CUMULATIVE"]) == 6 and whole.finished and len(whole.token_ids) == 6
    final = seen["FINAL_ONLY"]
    assert len(final) == 1 and final[0].finished
    assert (final[0].token_ids, final[0].text) == (whole.token_ids, whole.text)
    # (rows of one batch: log-probabilities equal to float32 rounding)
    assert final[0].logprobs == pytest.approx(whole.logprobs, abs=1e-5)
    delta = seen["DELTA"]
    assert delta[-1].finished and not any(d.finished for d in delta[:-1])
    assert [t for d in delta for t in d.token_ids] == whole.token_ids
    assert [x for d in delta for x in d.logprobs] == pytest.approx(whole.logprobs, abs=1e-5)
    assert "".join(d.text for d in delta) == whole.text
    assert delta[0].prompt_logprobs[0] is None and len(delta[0].prompt_logprobs) == \
        len(whole.prompt_token_ids)
    assert all(d.prompt_logprobs is None for d in delta[1:])
    # LLM.generate returns whole outputs whatever the kind
    for kind in RequestOutputKind:
        got = llm.generate("hello there", SamplingParams(**kw, output_kind=kind))[0]
        assert (got.token_ids, got.text) == (whole.token_ids, whole.text)
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="delta")


def test_outputs_is_built_once(llm):
    """``out.outputs`` is the same list on every read (vLLM's is an attribute): code that
    indexes ``out.outputs[0].logprobs[i]`` in a loop does not rebuild every token's dicts."""
    o = llm.generate("hello", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                             logprobs=2))[0]
    assert o.outputs is o.outputs and o.outputs[0].logprobs is o.outputs[0].logprobs
    o.outputs[0].text = "edited"
    assert o.outputs[0].text == "edited"


def test_generate_draws_a_bar_by_default_as_vllm(llm, capsys):
    """vLLM's ``use_tqdm``: on by default, off with False, or the tqdm class to draw with."""
    from tqdm import tqdm
    p = SamplingParams(max_tokens=2)
    llm.generate("hello", p)
    assert "generating" in capsys.readouterr().err
    llm.generate("hello", p, use_tqdm=False)
    assert "generating" not in capsys.readouterr().err
    made = []

    class Mine(tqdm):
        def __init__(self, *a, **kw):
            made.append(kw["total"])
            super().__init__(*a, **kw)
    llm.chat([{"role": "user", "content": "hi"}], p, use_tqdm=Mine)
    assert made == [1] and "generating" in capsys.readouterr().err


def test_the_progress_bar_shows_the_rate_while_one_request_runs(llm, capsys, monkeypatch):
    """``use_tqdm``: the bar's tokens/s is redrawn as steps go (every half second), not only
    when a request finishes: one long request shows its rate before it ends."""
    import writescope.llm as llm_module
    clock = iter(range(0, 10 ** 6))
    monkeypatch.setattr(llm_module.time, "monotonic", lambda: float(next(clock)))
    llm.generate("hello there", SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=True)
    frames = capsys.readouterr().err.replace("\r", "\n").splitlines()
    running = [f for f in frames if "0/1" in f and "tok_s=" in f]
    assert len(running) >= 3, frames
