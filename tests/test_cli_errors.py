"""Bad command lines get one line naming what is wrong, before any weights load: no
traceback, exit code 1 (argparse's own errors: 2)."""
from __future__ import annotations

import json
import os

import pytest

from writescope.cli import main


def _err(capsys, argv) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "loading" not in err, err
    return rc, err


@pytest.mark.parametrize("port,said", [("99999", "port must be from 0 to 65535, got 99999"),
                                       ("-1", "got -1"), ("http", "invalid port 'http'")])
def test_a_port_out_of_range_is_refused(capsys, port, said):
    rc, err = _err(capsys, ["serve", "--port", port])
    assert rc == 2 and said in err


def test_chat_with_token_id_prompts_is_refused(capsys, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": [42, 75]}) + "\n")
    rc, err = _err(capsys, ["generate", "--prompts-file", str(f), "--chat"])
    assert rc == 1 and "prompt 2 is token ids" in err


def test_prompts_from_standard_input_are_checked_like_a_file(capsys, monkeypatch):
    """``--prompts-file -`` reads standard input; its errors name it."""
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO('"fine"\nnot json\n'))
    rc, err = _err(capsys, ["generate", "--prompts-file", "-"])
    assert rc == 1 and "<stdin>:2: not valid JSON" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    rc, err = _err(capsys, ["generate", "--prompts-file", "-"])
    assert rc == 1 and "<stdin> holds no prompts" in err


def test_a_schema_path_that_is_not_there_is_named(capsys):
    rc, err = _err(capsys, ["generate", "--prompt", "hi", "--json-schema", "/no/such/s.json"])
    assert rc == 1 and "no file '/no/such/s.json'" in err


def test_bench_refuses_an_unknown_policy_before_any_row(capsys, tmp_path):
    rc, err = _err(capsys, ["bench", "--model", "qwen3-30b-a3b", "--random-weights",
                            "--policies", "writescope,bogus", "--out", str(tmp_path),
                            "--no-progress"])
    assert rc == 1 and "unknown kv_policy 'bogus'" in err and "[bench]" not in err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("override,said", [
    ("num_hidden_layers=abc", "num_hidden_layers must be a positive integer, got 'abc'"),
    ("num_hidden_layers=2.5", "got 2.5"),
    ("decoder_sparse_step=0", "decoder_sparse_step must be a positive integer, got 0"),
    ("num_attention_heads=0", "num_attention_heads must be a positive integer"),
    ("mlp_only_layers=3", "mlp_only_layers must be a list of layer indices")])
def test_config_overrides_of_the_wrong_type_are_named(capsys, override, said):
    rc, err = _err(capsys, ["plan", "--model", "qwen3-30b-a3b", "--context-lengths", "1k",
                            "--config-override", override])
    assert rc == 1 and said in err


@pytest.mark.parametrize("flags,said", [
    (["--cpu-share", "0.3"], "--cpu-share is the static policy's share"),
    (["--cpu-share", "0.3", "--kv-policy", "transfer"], "--kv-policy transfer does not read it"),
    (["--cpu-share", "7", "--kv-policy", "static"], "--cpu-share must be in [0, 1], got 7.0"),
    (["--profile", "/no/such/profile.json"], "--profile: no file '/no/such/profile.json'"),
    (["--vram-budget", "0"], "--vram-budget must be positive, got '0'")])
def test_engine_flags_that_cannot_apply_are_refused_before_the_weights(capsys, flags, said):
    """--cpu-share without the static policy was accepted and ignored; out of range, or a
    --profile that is not there, failed only after the weights had loaded."""
    rc, err = _err(capsys, ["generate", "--prompt", "hi", "--device", "cpu", *flags])
    assert rc == 1 and said in err


@pytest.mark.parametrize("threads", ["0", "-3"])
def test_calibrate_refuses_a_thread_count_below_one(capsys, tmp_path, threads):
    """-3 was a RuntimeError traceback from torch; 0 was silently ignored."""
    rc, err = _err(capsys, ["calibrate", "--quick", "--threads", threads,
                            "--out", str(tmp_path / "p.json")])
    assert rc == 1 and f"--threads must be at least 1, got {threads}" in err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("where", ["folder", "unwritable"])
def test_calibrate_refuses_an_out_path_it_cannot_write_before_probing(capsys, tmp_path, where):
    """The bad --out was found only after the whole calibration (minutes without --quick)."""
    out = tmp_path if where == "folder" else tmp_path / "file" / "p.json"
    (tmp_path / "file").write_text("not a folder")
    rc, err = _err(capsys, ["calibrate", "--quick", "--model", "writescope-default",
                            "--out", str(out)])
    assert rc == 1 and f"--out {out}" in err
    assert "calibrated in" not in err  # no probe ran


def test_a_profile_that_cannot_be_saved_leaves_no_temporary_file(tmp_path):
    from test_migrate import synthetic_profile
    (tmp_path / "p.json").mkdir()  # os.replace onto a folder fails
    with pytest.raises(OSError):
        synthetic_profile().save(tmp_path / "p.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_generate_refuses_an_output_it_cannot_write_before_generating(capsys):
    """--output /proc/x.jsonl (a folder where no file can be created) failed only after the
    model had loaded and generated: the results were lost."""
    rc, err = _err(capsys, ["generate", "--prompt", "hi", "--device", "cpu", "--max-tokens", "2",
                            "--output", "/proc/writescope-qa.jsonl"])
    assert rc == 1 and "--output /proc/writescope-qa.jsonl: cannot write there" in err


@pytest.mark.parametrize("flags,said", [
    (["--context-lengths", "8q"], "cannot read '8q' as a count"),
    (["--context-lengths", "0"], "--context-lengths must be positive token counts, got '0'"),
    (["--vram-budget", "32XB"], "cannot read '32XB' as a byte size"),
    (["--vram-budget", "0"], "--vram-budget must be positive, got '0'"),
    (["--kv-cache-memory", "1ZB"], "cannot read '1ZB' as a byte size")])
def test_plan_refuses_bad_sizes_before_calibrating(capsys, monkeypatch, tmp_path, flags, said):
    """Without a profile, `writescope plan` calibrated this machine (a full calibration:
    minutes) before it read --context-lengths and --vram-budget; 0 bytes was
    'vram_budget_bytes must be a positive int or None'."""
    import writescope.planner.profile as profile

    def no_calibration(*a, **k):
        raise AssertionError("calibrated before checking the arguments")
    monkeypatch.setattr(profile, "load_or_calibrate", no_calibration)
    rc, err = _err(capsys, ["plan", "--model", "qwen3-30b-a3b", *flags])
    assert rc == 1 and said in err


def test_bench_names_an_out_it_cannot_write(capsys, tmp_path):
    """--out naming a file was '[Errno 17] File exists: ...' without the flag."""
    f = tmp_path / "results.txt"
    f.write_text("x")
    for out, said in ((f, f"--out {f} is a file"), (f / "sub", f"--out {f / 'sub'}: cannot write")):
        rc, err = _err(capsys, ["bench", "--model", "qwen3-30b-a3b", "--random-weights",
                                "--out", str(out), "--no-progress"])
        assert rc == 1 and said in err, err
