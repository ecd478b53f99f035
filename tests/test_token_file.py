"""The token file is read as hostile input too: bounded before it is read, every field
checked with a clear error that never quotes a secret, and serve says when others may read it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from prompt_outbox.api import TokenTable
from prompt_outbox.api.auth import MAX_FILE_BYTES
from prompt_outbox.cli import main

SECRET = "s3cret-token-value"


def _file(tmp_path: Path, rows: object, mode: int = 0o600) -> Path:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": rows}))
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"token": "two words", "user": "u"}, "visible ASCII"),
        ({"token": "line\nbreak", "user": "u"}, "visible ASCII"),
        ({"token": "héllo", "user": "u"}, "visible ASCII"),
        ({"token": "x" * 513, "user": "u"}, "visible ASCII"),
        ({"token": SECRET, "user": ""}, "'user'"),
        ({"token": SECRET, "user": "bad\x00user"}, "userID"),
        ({"token": SECRET, "user": "u", "workspaces": ["acme}"]}, "workspace ID"),
        ({"token": SECRET, "user": "u", "workspaces": [".."]}, "workspace ID"),
        ({"token": SECRET, "user": "u", "workspaces": "acme"}, "list of workspace IDs"),
    ],
)
def test_every_field_is_checked_and_no_secret_is_quoted(
    tmp_path: Path, row: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        TokenTable.from_file(_file(tmp_path, [row]))
    assert SECRET not in str(refused.value)


def test_a_repeated_token_is_refused(tmp_path: Path) -> None:
    rows = [{"token": SECRET, "user": "a"}, {"token": SECRET, "user": "b", "admin": True}]
    with pytest.raises(ValueError, match=r"tokens\[1\] repeats"):
        TokenTable.from_file(_file(tmp_path, rows))


def test_deep_json_and_other_bytes_are_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="not JSON"):
        TokenTable.from_file(path)
    path.write_bytes(b'{"tokens": [{"token": "\xff", "user": "u"}]}')
    with pytest.raises(ValueError, match="not UTF-8"):
        TokenTable.from_file(path)


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    with path.open("wb") as file:
        file.truncate(MAX_FILE_BYTES + 1)  # sparse: a huge file costs the test nothing
    with pytest.raises(ValueError, match="over"):
        TokenTable.from_file(path)


def test_a_good_file_still_loads(tmp_path: Path) -> None:
    rows = [
        {"token": SECRET, "user": "alice", "workspaces": ["acme", "a.b"]},
        {"token": "ops-" + SECRET, "user": "ops", "admin": True},
    ]
    table = TokenTable.from_file(_file(tmp_path, rows))
    alice = table.lookup(SECRET)
    assert alice is not None and alice.workspaces == {"acme", "a.b"} and not alice.admin
    ops = table.lookup("ops-" + SECRET)
    assert ops is not None and ops.admin


def test_serve_warns_of_a_token_file_others_may_read(tmp_path: Path) -> None:
    bad_targets = tmp_path / "targets.json"
    bad_targets.write_text("{")  # so serve stops right after reading its tokens
    for mode, warned in ((0o644, True), (0o600, False)):
        tokens = _file(tmp_path, [{"token": SECRET, "user": "u"}], mode)
        done = CliRunner().invoke(
            main,
            ["serve", "--tokens", str(tokens), "--opencode-targets", str(bad_targets)],
            env={**os.environ, "PROMPT_OUTBOX_DATA_DIR": str(tmp_path / "data")},
        )
        assert done.exit_code != 0, done.output
        assert ("readable by other users" in done.output) is warned, done.output
    # An unreadable token file is refused by serve with the reason, not a traceback.
    junk = tmp_path / "junk.json"
    junk.write_text("[" * 100_000)
    done = CliRunner().invoke(main, ["serve", "--tokens", str(junk)])
    assert done.exit_code == 2 and "not JSON" in done.output


def test_lookup_finds_each_of_many_tokens_and_nothing_else() -> None:
    # One dict lookup by the token's digest (api/auth.py): exact matches only.
    rows = [
        {"token": f"tok-{n:05d}", "user": f"u{n}", "workspaces": [f"w{n}"]} for n in range(20_000)
    ]
    table = TokenTable.from_json(json.dumps({"tokens": rows}))
    for n in (0, 7, 19_999):
        found = table.lookup(f"tok-{n:05d}")
        assert found is not None and found.user_id == f"u{n}"
    for wrong in ("tok-0000", "tok-000000", "TOK-00000", "tok-00000 ", ""):
        assert table.lookup(wrong) is None
