"""Broken model folders, files and resources: one error that names the file, field or size --
never a raw KeyError / AttributeError / SafetensorError traceback, and never an allocation
that fails (or a page that is lost) after the weights have loaded."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import _rewrite_safetensors, build_tiny_checkpoint
from writescope.cli import main
from writescope.models.config import ConfigError, ModelConfig
from writescope.models.loader import CheckpointError, build_model


def _load(path):
    return build_model(ModelConfig.from_hf(path), dtype=torch.float32, device="cpu",
                       checkpoint=path)


def _copy(src, tmp_path, name="m"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _cli_err(capsys, argv) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


@pytest.fixture(scope="module")
def tiny_sharded_index(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny qwen3_moe in several shards with model.safetensors.index.json."""
    return build_tiny_checkpoint("qwen3_moe", tmp_path_factory.mktemp("bad") / "sharded",
                                 seed=2, tokenizer_dir=tiny_tokenizer_dir,
                                 max_shard_size="200KB")


# ------------------------------------------------------------------------------ config files
@pytest.mark.parametrize("text", ["[1, 2]", "\"qwen3_moe\"", "null"])
def test_a_config_json_that_is_not_an_object_is_named(tiny_qwen3_moe, tmp_path, text):
    """A config.json holding a list was `AttributeError: 'list' object has no attribute 'get'`."""
    d = _copy(tiny_qwen3_moe, tmp_path)
    (d / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="config.json is not a JSON object"):
        ModelConfig.from_hf(d)


@pytest.mark.parametrize("field,value,said", [
    ("rms_norm_eps", "x", "rms_norm_eps must be a positive number, got 'x'"),
    ("rope_theta", None, None),  # absent: the default
    ("rope_scaling", "yes", "rope_scaling must be an object or null, got 'yes'"),
    ("rope_parameters", "yes", "rope_parameters must be an object or null, got 'yes'")])
def test_config_fields_of_the_wrong_type_are_named(tiny_qwen3_moe, field, value, said):
    """rms_norm_eps "x" was `could not convert string to float: 'x'` (no field named)."""
    d = json.loads((tiny_qwen3_moe / "config.json").read_text())
    d[field] = value
    if said is None:
        ModelConfig.from_hf(d)
        return
    with pytest.raises(ConfigError, match=said):
        ModelConfig.from_hf(d)


@pytest.mark.parametrize("text,said", [
    ("[]", "generation_config.json is not a JSON object"),
    ('{"eos_token_id": "x"}', "eos_token_id must be a token id or a list of them, got 'x'")])
def test_a_generation_config_that_is_not_an_object_is_named(capsys, tiny_qwen3_moe, tmp_path,
                                                            text, said):
    """A list was an AttributeError traceback from the tokenizer's EOS lookup; an EOS "x" was
    `invalid literal for int() with base 10: 'x'`."""
    d = _copy(tiny_qwen3_moe, tmp_path)
    (d / "generation_config.json").write_text(text)
    rc, err = _cli_err(capsys, ["generate", "--model", str(d), "--device", "cpu",
                                "--prompt", "hi", "--max-tokens", "2"])
    assert rc == 1 and said in err and "generation_config.json" in err


def test_a_model_path_to_a_file_is_named(capsys, tiny_qwen3_moe):
    """model.safetensors as the model was `'utf-8' codec can't decode byte 0xf9 ...`."""
    f = tiny_qwen3_moe / "model.safetensors"
    rc, err = _cli_err(capsys, ["generate", "--model", str(f), "--device", "cpu",
                                "--prompt", "hi"])
    assert rc == 1 and "is a file; pass the checkpoint folder" in err


# ------------------------------------------------------------------------------ weight files
@pytest.mark.parametrize("how", ["truncated", "empty", "garbage", "folder"])
def test_an_unreadable_safetensors_file_is_named(tiny_qwen3_moe, tmp_path, how):
    """A truncated, empty or foreign file was safetensors' bare SafetensorError traceback
    ("incomplete metadata, file not fully covered"), a folder of that name "No such device"."""
    d = _copy(tiny_qwen3_moe, tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.unlink()
    if how == "folder":
        f.mkdir()
    else:
        f.write_bytes({"truncated": data[:len(data) // 2], "empty": b"",
                       "garbage": b"\xff" * 1000}[how])
    with pytest.raises(CheckpointError, match=r"cannot read model\.safetensors in .*m \("):
        _load(d)


def test_a_truncated_shard_is_named(tiny_sharded_index, tmp_path):
    d = _copy(tiny_sharded_index, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=f"cannot read {shard.name}"):
        _load(d)


@pytest.mark.parametrize("text,said", [
    ("{", "model.safetensors.index.json is not a JSON object"),
    ("[]", "model.safetensors.index.json is not a JSON object"),
    ('{"metadata": {}}', 'model.safetensors.index.json has no "weight_map"'),
    ('{"weight_map": {"lm_head.weight": 3}}', 'has no "weight_map"')])
def test_a_broken_index_is_named(tiny_sharded_index, tmp_path, text, said):
    """An index without "weight_map" was `KeyError: 'weight_map'`; one that is not JSON, the
    JSON error with no file named."""
    d = _copy(tiny_sharded_index, tmp_path)
    (d / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointError, match=said):
        _load(d)


def test_an_index_that_maps_a_tensor_to_the_wrong_shard_is_named(tiny_sharded_index, tmp_path):
    """Was safetensors' `File does not contain tensor lm_head.weight` traceback."""
    d = _copy(tiny_sharded_index, tmp_path)
    ix = json.loads((d / "model.safetensors.index.json").read_text())
    wrong = next(f for f in sorted(set(ix["weight_map"].values()))
                 if f != ix["weight_map"]["lm_head.weight"])
    ix["weight_map"]["lm_head.weight"] = wrong
    (d / "model.safetensors.index.json").write_text(json.dumps(ix))
    with pytest.raises(CheckpointError, match=f"puts tensor 'lm_head.weight' in {wrong}, "
                                              "which does not hold it"):
        _load(d)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_a_weight_of_an_integer_dtype_is_refused(tiny_qwen3_moe, tmp_path, dtype):
    """An int32 k_proj was cast to float and the model ran on nonsense weights."""
    name = "model.layers.0.self_attn.k_proj.weight"
    d = _copy(tiny_qwen3_moe, tmp_path)

    def edit(sd):
        sd[name] = (sd[name] * 100).to(dtype)

    _rewrite_safetensors(tiny_qwen3_moe / "model.safetensors", d / "model.safetensors", edit)
    with pytest.raises(CheckpointError, match=f"tensor '{name}' in model.safetensors .* has "
                                              "dtype (I32|BOOL), expected floating-point"):
        _load(d)


def test_a_16_bit_float_weight_still_loads(tiny_qwen3_moe, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    d = _copy(tiny_qwen3_moe, tmp_path)
    _rewrite_safetensors(tiny_qwen3_moe / "model.safetensors", d / "model.safetensors",
                         lambda sd: sd.__setitem__(name, sd[name].to(torch.bfloat16)))
    _load(d)


# ------------------------------------------------------------------------------ resources
def test_host_kv_budgets_beyond_the_memory_available_are_refused(tiny_qwen3_moe, monkeypatch):
    """--pinned-budget / --host-budget larger than the host were allocated as asked: the
    allocator's RuntimeError traceback ("DefaultCPUAllocator: can't allocate memory"), or
    pageable pages that fail later, mid-run."""
    from writescope import LLM
    from writescope import hostmem
    monkeypatch.setattr(hostmem, "available_ram_bytes", lambda: 4 << 20)  # weights: < 1 MiB
    with pytest.raises(MemoryError, match=r"the KV cache's host regions \(T \+ C\) "
                                          r"would take .* GiB of host memory \(pinned_budget "
                                          r"default, host_budget 1\.0 GiB\); 0\.0 GiB is "
                                          "available"):
        LLM(str(tiny_qwen3_moe), device="cpu", host_budget="1GiB")
    LLM(str(tiny_qwen3_moe), device="cpu")  # the defaults are not checked against it


def test_ctrl_c_while_the_command_line_starts_is_one_line(capsys, monkeypatch):
    """Ctrl-C in the seconds torch takes to import was a KeyboardInterrupt traceback: the
    package imported torch before `main` could catch it, and `main` built its parser (which
    imports the command modules) outside its try."""
    import writescope.cli as cli

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    try:
        rc = cli.main(["generate", "--prompt", "hi"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt left main")
    assert rc == 130 and capsys.readouterr().err.strip() == "writescope: interrupted"
    out = subprocess.run([sys.executable, "-c", "import sys, writescope.cli; "
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_ctrl_c_while_a_command_runs_says_so(capsys, monkeypatch):
    """Was exit code 130 with nothing said after the progress bar."""
    import writescope.commands.generate as gen

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(gen, "run", interrupted)
    assert main(["generate", "--prompt", "hi"]) == 130
    assert capsys.readouterr().err.strip() == "writescope generate: interrupted"


# ------------------------------------------------------------------------------ tokenizer
def test_a_tokenizer_larger_than_the_model_is_refused_per_prompt(tmp_path, tiny_tokenizer_dir):
    """A text prompt whose tokens the model has no embedding for (tokenizer of 320 tokens,
    vocab_size 300) was `IndexError: index out of range in self` from the embedding."""
    from writescope import LLM, SamplingParams
    from writescope.core import InvalidRequestError
    d = build_tiny_checkpoint("qwen3_moe", tmp_path / "small_vocab", seed=2,
                              tokenizer_dir=tiny_tokenizer_dir, vocab_size=300)
    llm = LLM(str(d), device="cpu")
    assert max(llm.get_tokenizer().encode(" over the lazy dog")) >= 300
    with pytest.raises(InvalidRequestError, match=r"token id 3\d\d is outside model small_vocab's "
                                                  r"vocabulary \(vocab_size 300 in config.json; "
                                                  r"its tokenizer has 320 tokens\)"):
        llm.generate(["jumps over the lazy dog"], SamplingParams(max_tokens=2))
    assert not llm.llm_engine.requests
    # ignore_eos: a sampled first token may be the EOS (about 2% after "hi"), ending at one
    assert len(llm.generate(["hi"], SamplingParams(max_tokens=2, ignore_eos=True))[0]
               .outputs[0].token_ids) == 2


@pytest.fixture(scope="module")
def raising_template(tmp_path_factory, tiny_qwen3_moe):
    """tiny_qwen3_moe whose chat template raises (as templates that allow no system role do)."""
    d = tmp_path_factory.mktemp("bad") / "raising_template"
    shutil.copytree(tiny_qwen3_moe, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ raise_exception('no system role') }}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("template,said", [
    (None, r"the chat template of .*raising_template failed: TemplateError: no system role"),
    ("{% for m in messages %}{{ m.content }", "the chat template given failed: "
                                                "TemplateSyntaxError: unexpected '}'")])
def test_a_chat_template_that_fails_is_named(raising_template, template, said):
    """Was jinja2's TemplateError / TemplateSyntaxError traceback from LLM.chat and
    `writescope generate --chat` (the server already answered 400)."""
    from writescope import LLM, SamplingParams
    from writescope.models.tokenizer import TokenizerError
    llm = LLM(str(raising_template), device="cpu")
    with pytest.raises(TokenizerError, match=said):
        llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2),
                 chat_template=template)


def test_generate_chat_names_a_failing_template(capsys, raising_template):
    rc, err = _cli_err(capsys, ["generate", "--model", str(raising_template), "--device", "cpu",
                                "--prompt", "hi", "--chat"])
    assert rc == 1 and "failed: TemplateError: no system role" in err


def test_the_chat_command_says_a_template_rejected_the_turn_and_goes_on(raising_template):
    """`writescope chat` ended the session on the template's error, with a traceback."""
    import io

    from writescope import LLM, SamplingParams
    from writescope.commands.chat import Chat
    llm = LLM(str(raising_template), device="cpu")
    chat = Chat(llm, SamplingParams(temperature=0, max_tokens=2), None, None)
    err = io.StringIO()
    assert chat.answer("Hello there", io.StringIO(), err) is None
    assert "TemplateError: no system role" in err.getvalue() and chat.messages == []
