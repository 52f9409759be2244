"""Structured outputs, QA: vLLM's former ``SamplingParams(guided_decoding=...)`` keyword, and
malformed regexes that the grammar library would otherwise rewrite into another constraint."""
from __future__ import annotations

import json
import re
import warnings

import pytest

from writescope import LLM, GuidedDecodingParams, SamplingParams, StructuredOutputsParams as S
from writescope.core import InvalidRequestError

pytest.importorskip("llguidance")

REGEX = r"[0-9]{3}-[a-z]{2,4}"


@pytest.fixture(scope="module")
def tiny(tiny_qwen3_moe):
    return LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=16,
               max_num_batched_tokens=64, max_num_seqs=8, max_model_len=512)


def test_guided_decoding_is_vllms_former_name_of_structured_outputs(tiny):
    """vLLM (up to 0.11) takes ``SamplingParams(guided_decoding=GuidedDecodingParams(...))``,
    with a DeprecationWarning, as ``structured_outputs``: the output matches the constraint."""
    with pytest.warns(DeprecationWarning, match="structured_outputs"):
        p = SamplingParams(temperature=0.0, max_tokens=40,
                           guided_decoding=GuidedDecodingParams(regex=REGEX))
    assert p.structured_outputs == S(regex=REGEX) and p.guided_decoding is None
    assert p.clone().structured_outputs == S(regex=REGEX)
    (out,) = tiny.generate(["hello"], p)
    assert re.fullmatch(REGEX, out.outputs[0].text) and out.outputs[0].finish_reason == "stop"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # the same constraint under both names is that constraint; two different ones are not
        same = SamplingParams(structured_outputs=S(regex=REGEX), guided_decoding=S(regex=REGEX))
        assert same.structured_outputs == S(regex=REGEX)
        with pytest.raises(InvalidRequestError, match="guided_decoding"):
            SamplingParams(structured_outputs=S(regex="a"), guided_decoding=S(regex="b"))
        with pytest.raises(InvalidRequestError, match="StructuredOutputsParams"):
            SamplingParams(guided_decoding={"regex": "a"})


@pytest.mark.parametrize("regex", ["x\\", "[0-9]+\\", "a\\\\\\"])
def test_regex_ending_in_a_lone_backslash_is_refused(tiny, regex):
    """An unfinished escape does not compile (Python's and Rust's regex refuse it); the grammar
    library would drop the backslash and constrain to another regex."""
    with pytest.raises(re.error):
        re.compile(regex)
    with pytest.raises(InvalidRequestError, match="invalid regex"):
        tiny.generate(["hello"], SamplingParams(max_tokens=8, structured_outputs=S(regex=regex)))
    assert not tiny.engine.has_unfinished_requests()
    # an escaped backslash at the end is a backslash
    (out,) = tiny.generate(["hello"], SamplingParams(max_tokens=8, structured_outputs=S(
        regex="x\\\\")))
    assert out.outputs[0].text == "x\\"


def test_per_request_logits_processors_are_refused_by_name():
    """vLLM's ``SamplingParams(logits_processors=...)``: None or empty is nothing to do; a
    processor is refused with a message naming the option (vLLM V1 refuses them too), not
    a TypeError about an unknown keyword."""
    assert SamplingParams(logits_processors=None).logits_processors is None
    assert not SamplingParams(logits_processors=[]).changes_logits
    with pytest.raises(InvalidRequestError, match="logits_processors"):
        SamplingParams(logits_processors=[lambda ids, logits: logits])


def test_properties_come_in_each_schemas_own_order(tiny):
    """Two schemas that differ only in the order of their properties are two constraints: the
    output writes the properties in its own schema's order (OpenAI's structured outputs), also
    after the other schema was compiled (the compiled-grammar cache)."""
    props = {"alpha": {"type": "boolean"}, "beta": {"type": "boolean"}}
    first = {"type": "object", "properties": props, "required": ["alpha", "beta"],
             "additionalProperties": False}
    second = dict(first, properties=dict(reversed(props.items())))
    for schema in (first, second, first):
        (out,) = tiny.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=40,
                                                         structured_outputs=S(json=schema)))
        text = out.outputs[0].text
        assert list(json.loads(text)) == list(schema["properties"]), (schema, text)
