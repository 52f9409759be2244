"""``writescope chat``: each streamed answer is what ``LLM.chat`` answers to the same conversation;
later turns find the earlier turns' KV in the prefix cache; commands, context overflow."""
from __future__ import annotations

import io
import re
import signal

import pytest

from writescope import LLM, SamplingParams
from writescope.cli import main
from writescope.commands.chat import Chat

GREEDY = ["--temperature", "0", "--max-tokens", "12", "--block-size", "16"]


def chat(monkeypatch, capsys, model, lines, *extra) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))
    rc = main(["chat", "--model", str(model), *GREEDY, *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(scope="module")
def oracle(default_model_dir):
    return LLM(str(default_model_dir), block_size=16)


def answers(oracle, turns, system=None):
    """``LLM.chat``'s greedy answer to each turn, the conversation growing by its answers."""
    p = SamplingParams(temperature=0, max_tokens=12)
    msgs = [{"role": "system", "content": system}] if system else []
    out = []
    for t in turns:
        msgs.append({"role": "user", "content": t})
        text = oracle.chat(msgs, p)[0].text
        msgs.append({"role": "assistant", "content": text})
        out.append(text)
    return out


def test_turns_stream_llm_chats_answers_and_reuse_the_cache(monkeypatch, capsys,
                                                            default_model_dir, oracle):
    turns = ["Hello there, how are you today?", "Tell me more about it", "And then?"]
    rc, out, err = chat(monkeypatch, capsys, default_model_dir, turns + ["/exit"])
    assert rc == 0
    assert out == "".join(a + "\n" for a in answers(oracle, turns))
    figures = re.findall(r"\[(\d+) tokens, first after \d+ ms \((\d+) of (\d+) prompt tokens "
                         r"cached\)", err)
    assert len(figures) == 3
    cached = [int(c) for _, c, _ in figures]
    prompt = [int(p) for _, _, p in figures]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1]
    assert prompt[0] < prompt[1] < prompt[2]


def test_reset_system_and_continued_lines(monkeypatch, capsys, default_model_dir, oracle):
    lines = ["Hello there", "/reset", "Hello \\", "there", "/system You are terse.", "Hi",
             "/nope", "/help", "", "Hi again"]
    rc, out, err = chat(monkeypatch, capsys, default_model_dir, lines)  # ends at EOF
    assert rc == 0
    a = answers(oracle, ["Hello there"])
    b = answers(oracle, ["Hello \nthere"])
    c = answers(oracle, ["Hi", "Hi again"], system="You are terse.")
    assert out == "".join(x + "\n" for x in a + b + c)
    assert "[conversation forgotten]" in err and "[system prompt set" in err
    assert "unknown command /nope" in err and "/reset" in err  # /help's list


def test_a_conversation_past_the_context_is_refused_and_not_kept(monkeypatch, capsys,
                                                                 default_model_dir, oracle):
    long = "word " * 200
    rc, out, err = chat(monkeypatch, capsys, default_model_dir, [long, "Hi"],
                        "--max-model-len", "128", "--no-stats")
    assert rc == 0
    assert "a shorter message may fit" in err  # nothing earlier to drop
    assert out == "".join(x + "\n" for x in answers(oracle, ["Hi"]))  # the long turn not kept


def test_ctrl_c_stops_an_answer_between_steps_and_keeps_what_was_written(default_model_dir,
                                                                        oracle):
    llm = LLM(str(default_model_dir), block_size=16)
    step, calls = llm.engine.step, []

    def step_then_interrupt():
        calls.append(1)
        if len(calls) == 4:  # Ctrl-C arrives while the fourth step runs
            signal.raise_signal(signal.SIGINT)
        return step()

    llm.engine.step = step_then_interrupt
    chat = Chat(llm, SamplingParams(temperature=0, max_tokens=12), None, None)
    out, err = io.StringIO(), io.StringIO()
    figures = chat.answer("Hello there", out, err)
    full = answers(oracle, ["Hello there"])[0]
    assert "[stopped]" in err.getvalue()
    assert 0 < figures["tokens"] < 12 and len(calls) == 4
    said = out.getvalue()[:-1]
    assert full.startswith(said) and len(said) < len(full)
    assert chat.messages[-1] == {"role": "assistant", "content": said}
    assert not llm.engine.has_unfinished_requests()
    llm.engine.step = step
    assert chat.answer("Go on", io.StringIO(), io.StringIO())["tokens"] == 12
