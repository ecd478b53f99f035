"""The token file is read as hostile input too: bounded before it is read, every field
checked with a clear error that never quotes a secret, and serve says when others may read it."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from prompt_outbox.api import TokenTable
from prompt_outbox.api.auth import MAX_FILE_BYTES
from prompt_outbox.cli import main
from tests.support.serve import BIN

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


def _serve_says(tokens: Path, tmp_path: Path, group: int | None = None) -> str:
    """What serve prints at start with ``tokens`` (in ``group``, when given: a process of
    its own); it stops right after reading them, at a targets file that is not JSON."""
    targets = tmp_path / "targets.json"
    targets.write_text("{")
    argv = ["serve", "--tokens", str(tokens), "--opencode-targets", str(targets)]
    env = {**os.environ, "PROMPT_OUTBOX_DATA_DIR": str(tmp_path / "data")}
    if group is None:
        done = CliRunner().invoke(main, argv, env=env)
        assert done.exit_code == 2 and f"{targets}: not JSON" in done.output, done.output
        return done.output
    ran = subprocess.run(
        [BIN, *argv], env=env, group=group, extra_groups=[group],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 2 and f"{targets}: not JSON" in ran.stderr, ran.stderr
    return ran.stderr


def test_serve_warns_of_a_token_file_others_may_read(tmp_path: Path) -> None:
    for mode, warned in ((0o644, True), (0o602, True), (0o600, False)):
        output = _serve_says(_file(tmp_path, [{"token": SECRET, "user": "u"}], mode), tmp_path)
        assert ("every user may read or change it: chmod 600 it" in output) is warned, output


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")


def _another_user() -> pwd.struct_passwd:
    """A user other than this one whose own group /etc/group names (daemon, on Debian)."""
    named = {g.gr_gid for g in grp.getgrall()}
    me = pwd.getpwuid(os.geteuid())
    return next(u for u in pwd.getpwall() if u.pw_gid != me.pw_gid and u.pw_gid in named)


@root_only
def test_a_group_readable_token_file_is_said_unless_the_group_is_this_users_alone(
    tmp_path: Path,
) -> None:
    tokens = _file(tmp_path, [{"token": SECRET, "user": "u"}], 0o640)
    # This user's own group, named after it, nobody else in it (root's, here): quiet.
    me = pwd.getpwuid(os.geteuid())
    if grp.getgrgid(me.pw_gid).gr_mem or [
        u for u in pwd.getpwall() if u.pw_gid == me.pw_gid and u.pw_uid != me.pw_uid
    ]:
        pytest.skip("this user's group has others in it here")
    os.chown(tokens, -1, me.pw_gid)
    assert "token file" not in _serve_says(tokens, tmp_path)
    # Another user's group, whether serve is in it or not: its members may read the file.
    other = _another_user()
    os.chown(tokens, -1, other.pw_gid)
    said = f"the members of group {grp.getgrgid(other.pw_gid).gr_name} ({other.pw_gid}) may"
    for group in (None, other.pw_gid):
        output = _serve_says(tokens, tmp_path, group)
        assert said in output, output


@root_only
def test_a_kubernetes_secret_mounted_for_the_pods_fs_group_draws_no_warning(
    tmp_path: Path,
) -> None:
    """The kubelet mounts a Secret of defaultMode 0400 as 0440, owned by root and the pod's
    fsGroup: a bare number, which the container's process is in (its group, here; the user
    stays root, whose Python the test's venv runs), and nobody else: serve keeps quiet, and
    still warns of a file every user may read."""
    gid = next(n for n in range(10001, 20000) if not _taken(n))
    for mode, warned in ((0o440, False), (0o444, True)):
        tokens = _file(tmp_path, [{"token": SECRET, "user": "u"}], mode)
        os.chown(tokens, 0, gid)
        output = _serve_says(tokens, tmp_path, gid)
        assert ("token file" in output) is warned, output
    # The same file 0440 and group, serve not in it: the group's members are others.
    tokens.chmod(0o440)
    said = _serve_says(tokens, tmp_path)
    assert f"the members of group {gid} may read or change it" in said, said


def _taken(n: int) -> bool:
    """Whether ``n`` names a group, or is some user's uid or group."""
    try:
        grp.getgrgid(n)
    except KeyError:
        return any(u.pw_uid == n or u.pw_gid == n for u in pwd.getpwall())
    return True


@root_only
def test_a_token_file_another_user_owns_is_said(tmp_path: Path) -> None:
    tokens = _file(tmp_path, [{"token": SECRET, "user": "u"}], 0o600)
    other = _another_user()
    os.chown(tokens, other.pw_uid, -1)
    said = _serve_says(tokens, tmp_path)
    assert f"user {other.pw_name} ({other.pw_uid}) owns it and may change it" in said, said


@root_only
def test_a_token_file_whose_acl_names_another_user_is_said(tmp_path: Path) -> None:
    """An ACL entry for another user shows in the mode only as group bits (its mask), on a
    file of this user's own group: without the ACL check, 0640 here would be quiet."""
    tokens = _file(tmp_path, [{"token": SECRET, "user": "u"}], 0o600)
    os.chown(tokens, -1, pwd.getpwuid(os.geteuid()).pw_gid)
    _grant_read(tokens, _another_user().pw_uid)  # what `setfacl -m u:NAME:r` writes
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o640
    said = _serve_says(tokens, tmp_path)
    assert "its ACL lets other users or groups read it" in said, said


def _grant_read(path: Path, uid: int) -> None:
    """Set an access ACL of owner rw, user ``uid`` r, group -, mask r, other - (the kernel's
    posix_acl_xattr format: a version, then tag, permissions and id per entry)."""
    anyone = 0xFFFFFFFF
    entries = [(0x01, 6, anyone), (0x02, 4, uid), (0x04, 0, anyone), (0x10, 4, anyone)]
    raw = struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", *e) for e in [*entries, (0x20, 0, anyone)]
    )
    try:
        os.setxattr(path, "system.posix_acl_access", raw)
    except OSError as exc:
        pytest.skip(f"no ACLs on this file system: {exc}")


def test_an_unreadable_token_file_is_refused_with_the_reason(tmp_path: Path) -> None:
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
