"""writescope.models.tokenizer: loading, chat template, stop ids, streaming detokenisation."""
from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ENDOFTEXT_ID, IM_END_ID, IM_START_ID, TINY_VOCAB
from writescope.models.default import CHAT_TEMPLATE, write_tokenizer_files
from writescope.models.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerError

HYP = settings(max_examples=150, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A tokenizer-only folder (no config.json) with a generation_config.json."""
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(d, vocab_size=TINY_VOCAB)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END_ID, ENDOFTEXT_ID]}))
    return d


@pytest.fixture(scope="module")
def tok(tok_dir):
    return Tokenizer.from_pretrained(tok_dir)


@pytest.fixture(scope="module")
def byte_ids(tok):
    """byte value -> the id of its single-byte token (byte-level BPE keeps all 256)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    ids = [tok.hf.convert_tokens_to_ids(table[b]) for b in range(256)]
    assert len(set(ids)) == 256
    return ids


def test_basics(tok):
    assert tok.vocab_size == TINY_VOCAB
    assert tok.eos_token_ids == (IM_END_ID, ENDOFTEXT_ID)
    assert tok.pad_token_id == ENDOFTEXT_ID
    ids = tok.encode("Hello world")
    assert ids and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == "Hello world"
    # special tokens are parsed as such and skipped on decode unless asked
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert ids[0] == IM_START_ID and ids[-1] == IM_END_ID
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<|im_end|>"


@given(text=st.text(max_size=60))
@HYP
def test_roundtrip(tok, text):
    if any(s in text for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
        return
    assert tok.decode(tok.encode(text)) == text


def test_chat_template(tok):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                         {"type": "text", "text": "there"}]}]
    text = tok.render_chat(msgs)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template(msgs)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids[0] == IM_START_ID and ids.count(IM_START_ID) == 3 and ids.count(IM_END_ID) == 2
    no_prompt = tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert tok.decode(no_prompt, skip_special_tokens=False).endswith("there<|im_end|>\n")
    assert tok.hf.chat_template == CHAT_TEMPLATE


def test_chat_template_options(tok):
    """continue_final_message leaves the last turn open (no end of turn after it); template
    variables reach the template; apply_chat_template's own names cannot be variables."""
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}]
    text = tok.render_chat(msgs, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nHello, I")
    with pytest.raises(TokenizerError, match="cannot both"):
        tok.render_chat(msgs, continue_final_message=True)
    with pytest.raises(TokenizerError, match="tokenize"):
        tok.render_chat(msgs, tokenize=True)
    saved = tok.hf.chat_template
    try:
        tok.hf.chat_template = "{{ greeting }} {{ messages[0]['content'] }}"
        assert tok.render_chat(msgs[:1], greeting="Hey") == "Hey Hi"
    finally:
        tok.hf.chat_template = saved


def test_no_chat_template_is_a_clear_error(tok_dir, tmp_path):
    d = tmp_path / "plain"
    shutil.copytree(tok_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = Tokenizer.from_pretrained(d)
    assert not t.has_chat_template
    with pytest.raises(TokenizerError, match="no chat template"):
        t.apply_chat_template([{"role": "user", "content": "hi"}])


def test_eos_from_config_json_without_generation_config(tok_dir, tmp_path):
    d = tmp_path / "cfg_only"
    shutil.copytree(tok_dir, d)
    (d / "generation_config.json").unlink()
    (d / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert Tokenizer.from_pretrained(d).eos_token_ids == (IM_END_ID, 7)


def test_load_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no checkpoint folder"):
        Tokenizer.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match="cannot load the tokenizer"):
        Tokenizer.from_pretrained(tmp_path / "empty")


# ---------------------------------------------------------------------------------- streaming
def _stream(tok, prompt, gen, skip=True):
    det = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    pieces = [det.add(i) for i in gen]
    tail = det.flush()
    return pieces, tail, det


#: ids drawn from the whole vocabulary, plus runs of single-byte tokens spelling multi-byte text
def _id_streams(byte_ids):
    any_id = st.integers(0, TINY_VOCAB - 1).map(lambda i: [i])
    utf8_chars = st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF,
                                                exclude_categories=("Cs",)), min_size=1, max_size=3)
    as_bytes = utf8_chars.map(lambda s: [byte_ids[b] for b in s.encode("utf-8")])
    raw_bytes = st.binary(min_size=1, max_size=4).map(lambda bs: [byte_ids[b] for b in bs])
    return st.lists(st.one_of(any_id, as_bytes, raw_bytes), max_size=25).map(
        lambda parts: [i for p in parts for i in p])


@pytest.mark.parametrize("skip", [True, False])
def test_incremental_equals_full_decode(tok, byte_ids, skip):
    @given(gen=_id_streams(byte_ids), prompt=st.sampled_from(["", "Hello", "Write a story: café"]))
    @HYP
    def check(gen, prompt):
        prompt_ids = tok.encode(prompt)
        pieces, tail, det = _stream(tok, prompt_ids, gen, skip)
        assert "".join(pieces) + tail == tok.decode(gen, skip_special_tokens=skip)
        assert det.text == "".join(pieces) + tail
        assert all(not p.endswith("\ufffd") for p in pieces)

    check()


def test_multibyte_text_streams_without_replacement_chars(tok, byte_ids):
    """Valid UTF-8 split into single-byte tokens: no piece ever holds U+FFFD, and each character
    comes out whole on the token that completes it."""
    @given(text=st.text(min_size=1, max_size=30).filter(lambda s: "\ufffd" not in s))
    @HYP
    def check(text):
        gen = [byte_ids[b] for b in text.encode("utf-8")]
        pieces, tail, _ = _stream(tok, tok.encode("Say:"), gen)
        assert tail == ""
        assert "".join(pieces) == text
        assert not any("\ufffd" in p for p in pieces)

    check()


def test_multibyte_split_example(tok, byte_ids):
    gen = [byte_ids[b] for b in "é🙂".encode("utf-8")]  # 2 + 4 bytes
    pieces, tail, _ = _stream(tok, [], gen)
    assert pieces == ["", "é", "", "", "", "🙂"] and tail == ""
    # an incomplete character at the end is held back until flush, which shows it as U+FFFD
    pieces, tail, _ = _stream(tok, [], gen[:4])
    assert pieces == ["", "é", "", ""] and tail == "\ufffd"


def test_natural_stream_matches_encode(tok):
    text = "The cache is split between 東京 and the GPU 🙂 — done."
    ids = tok.encode(text)
    pieces, tail, _ = _stream(tok, tok.encode("Q: "), ids)
    assert "".join(pieces) + tail == text


# ---------------------------------------------------------------------------------- sentencepiece-style
@pytest.fixture(scope="module")
def llama_style_tok(tmp_path_factory):
    """A Llama/Mixtral-style tokenizer.json (metaspace '▁', byte fallback <0xXX> tokens in the
    vocab, decoder Replace+ByteFallback+Fuse+Strip), trained locally on the default corpus."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    from writescope.models.default_corpus import CORPUS

    raw = RawTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False, limit_alphabet=100)
    raw.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)
    j = json.loads(raw.to_str())
    items = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = dict(items[:3])  # <unk> <s> </s>, then the 256 byte tokens, as in Llama's vocab
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({k: v + 256 for k, v in items[3:]})
    j["model"]["vocab"] = vocab
    d = tmp_path_factory.mktemp("llama_tok")
    (d / "tokenizer.json").write_text(json.dumps(j))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "clean_up_tokenization_spaces": False}))
    t = Tokenizer.from_pretrained(d)
    assert t.hf.convert_ids_to_tokens(t.encode("é"))[-2:] == ["<0xC3>", "<0xA9>"]
    return t


def test_incremental_sentencepiece_style(llama_style_tok):
    """Leading-space handling ('▁' stripped at the start of a decode) and byte-fallback runs:
    the stream equals the full decode's text after the prompt, for valid UTF-8 output."""
    t = llama_style_tok
    normal_ids = [i for i in range(t.vocab_size) if not 3 <= i < 259]
    piece = st.one_of(st.sampled_from(normal_ids).map(lambda i: [i]),
                      st.text(alphabet="ab é東京🙂—\n.", min_size=1, max_size=4).map(
                          lambda s: t.encode(s, add_special_tokens=False)))

    @given(parts=st.lists(piece, min_size=1, max_size=12),
           prompt=st.sampled_from(["Hello", "The cache", "Say: café", "x"]))
    @HYP
    def check(parts, prompt):
        gen = [i for p in parts for i in p]
        prompt_ids = t.encode(prompt)
        pieces, tail, _ = _stream(t, prompt_ids, gen)
        full, pre = t.decode(prompt_ids + gen), t.decode(prompt_ids)
        assert full.startswith(pre)
        assert "".join(pieces) + tail == full[len(pre):]
        assert not any("\ufffd" in p for p in pieces)

    check()


@pytest.mark.parametrize("which", ["byte_level", "sentencepiece_style"])
def test_decode_is_transformers_decode(tok, llama_style_tok, which):
    """Tokenizer.decode reads the ``tokenizers`` backend directly where transformers' decode
    only wraps it (both tokenizers here): the same text as transformers' for any ids, special
    ones kept or skipped."""
    t = tok if which == "byte_level" else llama_style_tok
    assert t._backend is not None  # the direct path is the one under test

    @given(ids=st.lists(st.integers(0, t.vocab_size - 1), max_size=30), skip=st.booleans())
    @HYP
    def check(ids, skip):
        assert t.decode(ids, skip_special_tokens=skip) == t.hf.decode(
            ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)

    check()


def test_a_tokenizer_with_its_own_decode_keeps_it(tok_dir):
    """A tokenizer class that decodes its own way is asked through transformers, not the
    backend (whose text could differ)."""
    t = Tokenizer.from_pretrained(tok_dir)

    class Shouting(type(t.hf)):
        def _decode(self, token_ids, **kw):
            return super()._decode(token_ids, **kw).upper()

    t.hf.__class__ = Shouting
    t2 = Tokenizer(t.hf)
    assert t2._backend is None
    ids = t.encode("hello there")
    assert t2.decode(ids) == "HELLO THERE"
