"""The engine and the vLLM-shaped API: sampling, stops, limits, errors, aborts, statistics."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from writescope import LLM, SamplingParams
from writescope.core import InvalidRequestError, RequestTooLargeError


@pytest.fixture(scope="module")
def llm(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8, max_model_len=256,
               max_num_seqs=8, num_gpu_blocks=4, kv_policy="static", cpu_share=0.5)


def test_outputs_have_vllm_fields(llm):
    outs = llm.generate(["hello there", [5, 6, 7]], SamplingParams(temperature=0, max_tokens=5,
                                                                  ignore_eos=True, logprobs=1))
    assert len(outs) == 2
    o = outs[0]
    assert o.prompt == "hello there" and o.prompt_token_ids == llm.tokenizer.encode("hello there")
    assert len(o.token_ids) == 5 and o.finish_reason == "length" and len(o.logprobs) == 5
    assert o.text == llm.tokenizer.decode(o.token_ids)
    assert outs[1].prompt is None and outs[1].prompt_token_ids == [5, 6, 7]
    assert llm.generate("x", SamplingParams(max_tokens=2, ignore_eos=True))[0].logprobs is None
    assert o.top_logprobs is not None and all(len(d) == 1 for d in o.top_logprobs)


def test_logprobs_zero_and_alternatives_in_a_mixed_batch(llm):
    """One batch: a row with no log-probabilities, one with the sampled token's only (0), one
    with 4 alternatives a step, sampled at temperature 0.8 (its alternatives are the model's
    distribution, not the sampler's)."""
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0),
              SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True, logprobs=4)]
    none, zero, four = llm.generate([[5, 6, 7], [8, 9], [10, 11, 12, 13]], params)
    assert none.logprobs is None and none.top_logprobs is None
    assert len(zero.logprobs) == 6 and zero.top_logprobs is None
    assert len(four.top_logprobs) == 6
    for tok, lp, top in zip(four.token_ids, four.logprobs, four.top_logprobs):
        vals = list(top.values())
        assert len(top) == 4 and vals == sorted(vals, reverse=True)
        assert lp <= vals[0] + 1e-6 and (tok not in top or abs(top[tok] - lp) < 1e-6)


def test_seeded_sampling_is_reproducible_and_varies(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=12, seed=7, ignore_eos=True)
    a = llm.generate(["once upon"], p)[0].token_ids
    b = llm.generate(["once upon"], p)[0].token_ids
    c = llm.generate(["once upon"], SamplingParams(temperature=1.0, max_tokens=12, seed=8,
                                                   ignore_eos=True))[0].token_ids
    assert a == b and a != c


def test_vllm_prompt_dicts(llm):
    """vLLM's TextPrompt / TokensPrompt dicts give what their text or ids give."""
    g = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    ids = llm.tokenizer.encode("once upon")
    want = llm.generate(["once upon", ids], g)
    got = llm.generate([{"prompt": "once upon"}, {"prompt_token_ids": ids}], g)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert llm.generate({"prompt_token_ids": ids}, g)[0].token_ids == want[1].token_ids
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate([{"text": "x"}], g)


def test_top_k_one_is_greedy(llm):
    g = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    k1 = llm.generate(["abc"], SamplingParams(temperature=1.5, top_k=1, max_tokens=8, seed=3,
                                              ignore_eos=True))[0]
    assert g.token_ids == k1.token_ids


def test_stop_token_and_stop_string(llm):
    base = llm.generate(["the"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    stop_tok = base.token_ids[3]
    o = llm.generate(["the"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                             stop_token_ids=[stop_tok]))[0]
    assert o.finish_reason == "stop" and o.token_ids == base.token_ids[:base.token_ids.index(stop_tok) + 1]
    text = base.text
    assert len(text) > 4
    stop = text[2:4]
    o = llm.generate(["the"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    assert o.finish_reason == "stop" and o.text == text[:text.find(stop)]
    kept = llm.generate(["the"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                stop=[stop], include_stop_str_in_output=True))[0]
    assert kept.finish_reason == "stop" and kept.text == text[:text.find(stop) + len(stop)]


def test_stop_reasons(llm):
    """``stop_reason`` (vLLM's): the stop string or the stop_token_ids token that ended the
    output; None for a length limit."""
    g = dict(temperature=0, max_tokens=12, ignore_eos=True)
    base = llm.generate(["the"], SamplingParams(**g))[0]
    assert base.stop_reason is None and base.outputs[0].stop_reason is None
    tok = base.token_ids[3]
    o = llm.generate(["the"], SamplingParams(**g, stop_token_ids=[tok]))[0]
    assert o.finish_reason == "stop" and o.stop_reason == tok == o.outputs[0].stop_reason
    stop = base.text[2:4]
    o = llm.generate(["the"], SamplingParams(**g, stop=["never there", stop]))[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop


def test_unfinished_outputs_keep_back_what_a_stop_string_may_cut(llm):
    """Every text ``LLMEngine.step`` shows for an unfinished request is a prefix of its final
    text (vLLM's stop buffer): the last len(longest stop) - 1 characters wait until the stop
    string is ruled out; with include_stop_str_in_output nothing waits."""
    g = dict(temperature=0, max_tokens=12, ignore_eos=True)
    text = llm.generate(["the"], SamplingParams(**g))[0].text
    eng = llm.engine
    for k in range(len(text) - 3):
        for keep in (False, True):
            stop = text[k:k + 3]
            eng.add_request(f"hold-{k}-{keep}", "the", SamplingParams(
                **g, stop=[stop], include_stop_str_in_output=keep))
            seen = []
            while eng.has_unfinished_requests():
                seen += [o for o in eng.step()]
            final = seen[-1]
            assert final.finished and final.stop_reason == stop
            assert final.text == text[:text.find(stop) + (3 if keep else 0)]
            for o in seen[:-1]:
                assert final.text.startswith(o.text), (stop, o.text, final.text)


def test_best_of_returns_the_n_likeliest_of_its_samples(llm):
    """``best_of`` (vLLM 0.6's): that many completions sampled, the n of highest cumulative
    log-probability returned, highest first; their log-probabilities only when asked for."""
    g = dict(temperature=1.0, max_tokens=6, ignore_eos=True, seed=5)
    every = llm.generate(["the"], SamplingParams(**g, n=4, logprobs=0))[0].outputs
    best = llm.generate(["the"], SamplingParams(**g, n=2, best_of=4, logprobs=0))[0].outputs
    ranked = sorted(every, key=lambda c: c.cumulative_logprob, reverse=True)[:2]
    assert [c.token_ids for c in best] == [c.token_ids for c in ranked]
    assert [c.index for c in best] == [0, 1]
    quiet = llm.generate(["the"], SamplingParams(**g, n=1, best_of=4))[0]
    assert quiet.token_ids == ranked[0].token_ids and quiet.logprobs is None
    same = llm.generate(["the"], SamplingParams(**g, n=2, best_of=2))[0].outputs
    assert [c.token_ids for c in same] == [c.token_ids for c in every[:2]]
    for bad in (dict(n=3, best_of=2), dict(best_of=0), dict(best_of=True)):
        with pytest.raises(InvalidRequestError, match="best_of"):
            SamplingParams(**bad)
    assert SamplingParams(spaces_between_special_tokens=False).spaces_between_special_tokens \
        is False  # vLLM's field: accepted (it changes only slow tokenizers' text)
    with pytest.raises(InvalidRequestError, match="spaces_between_special_tokens"):
        SamplingParams(spaces_between_special_tokens="no")


def test_bad_parameters_are_rejected():
    for kw in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(max_tokens=0),
               dict(max_tokens=-3), dict(top_k=-2), dict(temperature=float("nan")),
               dict(seed=2 ** 64), dict(seed=-2 ** 63 - 1)):
        with pytest.raises(InvalidRequestError):
            SamplingParams(**kw)


def test_a_temperature_below_the_epsilon_samples_greedily(llm):
    greedy = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=6))[0].token_ids
    for t in (1e-6, 1e-38, 1e-45):  # dividing by these overflowed the logits to NaN rows
        assert SamplingParams(temperature=t).greedy
        for seed in (None, 3):
            o = llm.generate([[5, 6, 7]], SamplingParams(temperature=t, seed=seed, max_tokens=6))
            assert o[0].token_ids == greedy
    assert not SamplingParams(temperature=1e-4).greedy


def test_sampling_params_of_the_wrong_type_are_refused(llm):
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate("hi", {"temperature": 0})
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_or_failed_generate_leaves_none_of_its_requests(llm, monkeypatch, failure):
    """Ctrl-C (or a failed step) in generate ends that call's requests: the next call neither
    runs them to no one nor starts from the broken step's state."""
    prompts = [[5, 6, 7], [9, 10, 11, 12]]
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    want = [o.token_ids for o in llm.generate(prompts, greedy)]
    step, calls = llm.engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 3:
            raise failure("stop")
        return step()
    monkeypatch.setattr(llm.engine, "step", failing_step)
    with pytest.raises(failure):
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    monkeypatch.undo()
    assert not llm.engine.has_unfinished_requests()
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == want


def test_engine_options_out_of_range_are_refused_before_the_weights_load(tiny_qwen3_moe,
                                                                         monkeypatch):
    from writescope.engine.engine import LLMEngine
    for kw, msg in ((dict(device="tpu"), "device must be 'cuda' or 'cpu'"),
                    (dict(num_gpu_blocks=-3), "num_gpu_blocks must be an integer of at least 0"),
                    (dict(cpu_threads=-2), "cpu_threads must be an integer of at least 1")):
        with pytest.raises(ValueError, match=msg):
            LLMEngine(str(tiny_qwen3_moe), **kw)
    # past the model's positions: refused for a checkpoint, as vLLM does, unless asked for
    from conftest import TINY_MAX_POS
    with pytest.raises(ValueError, match=f"more than the model's {TINY_MAX_POS} positions"):
        LLMEngine(str(tiny_qwen3_moe), device="cpu", max_model_len=2 * TINY_MAX_POS)
    monkeypatch.setenv("WRITESCOPE_ALLOW_LONG_MAX_MODEL_LEN", "1")
    e = LLMEngine(str(tiny_qwen3_moe), device="cpu", dtype="float32",
                  max_model_len=2 * TINY_MAX_POS)
    assert e.max_model_len == 2 * TINY_MAX_POS


def test_default_max_model_len_is_the_derived_length(tmp_path):
    """As vLLM: without max_model_len a YaRN checkpoint runs its scaled length (here a Qwen3
    config given Qwen's YaRN block over 512 positions, factor 4: 2048 while
    max_position_embeddings says 1024), and a plain one its max_position_embeddings."""
    from conftest import build_tiny_checkpoint
    from writescope.engine.engine import LLMEngine
    yarn = build_tiny_checkpoint("qwen3_moe", tmp_path / "yarn", max_position_embeddings=1024,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                      "original_max_position_embeddings": 512})
    assert LLMEngine(str(yarn), device="cpu", dtype="float32").max_model_len == 2048
    plain = build_tiny_checkpoint("qwen3_moe", tmp_path / "plain", max_position_embeddings=1024)
    assert LLMEngine(str(plain), device="cpu", dtype="float32").max_model_len == 1024


def test_max_model_len_zero_is_refused_not_the_default(tiny_qwen3_moe):
    from writescope.engine.engine import LLMEngine
    for bad, msg in ((0, "at least 2, got 0"), (2.5, "must be an integer, got 2.5"),
                     (True, "must be an integer, got True")):
        with pytest.raises(ValueError, match=msg):
            LLMEngine(str(tiny_qwen3_moe), device="cpu", max_model_len=bad)


def test_the_default_max_model_len_comes_down_to_what_the_budgets_hold(tiny_qwen3_moe):
    """As vLLM's --max-model-len auto: budgets of 4 blocks of 8 hold 5 x 8 tokens of one
    sequence (the last block in the W tail); a request without max_tokens then gets that room.
    A length asked for stays, with a warning, and longer requests are refused by name."""
    kw = dict(dtype="float32", device="cpu", block_size=8, num_gpu_blocks=4, pinned_budget=0,
              host_budget=0, kv_policy="static")
    with pytest.warns(RuntimeWarning, match="hold at most 40 tokens of one sequence: "
                                            "max_model_len is 40"):
        small = LLM(str(tiny_qwen3_moe), **kw)
    assert small.engine.max_model_len == 40
    out = small.generate([[5] * 10], SamplingParams(max_tokens=None, ignore_eos=True))[0]
    assert len(out.token_ids) == 30 and out.finish_reason == "length"
    with pytest.warns(RuntimeWarning, match="fewer than max_model_len 512"):
        asked = LLM(str(tiny_qwen3_moe), max_model_len=512, **kw)
    assert asked.engine.max_model_len == 512
    with pytest.raises(RequestTooLargeError, match="never fit"):
        asked.generate([[5] * 10], SamplingParams(max_tokens=None))


def test_token_ids_as_numpy_and_torch_integers(llm):
    import numpy as np
    p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    want = llm.generate([[5, 6, 7]], p)[0].token_ids
    for ids in (np.array([5, 6, 7]), torch.tensor([5, 6, 7]), [np.int64(5), 6, np.int32(7)],
                {"prompt_token_ids": np.array([5, 6, 7])}):
        assert llm.generate([ids], p)[0].token_ids == want
    for bad, msg in (([None], "got NoneType"), ([[1.5]], "token ids must be integers"),
                     ([torch.tensor([1.5])], "token ids must be integers")):
        with pytest.raises(InvalidRequestError, match=msg):
            llm.generate(bad, p)


def test_sampling_params_take_numpy_integers_and_name_bad_lists():
    import numpy as np
    p = SamplingParams(max_tokens=np.int64(5), n=np.int32(2), seed=torch.tensor(3),
                       stop_token_ids=[np.int64(4)])
    assert (p.max_tokens, p.n, p.seed, p.stop_token_ids) == (5, 2, 3, [4])
    assert all(type(v) is int for v in (p.max_tokens, p.n, p.seed, p.stop_token_ids[0]))
    q = SamplingParams(temperature=np.float32(0.5), top_p=torch.tensor(0.9),
                       allowed_token_ids=[np.int64(3)], logit_bias={np.int64(3): np.float32(1)})
    assert (q.temperature, q.allowed_token_ids, q.logit_bias) == (0.5, [3], {3: 1.0})
    assert type(q.temperature) is float and type(q.top_p) is float
    for kw, msg in ((dict(stop=5), "stop must be a list of strings, got 5"),
                    (dict(stop_token_ids=5), "stop_token_ids must be a list of token ids"),
                    (dict(stop_token_ids=[True]), "non-negative integers"),
                    (dict(max_tokens=torch.tensor(3.5)), "max_tokens must be a positive integer"),
                    (dict(max_tokens=np.True_), "max_tokens must be a positive integer"),
                    (dict(max_tokens=torch.tensor(True)), "max_tokens must be a positive integer"),
                    (dict(max_tokens=torch.tensor([5])), "max_tokens must be a positive integer")):
        with pytest.raises(InvalidRequestError, match=msg):
            SamplingParams(**kw)


def test_limits(llm):
    with pytest.raises(RequestTooLargeError, match="max_model_len"):
        llm.generate([[5] * 300])
    with pytest.raises(InvalidRequestError, match="token ids"):
        llm.generate([[5, 10**6]])
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate([[]])
    # max_tokens is clipped to the context
    o = llm.generate([[5] * 250], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert len(o.token_ids) == 6 and o.finish_reason == "length"
    # a prompt of the whole context gets its one token, never written (as vLLM)
    o = llm.generate([[5] * 256], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                 prompt_logprobs=0))[0]
    assert len(o.token_ids) == 1 and o.finish_reason == "length"
    assert len(o.prompt_token_logprobs) == 256


def test_request_that_can_never_fit_the_budgets(tiny_qwen3_moe):
    small = LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8, max_model_len=512,
                max_num_seqs=2, num_gpu_blocks=2, pinned_budget=0, host_budget=0)
    with pytest.raises(RequestTooLargeError, match="never fit"):
        small.generate([[5] * 100], SamplingParams(max_tokens=10))
    assert small.stats()["kv.bytes_written.G"] == 0  # refused before anything was written
    assert len(small.generate([[5] * 9], SamplingParams(max_tokens=5, ignore_eos=True))[0].token_ids) == 5


@pytest.mark.parametrize("overlapped", ["0", "1"])
def test_a_request_that_fills_the_budgets_exactly_runs(tiny_qwen3_moe, monkeypatch, overlapped):
    """The last sampled token is never written: prompt 8 + 8 new tokens store 15, one sealed
    block of 8 and 7 in the W tail -- it fits one block, also with overlapped decode steps;
    a token more does not."""
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", overlapped)
    kw = dict(dtype="float32", device="cpu", block_size=8, max_model_len=64, max_num_seqs=1,
              kv_policy="transfer")
    one = LLM(str(tiny_qwen3_moe), num_gpu_blocks=1, pinned_budget=0, host_budget=0, **kw)
    wide = LLM(str(tiny_qwen3_moe), num_gpu_blocks=16, **kw)
    prompt = list(range(10, 18))
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    assert one.generate([prompt], sp)[0].token_ids == wide.generate([prompt], sp)[0].token_ids
    assert one.stats()["kv.peak_blocks.G"] == 1 and not one.engine.has_unfinished_requests()
    with pytest.raises(RequestTooLargeError, match="never fit"):
        one.generate([prompt], SamplingParams(max_tokens=9))


def test_abort_frees_kv_at_once(llm):
    eng = llm.engine
    eng.add_request("x", [3] * 40, SamplingParams(max_tokens=50, ignore_eos=True))
    eng.add_request("y", [4] * 20, SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(8):
        eng.step()
    assert eng.stats()["kv.blocks.W"] == 2
    eng.abort_request("x")
    assert eng.stats()["kv.blocks.W"] == 1
    eng.abort_request("y")
    eng.abort_request("unknown")
    s = eng.stats()
    assert all(s[f"kv.blocks.{r}"] == 0 for r in "GTCW") and not eng.has_unfinished_requests()


def test_more_requests_than_batch_slots_all_finish(llm):
    prompts = [[7 + i] * (3 + 5 * i) for i in range(20)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [6] * 20
    assert llm.stats()["kv.bytes_moved_after_placement"] == 0


def test_queue_time_is_the_wait_for_a_batch_slot(tiny_qwen3_moe):
    """``RequestOutput.queue_time_s`` (vLLM's time_in_queue): from the request's arrival to
    its admission into the running batch; with one slot, the second request waits for the
    first to finish."""
    from writescope.engine.engine import LLMEngine
    eng = LLMEngine(str(tiny_qwen3_moe), dtype="float32", device="cpu", max_model_len=64,
                    max_num_seqs=1)
    p = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    eng.add_request("a", [5, 6, 7], p)
    eng.add_request("b", [5, 6, 8], p)
    t0 = time.monotonic()
    first_b = None
    seen = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            seen.setdefault(o.request_id, o.queue_time_s)
            if o.request_id == "a" and o.finished:
                a_done = time.monotonic() - t0
            if o.request_id == "b" and first_b is None:
                first_b = o
    assert seen["a"] is not None and seen["a"] < a_done
    assert first_b.queue_time_s >= a_done * 0.5 and first_b.queue_time_s > seen["a"]


def test_cli_generate(tmp_path, tiny_qwen3_moe):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps("there") + "\n")
    out = tmp_path / "o.jsonl"
    r = subprocess.run([sys.executable, "-m", "writescope.cli", "generate", "--model", str(tiny_qwen3_moe),
                        "--prompts-file", str(prompts), "--max-tokens", "4", "--dtype", "float32",
                        "--device", "cpu", "--output", str(out), "--logprobs", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["hi", "there"]
    assert "tokens/s" in r.stderr and "moved after placement 0 B" in r.stderr
    for row in rows:  # greedy: each token leads its two alternatives
        assert len(row["logprobs"]) == len(row["top_logprobs"]) == len(row["token_ids"]) == 4
        for t, lp, top in zip(row["token_ids"], row["logprobs"], row["top_logprobs"]):
            assert len(top) == 2 and top[0][0] == t and abs(top[0][1] - lp) < 1e-6


def test_cli_generate_reads_prompts_from_standard_input(tmp_path, tiny_qwen3_moe):
    out = tmp_path / "o.jsonl"
    r = subprocess.run([sys.executable, "-m", "writescope.cli", "generate", "--model",
                        str(tiny_qwen3_moe), "--prompts-file", "-", "--max-tokens", "2",
                        "--dtype", "float32", "--device", "cpu", "--output", str(out)],
                       input=json.dumps({"prompt": "hi"}) + "\n" + json.dumps([5, 6]) + "\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["prompt"] == "hi" and rows[1]["prompt_token_ids"] == [5, 6]


def test_cli_generate_samples_each_prompt_from_its_own_seed(tmp_path, tiny_qwen3_moe):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps("the") + "\n" for _ in range(3)))

    def gen(seed):
        out = tmp_path / f"o{seed}.jsonl"
        r = subprocess.run([sys.executable, "-m", "writescope.cli", "generate", "--model",
                            str(tiny_qwen3_moe), "--prompts-file", str(prompts), "--temperature",
                            "1", "--max-tokens", "8", "--ignore-eos", "--dtype", "float32",
                            "--device", "cpu", "--seed", str(seed), "--output", str(out)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]
    a = gen(7)
    assert len({tuple(t) for t in a}) == 3  # equal prompts, different samples
    assert gen(7) == a  # and the same ones again from the same seed


def test_cli_generate_stop_and_ignore_eos(tmp_path, tiny_qwen3_moe):
    def gen(*extra):
        out = tmp_path / "o.jsonl"
        r = subprocess.run([sys.executable, "-m", "writescope.cli", "generate", "--model",
                            str(tiny_qwen3_moe), "--prompt", "the", "--max-tokens", "12",
                            "--ignore-eos", "--dtype", "float32", "--device", "cpu", "--output",
                            str(out), *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(out.read_text().splitlines()[0])
    whole = gen()
    assert len(whole["token_ids"]) == 12 and len(whole["text"]) > 4
    stop = whole["text"][2:4]
    cut = gen("--stop", stop, "zzzz")
    assert cut["text"] == whole["text"][:whole["text"].find(stop)]


def test_cli_errors_are_clear(tmp_path):
    r = subprocess.run([sys.executable, "-m", "writescope.cli", "generate", "--model", str(tmp_path / "none"),
                        "--prompt", "x"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "error:" in r.stderr and "Traceback" not in r.stderr
    base = [sys.executable, "-m", "writescope.cli", "generate", "--prompt", "x", "--chat"]
    r = subprocess.run(base + ["--chat-template-kwargs", "[1]"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "must be a JSON object" in r.stderr
    r = subprocess.run(base[:-1] + ["--chat-template-kwargs", "{}"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "needs --chat" in r.stderr and "Traceback" not in r.stderr
    # refused before the weights load (no "loading" progress bar)
    for extra, msg in ((["--kv-policy", "bogus"], "unknown kv_policy 'bogus'"),
                       (["--kv-cache-memory", "lots"], "--kv-cache-memory: cannot read 'lots'"),
                       (["--vram-budget", "12XB"], "--vram-budget: cannot read"),
                       (["--gpu-memory-utilization", "1.5"], "must be a fraction in (0, 1]"),
                       (["--gpu-memory-utilization", "0.5", "--vram-budget", "2GiB"],
                        "not both")):
        r = subprocess.run(base[:-1] + extra, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and msg in r.stderr, r.stderr
        assert "loading" not in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(base[:-2] + ["", "--device", "cpu"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "the prompt is empty" in r.stderr and "loading" not in r.stderr
    # a folder where a file goes, an unknown device: one line, and --output before the weights
    for extra, msg in ((["--output", str(tmp_path)], "is a folder"),
                       (["--output", str(tmp_path / "no" / "o.jsonl")], "no folder"),
                       (["--device", "tpu"], "device must be 'cuda' or 'cpu', got 'tpu'")):
        r = subprocess.run(base[:-1] + extra, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and msg in r.stderr, r.stderr
        assert "loading" not in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(base[:-3] + ["--prompts-file", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Is a directory" in r.stderr and "Traceback" not in r.stderr


def test_cli_generate_default_model_fresh_cache(tmp_path):
    import os
    env = dict(os.environ, WRITESCOPE_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "writescope.cli", "generate", "--prompt", "hello",
                        "--max-tokens", "4", "--device", "cpu"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "tokens/s" in r.stderr
    assert "| KV: G " in r.stderr  # where the experts and the KV regions were placed


def test_vllm_memory_and_eager_options(tiny_qwen3_moe, monkeypatch):
    """vLLM's ``gpu_memory_utilization`` (the budget as a fraction of the device's memory; on
    the CPU device, of host memory) and ``enforce_eager`` (no CUDA graphs), in the API and the
    CLI; a bad fraction, or one given with ``vram_budget``, is refused."""
    import argparse
    from writescope import LLM, SamplingParams
    from writescope.commands.common import add_engine_args, engine_kwargs
    from writescope.hostmem import ram_bytes
    kw = dict(dtype="float32", device="cpu", max_model_len=256, max_num_seqs=2)
    llm = LLM(str(tiny_qwen3_moe), gpu_memory_utilization=0.05, **kw)
    assert llm.engine.vram_budget == int(ram_bytes() * 0.05)
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="must be a fraction"):
            LLM(str(tiny_qwen3_moe), gpu_memory_utilization=bad, **kw)
    with pytest.raises(ValueError, match="not both"):
        LLM(str(tiny_qwen3_moe), gpu_memory_utilization=0.5, vram_budget="1GiB", **kw)
    # the piecewise decode runs on the CPU with WRITESCOPE_CUDA_GRAPHS=pieces; enforce_eager
    # turns it off for this engine alone, with the same tokens
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    greedy = SamplingParams(max_tokens=6, temperature=0)
    pieces = LLM(str(tiny_qwen3_moe), **kw)
    eager = LLM(str(tiny_qwen3_moe), enforce_eager=True, **kw)
    assert pieces.engine.runner.graphs.mode == "pieces"
    assert eager.engine.runner.graphs.mode == "off" and eager.engine.stats()["graphs.mode"] == "off"
    a = pieces.generate(["Tell me a story"], greedy)[0].outputs[0].token_ids
    b = eager.generate(["Tell me a story"], greedy)[0].outputs[0].token_ids
    assert a == b
    assert pieces.engine.runner.graphs.wants(1) and not eager.engine.runner.graphs.wants(1)
    p = argparse.ArgumentParser()
    add_engine_args(p)
    got = engine_kwargs(p.parse_args(["--gpu-memory-utilization", "0.8", "--enforce-eager"]))
    assert got["gpu_memory_utilization"] == 0.8 and got["enforce_eager"] is True
    assert engine_kwargs(p.parse_args([]))["enforce_eager"] is False


def test_an_eager_engine_plans_with_eager_launches(tiny_qwen3_moe, monkeypatch):
    """enforce_eager (or WRITESCOPE_CUDA_GRAPHS off or pieces) replays no decode step as a CUDA
    graph, so the engine's roofline charges an all-resident step's kernels eager launches, not
    the profile's graph kernel cost."""
    from pathlib import Path
    from writescope.planner.roofline import StepLoad, predict_step
    h200 = str(Path(__file__).resolve().parents[1] / "bench" / "profiles" / "h200.json")
    kw = dict(dtype="float32", device="cpu", max_model_len=256, max_num_seqs=2, profile=h200)
    graphed = LLM(str(tiny_qwen3_moe), **kw).engine
    eager = LLM(str(tiny_qwen3_moe), enforce_eager=True, **kw).engine
    assert graphed.profile.graph_launch_s is not None and eager.profile.graph_launch_s is None
    assert eager.profile.launch_s == graphed.profile.launch_s
    load = StepLoad(2, 2048.0, 0.0, 0.0, 0.0)  # every token resident: a graphed step on a GPU
    step = {e: predict_step(e.profile, e.config, load, False).step_s for e in (graphed, eager)}
    assert step[eager] > step[graphed]
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    assert LLM(str(tiny_qwen3_moe), **kw).engine.profile.graph_launch_s is None


def test_weights_larger_than_host_memory_are_refused_before_loading(tiny_qwen3_moe, monkeypatch):
    from writescope import hostmem
    monkeypatch.setattr(hostmem, "available_ram_bytes", lambda: 1024)
    with pytest.raises(MemoryError, match="GiB of weights in host memory"):
        LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", experts="cpu")


def test_a_step_whose_attention_fails_at_its_end_is_rolled_back(tiny_deepseek_v2):
    """A CPU-side failure reported when the step ends (how the GPU's device-side wait surfaces
    it) leaves the cache as before the step: the engine raises, and the next steps finish the
    requests with the same tokens and every block given back."""
    from test_parity import GREEDY, PLACEMENTS, engine, finish_like, prompt_ids
    prompts = [prompt_ids(320, n, seed=n) for n in (20, 90)]
    want = engine(tiny_deepseek_v2, **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    llm = engine(tiny_deepseek_v2, **PLACEMENTS["mixed"])
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, GREEDY)
    for _ in range(12):
        eng.step()
    hybrid = eng.cache.hybrid
    real_end = hybrid.end_step
    live = eng.cache.live_blocks()

    def failing_end():
        real_end()
        raise RuntimeError("injected: a CPU attention job failed")
    hybrid.end_step = failing_end
    with pytest.raises(RuntimeError, match="injected"):
        eng.step()
    hybrid.end_step = real_end
    assert eng.cache.live_blocks() == live
    finish_like(eng, want)


@pytest.mark.parametrize("policy", ["static", "writescope", "migrate"])
def test_synthetic_prefill_places_like_a_real_one(tiny_qwen3_moe, policy):
    """prefill_synthetic writes random KV for all but each prompt's last token to the homes a
    real prefill would choose (same policy, same chunks); the next step samples the first token
    from the last prompt token, and decoding goes on."""
    def engine():
        return LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8,
                   max_model_len=256, max_num_seqs=4, num_gpu_blocks=4, kv_policy=policy,
                   cpu_share=0.5, max_num_batched_tokens=32).engine

    prompts = {"a": [5] * 70, "b": [7] * 45}
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    real, syn = engine(), engine()
    for eng in (real, syn):
        for rid, p in prompts.items():
            eng.add_request(rid, p, sp)
    assert syn.prefill_synthetic(seed=1) == 69 + 44
    assert real.num_waiting == 2 and syn.num_waiting == 0
    while any(r.is_prefilling for r in real.requests.values()) or real.num_waiting:
        real.step()
    for rid in prompts:
        a, b = real.requests[rid], syn.requests[rid]
        assert b.num_computed == len(prompts[rid]) - 1
        # the real engine has processed every prompt token (and decoded a few meanwhile)
        ta, tb = real.cache.seqs[a.seq_id], syn.cache.seqs[b.seq_id]
        n = tb.num_sealed
        assert n > 0 and ta.regions()[:n] == tb.regions()
    if policy == "static":  # G, and its share of the spilled blocks in C, the rest in T
        assert {r for rid in prompts
                for r in syn.cache.seqs[syn.requests[rid].seq_id].regions()} == set("GTC")
    outs = syn.step()  # each prompt's last token: the first output tokens
    assert sorted(o.request_id for o in outs) == ["a", "b"]
    while syn.has_unfinished_requests():
        syn.step()
    s = syn.stats()
    assert s["engine.synthetic_prefill_tokens"] == 113 and s["kv.bytes_moved_after_placement"] == 0


def test_a_step_reports_the_cpu_experts_bytes_it_read(tiny_qwen3_moe):
    """With the routed experts on the CPU, every step's timing carries the expert bytes its CPU
    calls read (distinct experts per layer): between one expert per MoE layer and all of them."""
    llm = LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", experts="cpu",
              max_model_len=128)
    eng = llm.engine
    eng.add_request("a", [5, 6, 7, 8], SamplingParams(max_tokens=3, ignore_eos=True))
    eng.step()
    cfg = eng.config
    layers = [m for m in eng.model.modules() if getattr(m, "cpu_experts", None) is not None]
    per_expert = layers[0].cpu_experts.expert_bytes
    got = eng.cache.last_timing["cpu_expert_bytes"]
    assert len(layers) * per_expert <= got <= len(layers) * cfg.num_experts * per_expert
    eng.step()  # a decode step: one token, top-k experts per layer
    got = eng.cache.last_timing["cpu_expert_bytes"]
    assert len(layers) * per_expert <= got <= len(layers) * cfg.num_experts_per_tok * per_expert


def test_a_gpu_host_s_cpu_teams_leave_the_launching_thread_its_cores(monkeypatch):
    """On a 16-core GPU host the engine's CPU attention team takes 15 threads (one core left to
    the launching thread: 15 attended the hybrid steps 0.94-0.99x as long as 14 in seven of eight
    pairs, bench/results/2026-12-04d-h200) and so does the experts' team (15 ran issue 6's
    batch-1 row 3-6% faster than 14, bench/results/2026-12-06f-h100); below 8 cores nothing is
    kept back; an explicit experts' thread count in the environment wins."""
    from writescope.attention import cpu as cpu_attn
    from writescope.engine import cores as core_rules
    from writescope.layers import cpu_experts
    monkeypatch.delenv("WRITESCOPE_CPU_EXPERT_THREADS", raising=False)
    monkeypatch.delenv("WRITESCOPE_CPU_ATTN_THREADS", raising=False)
    before_experts, before_attn = cpu_experts.num_threads_setting(), cpu_attn.num_threads_setting()
    cpu_attn.set_num_threads(None)
    try:
        for cores, attn, experts in [(16, 15, 15), (10, 9, 9), (4, 4, None)]:
            monkeypatch.setattr(cpu_attn, "_usable_cores", lambda c=cores: c)
            cpu_attn.reserve_cores(0)
            cpu_experts.set_num_threads(None)
            core_rules.reserve_launch_core()
            assert cpu_attn.get_num_threads() == attn
            assert cpu_experts.num_threads_setting() == experts
        monkeypatch.setattr(cpu_attn, "_usable_cores", lambda: 16)
        monkeypatch.setenv("WRITESCOPE_CPU_EXPERT_THREADS", "3")
        cpu_experts.set_num_threads(None)
        core_rules.reserve_launch_core()
        assert cpu_experts.num_threads_setting() is None  # the environment's count is read by the kernel
    finally:
        cpu_attn.reserve_cores(0)
        cpu_attn.set_num_threads(before_attn)
        cpu_experts.set_num_threads(before_experts)


def test_n_completions_per_prompt(llm):
    """``SamplingParams.n``: one RequestOutput per prompt with n ``outputs`` (vLLM's shape);
    seeded, completion j draws with seed + j, so a run repeats and the completions differ."""
    sp = SamplingParams(temperature=1.0, seed=11, n=3, max_tokens=8, ignore_eos=True, logprobs=0)
    a = llm.generate([[5, 6, 7], "hello"], sp)
    b = llm.generate([[5, 6, 7], "hello"], sp)
    assert len(a) == 2 and all(len(o.outputs) == 3 for o in a)
    assert [[c.token_ids for c in o.outputs] for o in a] == [[c.token_ids for c in o.outputs]
                                                            for o in b]
    first = a[0].outputs
    assert [c.index for c in first] == [0, 1, 2] and len({tuple(c.token_ids) for c in first}) > 1
    assert a[0].token_ids == first[0].token_ids and a[0].finished
    single = llm.generate([5, 6, 7], SamplingParams(temperature=1.0, seed=12, max_tokens=8,
                                                    ignore_eos=True, logprobs=0))[0]
    assert single.outputs[0].token_ids == first[1].token_ids  # seed 11 + 1
    assert single.outputs[0].cumulative_logprob == pytest.approx(sum(single.logprobs))
    # LLMEngine.add_request takes n too: tests/test_parallel_sampling.py


def test_a_bad_prompt_leaves_none_of_the_call_queued(llm):
    with pytest.raises(InvalidRequestError):
        llm.generate([[5, 6], [10 ** 9]], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests()


def test_chat_renders_the_template(default_model_dir):
    llm = LLM(str(default_model_dir), dtype="float32", device="cpu", max_model_len=256)
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    sp = SamplingParams(temperature=0, max_tokens=6)
    (got,) = llm.chat(conv, sp)
    (want,) = llm.generate([llm.tokenizer.apply_chat_template(conv)], sp)
    assert got.token_ids == want.token_ids and got.prompt_token_ids == want.prompt_token_ids
    assert got.prompt == llm.tokenizer.render_chat(conv)  # the rendered text, as vLLM's
    assert "What is the capital of France?" in got.prompt
    assert len(llm.chat([conv, conv], sp)) == 2


def test_prefix_caching_on_off_and_never_with_migrate(tiny_qwen3_moe, llm):
    import argparse
    from writescope.commands.common import add_engine_args, engine_kwargs
    ids = list(range(3, 43))  # 40 tokens: 5 blocks of 8, the last recomputed for its logits
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    s0 = llm.stats()  # (the fixture's engine is shared with other tests)
    a = llm.generate([ids], greedy)[0]
    b = llm.generate([ids], greedy)[0]
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 32) and a.token_ids == b.token_ids
    whole = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert whole.num_cached_tokens == 0  # its prompt's log-probabilities need every token
    s = llm.stats()
    assert s["prefix.hit_tokens"] - s0["prefix.hit_tokens"] == 32
    assert s["prefix.queried_tokens"] - s0["prefix.queried_tokens"] == 120
    # reset: the cache forgets every block (and the answer stays the same); not while a
    # request is in the engine
    llm.engine.add_request("waiting", ids, greedy)
    assert llm.reset_prefix_cache() is False
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert llm.reset_prefix_cache() is True
    s = llm.stats()
    assert s["prefix.registered_blocks"] == 0
    assert all(s[f"prefix.unused_blocks.{r}"] == 0 for r in "GTC")
    c = llm.generate([ids], greedy)[0]
    assert c.num_cached_tokens == 0 and c.token_ids == a.token_ids
    off = LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8,
              max_model_len=256, enable_prefix_caching=False)
    assert off.reset_prefix_cache() is True  # nothing to forget
    off.generate([ids], greedy)
    assert off.generate([ids], greedy)[0].num_cached_tokens == 0
    assert "prefix.hit_tokens" not in off.stats()
    mig = LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8,
              max_model_len=256, kv_policy="migrate")
    assert mig.engine.cache.prefix is None  # it moves blocks that sequences would share
    mig.engine.set_kv_policy("static")
    assert mig.engine.cache.prefix is not None
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_kwargs(p.parse_args([]))["enable_prefix_caching"] is True
    assert engine_kwargs(p.parse_args(["--no-enable-prefix-caching"]))["enable_prefix_caching"] \
        is False
