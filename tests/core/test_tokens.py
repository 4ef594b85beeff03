"""Bearer-token files: created owner-only, read back, refused when unusable; constant-time check."""

from __future__ import annotations

import os
import stat

import pytest

from gpuobs.core import tokens


def test_created_0600_and_stable(tmp_path):
    path = tmp_path / "sub" / "t"
    first = tokens.load_or_create(path)
    assert len(first) >= 40 and tokens.load_or_create(path) == first == tokens.read(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("content", ["", "\n", "two words\n", "a\nb\n"])
def test_unusable_files_are_refused(tmp_path, content):
    (tmp_path / "t").write_text(content)
    with pytest.raises(tokens.TokenError, match="token file"):
        tokens.load_or_create(tmp_path / "t")


def test_bearer_ok():
    assert tokens.bearer_ok(None, None)
    assert tokens.bearer_ok("Bearer abc", "abc") and tokens.bearer_ok("bearer  abc ", "abc")
    for header in (None, "", "abc", "Basic abc", "Bearer abcd", "Bearer \udcff"):
        assert not tokens.bearer_ok(header, "abc")
