"""vLLM's ``cache_salt`` (a prompt dict's; the server's request field): prompt blocks cached
under a salt are found only by prompts of the same salt -- also the blocks a salted sequence
writes past its prompt -- and the tokens are the same either way."""
import pytest

from writescope import LLM, SamplingParams
from writescope.core import InvalidRequestError

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8,
               max_model_len=256)


def test_salted_prompts_share_cached_blocks_only_within_their_salt(llm):
    ids = list(range(100, 140))  # 5 blocks of 8; the last is recomputed for its logits
    plain = llm.generate([ids], GREEDY)[0]

    def salted(salt):
        return llm.generate([{"prompt_token_ids": ids, "cache_salt": salt}], GREEDY)[0]
    a = salted("tenant-a")
    b = salted("tenant-b")
    a2 = salted("tenant-a")
    again = llm.generate([ids], GREEDY)[0]
    assert (plain.num_cached_tokens, a.num_cached_tokens, b.num_cached_tokens) == (0, 0, 0)
    assert (a2.num_cached_tokens, again.num_cached_tokens) == (32, 32)
    assert plain.token_ids == a.token_ids == b.token_ids == a2.token_ids == again.token_ids


def test_blocks_written_past_a_salted_prompt_keep_its_salt(llm):
    """A prompt shorter than a block: every block it seals is named from the salt's root."""
    short = list(range(150, 155))
    gen = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": short, "cache_salt": "s"}], gen)[0]
    longer = short + first.token_ids[:19]  # 24 tokens: the three blocks the first sealed
    salted = llm.generate([{"prompt_token_ids": longer, "cache_salt": "s"}], GREEDY)[0]
    other = llm.generate([{"prompt_token_ids": longer, "cache_salt": "t"}], GREEDY)[0]
    assert salted.num_cached_tokens == 16 and other.num_cached_tokens == 0
    assert salted.token_ids == other.token_ids


def test_a_salt_is_a_non_empty_string(llm):
    for bad in ("", 7):
        with pytest.raises(InvalidRequestError, match="cache_salt"):
            llm.llm_engine.add_request("bad-salt", {"prompt": "hi", "cache_salt": bad}, GREEDY)
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate([{"prompt": "hi", "cache_salt": ""}], GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()
