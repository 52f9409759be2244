"""Hardware profiles as a user meets them: a broken --profile / $WRITESCOPE_PROFILE file is a
one-line error naming the field and the file (generate, serve, bench and plan alike, before any
weights load), a broken cached profile is measured again, a profile of another machine is
warned about; and `writescope plan`'s budget and output checks."""
import copy
import json
import math
import warnings
from pathlib import Path

import pytest

from writescope.cli import main
from writescope.planner import profile as profile_mod
from writescope.planner.profile import HardwareProfile

REPO = Path(__file__).resolve().parents[1]
GOOD = json.loads((REPO / "bench/profiles/h100.json").read_text())


def _with(**kv) -> dict:
    d = copy.deepcopy(GOOD)
    for k, v in kv.items():
        if v is Ellipsis:
            d.pop(k)
        else:
            d[k] = v
    return d


def _write(tmp_path, d, name="p.json") -> str:
    p = tmp_path / name
    p.write_text(d if isinstance(d, str) else json.dumps(d))
    return str(p)


def _err(capsys, argv) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


# each: the profile document, what the one-line error says
BROKEN = [
    ([1, 2], "expected a JSON object, got list"),
    (None, "expected a JSON object, got null"),
    ('"abc"', "expected a JSON object, got str"),  # (a str is written as the file's text)
    (_with(version=True), "version True is not 1"),
    (_with(cpu_read_Bps=True), "cpu_read_Bps must be a positive number, got True"),
    (_with(cpu_attn=[1]), "cpu_attn must be an object, got [1]"),
    (_with(cpu_attn={"mla-h16-r576": 5}), "cpu_attn[mla-h16-r576] must be an object"),
    (_with(cpu_attn={"mla-h16-r576": {"C": 1e9, "T": -5}}),
     "cpu_attn[mla-h16-r576].T must be a positive number, got -5"),
    (_with(cpu_attn={"mla-h16-r576": {"C": 1e9, "T": "x"}}), ".T must be a positive number"),
    (_with(device_attn=[1, 2]), "device_attn must be an object"),
    (_with(cpu_expert=[1]), "cpu_expert must be an object"),
    (_with(cpu_expert={"foo": 1e10}), "cpu_expert key 'foo' is not an expert shape"),
    (_with(cpu_attn_isa=["amx"]), "cpu_attn_isa must be an object"),
    (_with(cpu_attn_prefetch_blocks=[1]), "cpu_attn_prefetch_blocks must be an object"),
    (_with(cpu_attn_variants="amx"), "cpu_attn_variants must be a list"),
    (_with(machine="x"), "machine must be an object"),
    (_with(cpu_threads=-4), "cpu_threads must be a whole number >= 1, got -4"),
    (_with(cpu_threads="x"), "cpu_threads must be a whole number >= 1"),
    (_with(launch_s=math.nan), "launch_s must be a number of seconds >= 0, got nan"),
    (_with(cpu_roundtrip_s=math.inf), "cpu_roundtrip_s must be a number of seconds >= 0, got inf"),
    (_with(h2d_pinned_block_Bps=-1.0), "h2d_pinned_block_Bps must be a positive number"),
    (_with(h2d_pageable_Bps=0), "h2d_pageable_Bps must be a positive number, got 0"),
    (_with(concurrent_h2d_Bps=-3), "concurrent_h2d_Bps must be a positive number, got -3"),
    (_with(concurrent_cpu_read_Bps="x"), "concurrent_cpu_read_Bps must be a positive number"),
    (_with(d2h_pinned_Bps=math.nan), "d2h_pinned_Bps must be a positive number, got nan"),
]


@pytest.mark.parametrize("doc,said", BROKEN)
def test_a_profile_of_the_wrong_shape_is_a_value_error_naming_the_field(tmp_path, doc, said):
    """These were AttributeError / TypeError tracebacks deep in the planner (a list where an
    object goes), or were accepted (NaN, infinite or negative optional rates, a bool for a
    number) and planned with."""
    path = _write(tmp_path, doc)
    with pytest.raises(ValueError) as e:
        HardwareProfile.load(path)
    assert said in str(e.value) and path in str(e.value)


def test_every_shipped_profile_still_loads():
    for p in sorted((REPO / "bench/profiles").glob("*.json")):
        HardwareProfile.load(p)


@pytest.mark.parametrize("doc,said", [BROKEN[0], BROKEN[6], BROKEN[11], BROKEN[18]])
def test_plan_with_a_broken_profile_says_so_in_one_line(capsys, tmp_path, doc, said):
    path = _write(tmp_path, doc)
    rc, err = _err(capsys, ["plan", "--model", "deepseek-v2-lite", "--context-lengths", "1k",
                            "--profile", path])
    assert rc == 1 and said in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_plan_names_a_profile_that_is_missing_or_a_folder(capsys, tmp_path):
    rc, err = _err(capsys, ["plan", "--model", "deepseek-v2-lite", "--profile",
                            str(tmp_path / "nope.json")])
    assert rc == 1 and "no such file (`writescope calibrate --out FILE` writes one)" in err
    rc, err = _err(capsys, ["plan", "--model", "deepseek-v2-lite", "--profile", str(tmp_path)])
    assert rc == 1 and f"hardware profile {tmp_path} is a folder" in err


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_broken_profile_is_refused_before_the_model_is_read(capsys, tmp_path, monkeypatch,
                                                              command, via):
    """generate and serve loaded the weights first and then crashed (AttributeError) or said
    the profile was not JSON; bench failed every row. The model here does not exist: the
    profile's error must come first."""
    path = _write(tmp_path, _with(cpu_attn=[1]))
    argv = [command, "--model", str(tmp_path / "no-model")]
    if command == "generate":
        argv += ["--prompt", "hi", "--device", "cpu"]
    if command == "bench":
        argv += ["--out", str(tmp_path / "out"), "--context-lengths", "128"]
    if via == "flag":
        argv += ["--profile", path]
    else:
        monkeypatch.setenv("WRITESCOPE_PROFILE", path)
    rc, err = _err(capsys, argv)
    flag = "--profile" if via == "flag" else "$WRITESCOPE_PROFILE"
    assert rc == 1 and f"{flag}: {path}: hardware profile: cpu_attn must be an object" in err


def _cfg():
    from writescope.engine.model_source import config_source
    from writescope.models.config import ModelConfig
    return ModelConfig.from_hf(config_source("deepseek-v2-lite"))


@pytest.mark.parametrize("cache", ["shape", "folder"])
def test_a_broken_cached_profile_is_measured_again(tmp_path, monkeypatch, cache):
    """A cached profile of the wrong shape crashed the engine's start (AttributeError), and a
    folder where the cache file goes was an IsADirectoryError: both are calibrated anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("WRITESCOPE_PROFILE", raising=False)
    path = profile_mod.default_cache_path()
    path.parent.mkdir(parents=True)
    if cache == "folder":
        path.mkdir()
    else:
        path.write_text(json.dumps(_with(cpu_attn={"mla-h16-r576": 5})))
    good = HardwareProfile.from_dict(GOOD)
    from writescope.planner import calibrate
    monkeypatch.setattr(calibrate, "calibrate", lambda **kw: good)
    monkeypatch.setattr(profile_mod, "_new_cpu_variants", lambda p: [])
    assert profile_mod.load_or_calibrate(model_config=_cfg()) is good


def test_the_engine_warns_of_a_profile_measured_on_another_machine(tmp_path):
    from writescope.engine.engine import LLMEngine
    path = _write(tmp_path, _with(machine={"cpu": "Some Other CPU 9000", "gpu": "NVIDIA B200"}))
    with pytest.warns(UserWarning, match="measured on another machine .*CPU 'Some Other CPU 9000'"):
        LLMEngine._load_profile(path, _cfg(), eager=True)
    here = _with(machine=profile_mod.machine_description())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LLMEngine._load_profile(_write(tmp_path, here, "here.json"), _cfg(), eager=True)


def test_plan_refuses_a_budget_below_the_weights_with_experts_on_the_cpu(capsys):
    """--experts cpu with a 1 MiB budget printed a plan (a G region of 0 tokens beside 3 GiB of
    dense weights the budget cannot hold), which the engine refuses."""
    rc, err = _err(capsys, ["plan", "--model", "mixtral-8x7b", "--experts", "cpu",
                            "--vram-budget", "1MiB", "--context-lengths", "1k",
                            "--profile", str(REPO / "bench/profiles/h100.json")])
    assert rc == 1 and "do not fit the VRAM budget (1 MiB)" in err


def test_plan_budget_errors_are_in_the_units_the_budget_was_given_in(capsys):
    """The default 32GiB budget was reported as '34.36 GB' (decimal GB beside GiB elsewhere)."""
    rc, err = _err(capsys, ["plan", "--model", "qwen3-30b-a3b", "--context-lengths", "10M",
                            "--profile", str(REPO / "bench/profiles/h100.json")])
    assert rc == 1 and "exceed the VRAM budget of 32 GiB" in err


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_plan_refuses_an_output_it_cannot_write_before_planning(capsys, tmp_path, flag):
    (tmp_path / "file").write_text("not a folder")
    out = str(tmp_path / "file" / "x.out")
    rc = main(["plan", "--model", "deepseek-v2-lite", "--context-lengths", "1k",
               "--profile", str(REPO / "bench/profiles/h100.json"), flag, out])
    cap = capsys.readouterr()
    assert rc == 1 and f"{flag} {out}: cannot write there" in cap.err
    assert cap.out == ""  # before the table, not after it
