"""What the docs say about today's features, checked where they had it wrong: the help of
``--no-context-shift`` said ``(default: True)`` (the store_false flag's default, read as the
refusal being on by default), and such a turn is answered in the room left, not refused."""
from __future__ import annotations

import pytest

from writescope.cli import build_parser


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_no_context_shift_help_names_no_default(capsys):
    text = _help("chat", capsys)
    start = text.index("--no-context-shift ", text.index("options:"))
    entry = text[start:text.index("model and engine:")]
    assert "(default: True)" not in entry, entry


def test_without_context_shift_a_turn_short_of_room_answers_in_what_is_left(default_model_dir):
    """README and the chat's docstring: with ``--no-context-shift`` nothing is dropped; a turn
    whose prompt fits but leaves less than --max-tokens of room is answered, cut at the end of
    the context (and says so), not refused."""
    import io

    from writescope import LLM, SamplingParams
    from writescope.commands.chat import Chat

    llm = LLM(str(default_model_dir), block_size=16, max_model_len=64)
    chat = Chat(llm, SamplingParams(temperature=0, max_tokens=20), None, None,
                context_shift=False)
    assert chat.answer("Hello there", io.StringIO(), io.StringIO()) is not None
    err = io.StringIO()
    ids = llm.tokenizer.apply_chat_template(chat.conversation() + [
        {"role": "user", "content": "Why?"}], add_generation_prompt=True)
    assert len(ids) < 64 < len(ids) + 20  # fits, but without --max-tokens of room
    f = chat.answer("Why?", io.StringIO(), err)
    assert f is not None and f["prompt_tokens"] == len(ids) and len(chat.messages) == 4
    assert "reached the end of the context" in err.getvalue()
