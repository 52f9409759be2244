"""Output text against vLLM's semantics: incremental detokenisation, stop strings and tokens,
min_tokens, special tokens, through LLMEngine (scripted token streams) and the server."""
from __future__ import annotations

import itertools

import pytest

from conftest import IM_END_ID
from writescope import LLM, SamplingParams
from writescope.core import RequestOutputKind


@pytest.fixture(scope="module")
def llm(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8, max_model_len=256,
               max_num_seqs=8, kv_policy="static")


def scripted(engine, monkeypatch, scripts):
    """Make the engine's sampled tokens follow ``scripts`` ({request id: [token ids]}): the
    model still runs; each request's k-th sampled token is replaced by its script's k-th."""
    runner = engine.runner
    real = runner.collect

    def collect(h):
        tokens, lps, top, ranks = real(h)
        tokens = list(tokens)
        rows = [s.request for s in h.batch.seqs if s.sample]
        for i, req in enumerate(rows):
            script = scripts.get(req.request_id)
            if script is not None and len(req.output_token_ids) < len(script):
                tokens[i] = script[len(req.output_token_ids)]
        return tokens, lps, top, ranks

    monkeypatch.setattr(runner, "collect", collect)


def run(llm, monkeypatch, ids, kind=RequestOutputKind.DELTA, prompt="hello", **kw):
    """One request with its tokens scripted: its outputs, step by step (DELTA by default)."""
    eng = llm.engine
    rid = f"r{next(_ids)}"
    scripted(eng, monkeypatch, {rid: list(ids)})
    kw.setdefault("max_tokens", len(ids))
    eng.add_request(rid, prompt, SamplingParams(temperature=0, output_kind=kind, **kw))
    outs = []
    while eng.has_unfinished_requests():
        outs += [o for o in eng.step() if o.request_id == rid]
    return outs


_ids = itertools.count()


def enc(llm, s):
    return llm.tokenizer.encode(s, add_special_tokens=False)


TEXT = "Hello world, café ünïcödé 日本語 🎉 done"  # H|e|ll|o| w|or|ld|,| c|a|f|...


@pytest.mark.parametrize("min_tokens,stop,want", [
    (1, "H", TEXT),              # the first token is output whatever it holds
    (4, "o", "Hello w"),         # the 4th token "o" is the last min_tokens token; " w|or" stops
    (3, "lo", "Hel"),            # completed by the 4th token, begun in the 3rd: it counts
    (3, "o", "Hell"),            # the 4th token is past min_tokens
], ids=["first-token", "last-min-token", "straddling", "after"])
def test_stop_strings_wait_for_min_tokens(llm, monkeypatch, min_tokens, stop, want):
    """vLLM: a stop string counts only once the output has more than ``min_tokens`` tokens
    (the first ``min_tokens`` tokens are output whatever they hold, as EOS is masked there);
    a stop string that begins in them and ends after them counts."""
    ids = enc(llm, TEXT)
    assert [llm.tokenizer.decode([i]) for i in ids[:6]] == ["H", "e", "ll", "o", " w", "or"]
    outs = run(llm, monkeypatch, ids, ignore_eos=True, stop=[stop], min_tokens=min_tokens)
    last = outs[-1]
    assert "".join(o.text for o in outs) == want
    assert (last.finish_reason, last.stop_reason) == \
        (("length", None) if want == TEXT else ("stop", stop))


@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
@pytest.mark.parametrize("stop", ["eos", "stop-token-id"])
def test_a_stop_token_after_part_of_a_character(llm, monkeypatch, skip, stop):
    """A stop token whose text is not output (EOS, a stop_token_ids token) leaves the text the
    tokenizer's decode of the tokens before it, whatever skip_special_tokens is: the part of a
    character before it still reads as U+FFFD, as it does when max_tokens cuts it."""
    part = enc(llm, "日")[:2]
    assert llm.tokenizer.decode(part) == "\ufffd"
    last = enc(llm, "日")[2] if stop == "stop-token-id" else IM_END_ID
    kw = dict(stop_token_ids=[last]) if stop == "stop-token-id" else {}
    outs = run(llm, monkeypatch, enc(llm, "Hi ") + part + [last], max_tokens=10,
               skip_special_tokens=skip, **kw)
    assert outs[-1].finish_reason == "stop"
    assert "".join(o.text for o in outs) == "Hi \ufffd"
    assert all(not o.text.endswith("\ufffd") for o in outs[:-1])


# ------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def client(llm):
    pytest.importorskip("fastapi")
    from conftest import in_process_server
    with in_process_server(llm.engine) as c:
        yield c


def test_detokenize_keeps_special_tokens_as_vllm(llm, client):
    """vLLM's /detokenize is the tokenizer's ``decode(tokens)`` (special tokens kept), so that
    the ids /tokenize gives for a conversation read back as the rendered prompt."""
    conv = [{"role": "user", "content": "hi"}]
    ids = client.post("/tokenize", json={"messages": conv}).json()["tokens"]
    text = llm.tokenizer.render_chat(conv)
    assert "<|im_end|>" in text and ids == llm.tokenizer.encode(text, add_special_tokens=False)
    r = client.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": llm.tokenizer.hf.decode(ids)} == {"prompt": text}
