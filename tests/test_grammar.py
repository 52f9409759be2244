"""Structured outputs (``SamplingParams.structured_outputs``): every output matches its JSON
schema, regex, choice or grammar; greedy constrained tokens are transformers' most likely token
among those the grammar allows, step by step; constrained rows share batches (and overlapped
steps) with free ones without changing them; malformed constraints are refused."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from conftest import hf_model
from writescope import LLM, SamplingParams, StructuredOutputsParams as S
from writescope.core import InvalidRequestError
from writescope.layers.grammar import unpack
from writescope.models.tokenizer import IncrementalDetokenizer

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
LARK = 'start: "(" num ("+" num)* ")"\nnum: /[0-9]{1,2}/'
GBNF = 'root ::= "[" item ("," item)* "]"\nitem ::= [a-c]'


def engine(path, **kw) -> LLM:
    opts = dict(dtype="float32", device="cpu", block_size=16, max_num_batched_tokens=64,
                max_num_seqs=8, max_model_len=512)
    opts.update(kw)
    return LLM(str(path), **opts)


@pytest.fixture(scope="module")
def tiny(tiny_qwen3_moe):
    return engine(tiny_qwen3_moe)


def prompt_ids(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def valid(so: S, text: str) -> bool:
    if so.kind == "json":
        jsonschema.validate(json.loads(text), so.json)
        return True
    if so.kind == "json_object":
        return isinstance(json.loads(text), dict)
    if so.kind == "regex":
        return re.fullmatch(so.regex, text) is not None
    if so.kind == "choice":
        return text in so.choice
    if so.grammar == LARK:
        return re.fullmatch(r"\([0-9]{1,2}(\+[0-9]{1,2})*\)", text) is not None
    return re.fullmatch(r"\[[a-c](,[a-c])*\]", text) is not None


CONSTRAINTS = {"json": S(json=SCHEMA), "regex": S(regex=REGEX),
               "choice": S(choice=["yes", "no", "maybe so"]), "lark": S(grammar=LARK),
               "gbnf": S(grammar=GBNF)}


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_outputs_match_their_constraint(tiny, kind):
    """Greedy, seeded and unseeded sampled rows of one batch (and n > 1): every text matches,
    ended by the grammar (``stop``), not by max_tokens."""
    so = CONSTRAINTS[kind]
    vocab = tiny.engine.config.vocab_size
    prompts = [prompt_ids(vocab, 20 + 7 * i, i) for i in range(4)]
    params = [SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=so),
              SamplingParams(temperature=1.0, seed=5, max_tokens=120, structured_outputs=so),
              SamplingParams(temperature=0.8, top_k=20, max_tokens=120, structured_outputs=so),
              SamplingParams(temperature=1.0, top_p=0.9, n=3, max_tokens=120,
                             structured_outputs=so)]
    outs = tiny.generate(prompts, params)
    texts = [c for o in outs for c in o.outputs]
    assert len(texts) == 6
    for c in texts:
        assert c.finish_reason == "stop", (kind, c.text)
        assert valid(so, c.text), (kind, c.text)


def _ll_matcher(path, grammar: str, vocab: int, eos: list[int]):
    from transformers import AutoTokenizer
    tok = llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(str(path)), n_vocab=vocab,
                                       eos_token=eos)
    return llguidance.LLMatcher(tok, grammar)


@pytest.mark.parametrize("kind", ["json", "regex", "lark"])
def test_greedy_constrained_tokens_are_transformers_best_allowed(tiny, tiny_qwen3_moe, kind):
    """Each greedy token is the argmax of transformers' logits over the tokens a fresh matcher
    (fed the tokens before it) allows; the request ends where the matcher stops."""
    so = CONSTRAINTS[kind]
    vocab = tiny.engine.config.vocab_size
    ids = prompt_ids(vocab, 30, 11)
    (out,) = tiny.generate([ids], SamplingParams(temperature=0.0, max_tokens=120,
                                                 structured_outputs=so, logprobs=0))
    from writescope.layers.grammar import grammar_text
    m = _ll_matcher(tiny_qwen3_moe, grammar_text(so), vocab, sorted(tiny.engine.eos_ids))
    with torch.no_grad():
        logits = hf_model(str(tiny_qwen3_moe))(torch.tensor([ids + out.token_ids])).logits[0]
    rows = torch.log_softmax(logits[len(ids) - 1:-1].float(), -1)
    free = 0
    for step, tok in enumerate(out.token_ids):
        mask = torch.frombuffer(bytearray(m.compute_bitmask()), dtype=torch.int32)
        allowed = unpack(mask.view(1, -1), vocab)[0]
        assert allowed[tok], f"step {step}: token {tok} is not allowed"
        best = torch.where(allowed, rows[step], float("-inf")).argmax().item()
        assert tok == best, f"step {step}: {tok} vs transformers' best allowed {best}"
        free += int(tok == rows[step].argmax().item())
        assert abs(out.logprobs[step] - rows[step, tok].item()) < 1e-4  # the model's own
        assert m.consume_token(tok)
    assert m.is_stopped() and out.finish_reason == "stop"
    assert free < len(out.token_ids)  # the grammar changed at least one choice
    assert valid(so, out.text)


def test_constrained_rows_leave_free_rows_unchanged(tiny_qwen3_moe, monkeypatch):
    """Free and constrained requests in one batch, with overlapped steps on: each output is
    what it is alone."""
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", "1")
    llm = engine(tiny_qwen3_moe)
    vocab = llm.engine.config.vocab_size
    prompts = [prompt_ids(vocab, 25 + 5 * i, 20 + i) for i in range(4)]
    free = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    params = [free, SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=S(
        regex=REGEX)), free, SamplingParams(temperature=0.0, max_tokens=60,
                                            structured_outputs=S(json=SCHEMA))]
    together = llm.generate(prompts, params)
    alone = [llm.generate([p], q)[0] for p, q in zip(prompts, params)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert llm.engine.counters["engine.overlapped_steps"] > 0  # the free rows did overlap
    assert valid(params[1].structured_outputs, together[1].text)


def test_constraint_starting_after_a_marker(tiny):
    """``starts_after`` (a reasoning model's ``</think>``): the tokens up to the one whose text
    completes the marker are the free run's (greedy), the text after the marker matches the
    regex, and the request ends when the regex does; a marker that never comes leaves the
    output free."""
    vocab = tiny.engine.config.vocab_size
    ids = prompt_ids(vocab, 24, 11)
    (free,) = tiny.generate([ids], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    text = free.text
    assert len(text) > 12
    marker = text[4:9]  # a piece of the free text: the constraint starts once it is written
    (out,) = tiny.generate([ids], SamplingParams(
        temperature=0.0, max_tokens=80, structured_outputs=S(regex=REGEX, starts_after=marker)))
    cut = out.text.index(marker) + len(marker)
    # n: the tokens until the streamed text shows the marker (text ending in an incomplete
    # UTF-8 character is held back until the next token)
    detok, seen = IncrementalDetokenizer(tiny.tokenizer, ids), ""
    for n, t in enumerate(free.token_ids, start=1):
        seen += detok.add(t)
        if marker in seen:
            break
    assert out.token_ids[:n] == free.token_ids[:n]
    assert out.text[:cut] == text[:cut]
    # the token completing the marker may carry a few characters more, outside the regex
    after = tiny.tokenizer.decode(out.token_ids[n:])
    assert re.fullmatch(REGEX, after), (out.text, after)
    assert out.finish_reason == "stop"
    (never,) = tiny.generate([ids], SamplingParams(
        temperature=0.0, max_tokens=40, ignore_eos=True,
        structured_outputs=S(regex=REGEX, starts_after="\x00never\x00")))
    assert never.token_ids == free.token_ids
    stats = tiny.stats()
    assert stats["structured.rows_masked"] >= len(out.token_ids) - n


def test_min_tokens_cannot_leave_a_row_without_tokens(tiny):
    """The grammar allows one token, which ``min_tokens`` holds back (a stop token): the row
    takes the grammar's token over the raw logits rather than sampling from nothing."""
    tok = tiny.engine.tokenizer
    first, second = tok.encode("x", add_special_tokens=False), tok.encode(
        "q", add_special_tokens=False)
    assert len(first) == len(second) == 1 and len(tok.encode("xq", add_special_tokens=False)) == 2
    for temp in (0.0, 1.0):
        (out,) = tiny.generate(["hello"], SamplingParams(
            temperature=temp, max_tokens=8, min_tokens=3, stop_token_ids=second,
            structured_outputs=S(choice=["xq"])))
        assert out.token_ids == first + second and out.finish_reason == "stop"


def test_bad_constraints_are_refused(tiny, tiny_qwen3_moe, tmp_path):
    with pytest.raises(InvalidRequestError, match="exactly one"):
        S()
    with pytest.raises(InvalidRequestError, match="exactly one"):
        S(regex="a", choice=["a"])
    with pytest.raises(InvalidRequestError, match="choice"):
        S(choice=[])
    bad = [S(regex="a(b"), S(json={"type": "foo"}), S(json="{not json"),
           S(grammar="start: undefined_rule")]
    for so in bad:
        with pytest.raises(InvalidRequestError, match="structured outputs"):
            tiny.generate(["hi", "there"], SamplingParams(max_tokens=4, structured_outputs=so))
        assert not tiny.engine.has_unfinished_requests()  # nothing of the call left queued
    # a model without a tokenizer cannot be constrained
    bare = tmp_path / "bare"
    shutil.copytree(tiny_qwen3_moe, bare)
    for f in bare.glob("tokenizer*"):
        f.unlink()
    llm = engine(bare)
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, structured_outputs=S(regex="a")))


def test_unpack_matches_bit_order():
    words = torch.tensor([[0b101, -1], [-(1 << 31), 0]], dtype=torch.int32)
    got = unpack(words, 40)
    assert got[0, :3].tolist() == [True, False, True] and not got[0, 3:32].any()
    assert got[0, 32:40].all()
    assert not got[1, :31].any() and got[1, 31] and not got[1, 32:].any()


def test_cli_generate_with_a_schema_file_and_a_bad_regex(tiny_qwen3_moe, tmp_path):
    import subprocess
    import sys
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    out = tmp_path / "o.jsonl"
    base = [sys.executable, "-m", "writescope.cli", "generate", "--model", str(tiny_qwen3_moe),
            "--prompt", "hi", "--max-tokens", "120", "--dtype", "float32", "--device", "cpu"]
    r = subprocess.run(base + ["--json-schema", str(schema), "--output", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    jsonschema.validate(json.loads(row["text"]), SCHEMA)
    r = subprocess.run(base + ["--regex", "a(b"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "invalid regex" in r.stderr and "Traceback" not in r.stderr
    assert "loading" not in r.stderr  # refused before the model loads


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_constrained_rows_in_overlapped_batches(tiny_qwen3_moe):
    """On CUDA (masks unpacked on the device, free rows in overlapped steps): greedy constrained
    and free outputs are the CPU engine's, sampled constrained outputs are valid."""
    from test_parity import PLACEMENTS
    vocab = 320
    prompts = [prompt_ids(vocab, 20 + 9 * i, 40 + i) for i in range(5)]
    free = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    params = [free, SamplingParams(temperature=0.0, max_tokens=120,
                                   structured_outputs=CONSTRAINTS["json"]),
              SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=CONSTRAINTS["gbnf"]),
              free, SamplingParams(temperature=0.0, max_tokens=60,
                                   structured_outputs=CONSTRAINTS["regex"])]
    gpu = engine(tiny_qwen3_moe, device="cuda", **PLACEMENTS["mixed"])
    cpu = engine(tiny_qwen3_moe, device="cpu", **PLACEMENTS["mixed"])
    a, b = gpu.generate(prompts, params), cpu.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for so in CONSTRAINTS.values():
        outs = gpu.generate(prompts[:3], SamplingParams(temperature=1.0, max_tokens=120,
                                                        structured_outputs=so))
        assert all(o.finish_reason == "stop" and valid(so, o.text) for o in outs)


def test_vllms_whitespace_and_additional_properties_options(tiny, tiny_qwen3_moe):
    """vLLM's ``disable_any_whitespace`` (False: any whitespace between a JSON value's tokens;
    writescope's default, compact) and ``disable_additional_properties`` (objects take only the
    properties they name), offline and on the server's ``structured_outputs``."""
    from writescope.layers.grammar import grammar_text
    from writescope.server.protocol import CompletionRequest
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    vocab, eos = tiny.engine.config.vocab_size, sorted(tiny.engine.eos_ids)
    tok = tiny.get_tokenizer()

    def accepts(so, text: str) -> bool:
        m = _ll_matcher(tiny_qwen3_moe, grammar_text(so), vocab, eos)
        ids = tok.encode(text, add_special_tokens=False)
        return m.validate_tokens(ids) == len(ids)
    plain = S(json=schema)
    assert accepts(plain, '{"a":1,"b":2}') and not accepts(plain, '{ "a": 1 }')
    closed = S(json=schema, disable_additional_properties=True, disable_fallback=True)
    assert accepts(closed, '{"a":1}') and not accepts(closed, '{"a":1,"b":2}')
    assert schema == {"type": "object", "properties": {"a": {"type": "integer"}},
                      "required": ["a"]}  # the caller's schema is left as it was
    loose = S(json=schema, disable_any_whitespace=False)
    assert accepts(loose, '{ "a": 1 }') and accepts(loose, '{"a":1}')
    with pytest.raises(InvalidRequestError, match="not both"):
        S(json=schema, disable_any_whitespace=False, whitespace_pattern=" ?")
    with pytest.raises(InvalidRequestError, match="disable_fallback must be true or false"):
        S(json=schema, disable_fallback="yes")
    req = CompletionRequest(prompt="x", structured_outputs={
        "json": schema, "disable_any_whitespace": False, "disable_additional_properties": True})
    so = req.structured()
    assert so.disable_any_whitespace is False and so.disable_additional_properties
    assert accepts(so, '{ "a": 1 }') and not accepts(so, '{"a":1, "b":2}')
