import pytest
from hypothesis import given, strategies as st

from writescope.units import format_bytes, format_count, parse_bytes, parse_count


@pytest.mark.parametrize("text,value", [
    ("32GiB", 32 * 2 ** 30), ("32 GiB", 32 * 2 ** 30), ("32gib", 32 * 2 ** 30),
    ("32GB", 32 * 10 ** 9), ("32G", 32 * 2 ** 30), ("32g", 32 * 2 ** 30),
    ("1.5GiB", 3 * 2 ** 29), ("512M", 512 * 2 ** 20), ("512MB", 512 * 10 ** 6),
    ("100kB", 100_000), ("4KiB", 4096), ("4096", 4096), ("4096B", 4096), ("0", 0),
    ("2TiB", 2 * 2 ** 40), ("1e3", 1000), ("1.01KiB", 1034), (123, 123), ("  8 MiB ", 8 * 2 ** 20),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["", "GiB", "32 GiBs", "-1GiB", "1.5", "x", "3 bits", -5, 1.5,
                                 float("inf"), True, "0.3B", "iB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (512, "512 B"), (1024, "1 KiB"), (32 * 2 ** 30, "32 GiB"), (3 * 2 ** 29, "1.5 GiB"),
    (123 * 2 ** 20 + 1, "123 MiB"), (1025 * 2 ** 30, "1025 GiB"), (10001 * 2 ** 20, "9.77 GiB"), (2 ** 40, "1 TiB"), (1023, "1023 B"), (-2048, "-2 KiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@given(st.integers(min_value=0, max_value=4096), st.sampled_from([1, 2 ** 10, 2 ** 20, 2 ** 30, 2 ** 40]))
def test_format_parse_round_trip(k, unit):
    n = k * unit
    assert parse_bytes(format_bytes(n)) == n


@given(st.integers(min_value=1, max_value=2 ** 50))
def test_format_bytes_is_close(n):
    assert abs(parse_bytes(format_bytes(n).replace(" ", "")) - n) <= 0.005 * n + 1


@pytest.mark.parametrize("text,value", [("8k", 8192), ("8K", 8192), ("128k", 131072), ("1M", 2 ** 20),
                                        ("1.5k", 1536), ("500", 500), (7, 7)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("bad", ["8kB", "8KiB", "1.3", "k", "", -1])
def test_parse_count_rejects(bad):
    with pytest.raises(ValueError):
        parse_count(bad)


@given(st.integers(min_value=0, max_value=2 ** 40))
def test_count_round_trip(n):
    assert parse_count(format_count(n)) == n


def test_env_int(monkeypatch):
    """A whole-number setting from the environment: the default when unset or empty, a clear
    error naming the variable for anything else than a whole number at least the minimum."""
    from writescope.units import env_int
    monkeypatch.delenv("WS_TEST_N", raising=False)
    assert env_int("WS_TEST_N", 7) == 7
    monkeypatch.setenv("WS_TEST_N", "")
    assert env_int("WS_TEST_N", 7) == 7
    monkeypatch.setenv("WS_TEST_N", "0")
    assert env_int("WS_TEST_N", 7) == 0
    with pytest.raises(ValueError, match="WS_TEST_N must be at least 1, got 0"):
        env_int("WS_TEST_N", 7, minimum=1)
    for bad in ("x", "1.5", "-"):
        monkeypatch.setenv("WS_TEST_N", bad)
        with pytest.raises(ValueError, match="WS_TEST_N must be a whole number"):
            env_int("WS_TEST_N", 7)
