"""``writescope chat`` as a terminal user meets it: bytes that are not UTF-8, the end of the
context reached mid-answer or before a turn (the oldest exchanges dropped), where ``[stopped]``
lands, Ctrl-C at any moment of a turn, and line editing on a real terminal."""
from __future__ import annotations

import io
import os
import pty
import select
import signal
import sys
import time

import pytest

from writescope import LLM, SamplingParams
from writescope.cli import main
from writescope.commands.chat import Chat

GREEDY = ["--temperature", "0", "--max-tokens", "6", "--block-size", "16", "--no-stats"]


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])
def test_bytes_that_are_not_utf8_are_replaced_not_the_end_of_the_chat(monkeypatch, capsys,
                                                                    default_model_dir, errors):
    # strict (a UTF-8 locale) ended the chat with "error: 'utf-8' codec can't decode";
    # surrogateescape (a C locale) with the tokenizer's TypeError traceback
    raw = io.BytesIO("Hi \xff\xfe there\nHello\n".encode("latin-1"))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(raw, encoding="utf-8", errors=errors))
    rc = main(["chat", "--model", str(default_model_dir), *GREEDY])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("\n") == 2  # both messages answered


def test_system_without_text_says_the_system_prompt_is_gone(monkeypatch, capsys,
                                                           default_model_dir):
    monkeypatch.setattr("sys.stdin", io.StringIO("/system Be brief.\n/system\n"))
    assert main(["chat", "--model", str(default_model_dir), *GREEDY]) == 0
    err = capsys.readouterr().err
    assert "[system prompt set," in err and "[system prompt removed," in err


@pytest.fixture(scope="module")
def llm(default_model_dir):
    return LLM(str(default_model_dir), block_size=16, max_model_len=40)


def test_an_answer_cut_by_the_context_says_so(llm):
    chat = Chat(llm, SamplingParams(temperature=0, max_tokens=100), None, None)
    out, err = io.StringIO(), io.StringIO()
    f = chat.answer("Hello there", out, err)
    assert f["prompt_tokens"] + f["tokens"] == 40
    assert "end of the context (max_model_len 40)" in err.getvalue()
    chat.reset()  # an answer cut by --max-tokens is not the context's doing
    err = io.StringIO()
    chat.params = SamplingParams(temperature=0, max_tokens=3)
    chat.answer("Hello there", io.StringIO(), err)
    assert "context" not in err.getvalue()


def test_stopped_comes_after_the_answers_newline(llm):
    step, calls = llm.engine.step, []

    def step_then_interrupt():
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGINT)
        return step()

    llm.engine.step = step_then_interrupt
    try:
        chat = Chat(llm, SamplingParams(temperature=0, max_tokens=12), None, None)
        term = io.StringIO()  # stdout and stderr on one terminal
        chat.answer("Hello there", term, term)
    finally:
        llm.engine.step = step
    text = term.getvalue()
    assert text.endswith("\n[stopped]\n") and not text.endswith("\n\n[stopped]\n")


def _drive(model: str, keys: list[bytes], until: bytes, timeout: float = 120.0) -> bytes:
    """Runs ``writescope chat`` on a pseudo-terminal, types ``keys`` one after another at each
    prompt, and returns everything the terminal showed once ``until`` shows (or it exits)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(sys.executable, [sys.executable, "-m", "writescope", "chat", "--model", model,
                                   *GREEDY])
    seen, end, keys = b"", time.time() + timeout, list(keys)
    prompts = 0
    try:
        while time.time() < end and until not in seen:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                seen += data
            if keys and seen.count(b"> ") > prompts:
                prompts += 1
                os.write(fd, keys.pop(0))
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    return seen


def test_arrow_keys_edit_the_line_on_a_terminal(default_model_dir):
    # left arrow, then "e": the line reads /noep; without line editing the escape code itself
    # was in the message ("/nop\x1b[De")
    seen = _drive(str(default_model_dir), [b"/nop\x1b[De\r"], b"/help lists them")
    assert b"unknown command /noep;" in seen


@pytest.fixture(scope="module")
def llm64(default_model_dir):
    return LLM(str(default_model_dir), block_size=16, max_model_len=64)


TURNS = ["Hello there", "Tell me more", "And then?", "Why?"]


def test_a_full_context_drops_the_oldest_exchanges_and_answers_the_rest(llm64):
    """llama.cpp's context shift, on the conversation: the turn that would not leave room for
    --max-tokens drops the oldest exchanges (the system prompt stays), says so, and answers
    what LLM.chat answers to the shortened conversation."""
    p = SamplingParams(temperature=0, max_tokens=8)
    chat = Chat(llm64, p, "Be brief.", None)
    errs = []
    for t in TURNS:
        err = io.StringIO()
        out = io.StringIO()
        f = chat.answer(t, out, err)
        errs.append(err.getvalue())
        assert f is not None and f["prompt_tokens"] + 8 <= 64
        asked = chat.conversation()[:-1]
        assert out.getvalue() == llm64.chat(asked, p, use_tqdm=False)[0].text + "\n"
    assert "the 2 oldest messages are dropped" in "".join(errs)
    assert chat.conversation()[0] == {"role": "system", "content": "Be brief."}
    assert [m["role"] for m in chat.messages] == ["user", "assistant"] * (len(chat.messages) // 2)


def test_without_context_shift_the_turn_is_refused_and_the_rest_kept(llm64):
    p = SamplingParams(temperature=0, max_tokens=40)  # past the context from the second turn
    chat = Chat(llm64, p, None, None, context_shift=False)
    chat.answer(TURNS[0], io.StringIO(), io.StringIO())
    kept = list(chat.messages)
    err = io.StringIO()
    assert chat.answer("x " * 40, io.StringIO(), err) is None
    assert "/reset starts a new conversation" in err.getvalue()
    assert chat.messages == kept


def test_ctrl_c_while_the_turn_is_prepared_stops_it_and_the_chat_goes_on(llm64, monkeypatch):
    tok = llm64.tokenizer
    render = tok.apply_chat_template

    def render_then_interrupt(*a, **kw):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C as the conversation is rendered
        return render(*a, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", render_then_interrupt)
    chat = Chat(llm64, SamplingParams(temperature=0, max_tokens=8), None, None)
    err = io.StringIO()
    f = chat.answer("Hello there", io.StringIO(), err)
    assert f is not None and f["tokens"] == 0 and "[stopped]" in err.getvalue()
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]
    assert not llm64.engine.has_unfinished_requests()
