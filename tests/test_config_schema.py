"""The config is checked by one msgspec Struct (analysis/config.Table): each wrong value
is one `file:line: key must be ..., got value` line, a mistyped key a "did you mean"."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlatrace.analysis.config import ConfigError, load_config

pytest.importorskip("msgspec")   # the readers run without it (the H200 image)
from mlatrace.analysis.config_table import Table


@pytest.mark.parametrize("line, message", [
    ("far_factor = 0", "far_factor must be a positive integer, got 0"),
    ("far_factor = 2.5", "far_factor must be a positive integer, got 2.5"),
    ("fail_on = 'never'", "fail_on must be 'error' or 'warning', got 'never'"),
    ("min_timed_replays = 1", "min_timed_replays must be an integer >= 2, got 1"),
    ("underfill_fraction = true", "underfill_fraction must be a positive number up to 1"),
    ("attention_names = []", "attention_names must be a non-empty list of strings"),
    ("expect = 'graphs'", "expect must be a list of record kinds"),
    ("far_factr = 8", "unknown key 'far_factr' (did you mean 'far_factor'?)"),
])
def test_a_wrong_value_is_one_line_with_file_and_line(tmp_path: Path, line: str,
                                                     message: str) -> None:
    cfg = tmp_path / "mlatrace.toml"
    cfg.write_text(f'# checked\nlong_len_factor = 8\n{line}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    assert str(caught.value).startswith(f"{cfg}:3: {message}")
    assert "\n" not in str(caught.value)


def test_every_key_of_the_table_is_documented() -> None:
    from mlatrace.analysis import config

    for key in Table.__struct_fields__:
        assert f"    {key} = " in config.__doc__, key
