"""Issue 10: attacks by code in a thread, one test per item, each of which must fail to do harm.

Every attack runs through the real engine and a real sandboxed kernel (tests/sandbox_attacks.py),
twice: as the user running the tests (root in CI) and, when that is root, as an unprivileged
user (`setpriv` to nobody). That child gets the same view of the host, except that a directory
it cannot enter above the interpreter or this checkout (/root is 0700, and so is a `mktemp -d`
folder) is replaced by a 0755 one holding just the way down to them (python_view). A checkout
whose own files others cannot read skips those runs, saying so. Not root: the first run is
already the unprivileged case, and the second is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from slackinterp.engine import workspace
from slackinterp.kernels.local import privileges, sandbox
from slackinterp.runtime import Runtime
from tests.conftest import make_settings
from tests.sandbox_attacks import MAX_FILES, Targets, listen

REPO = Path(__file__).resolve().parent.parent
ROOT = os.geteuid() == 0

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
    # One xdist worker (`--dist loadgroup`) runs this module, so each `attacks` run (a
    # sandboxed bot and a dozen kernels, ~25 s) is built once per user, not once per worker.
    pytest.mark.xdist_group("sandbox_attacks"),
]


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


def as_nobody(base: Path) -> tuple[list[str], list[str]]:
    """For the `unprivileged` variant of a child bot: (bwrap options giving nobody a view of
    Python, the command that drops to nobody after bwrap). Skips when that cannot be done;
    `base` is handed to nobody."""
    if not ROOT:
        pytest.skip("not root: the bot_user run already ran as an unprivileged user")
    nobody = _nobody()
    if nobody is None:
        pytest.skip("no 'nobody' user to run the unprivileged case as")
    os.chown(base, nobody.pw_uid, nobody.pw_gid)
    drop = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}"]
    return python_view(nobody), [*drop, "--clear-groups", "--"]


def run_module(module: str, base: Path, wrapper: list[str], timeout: float) -> dict[str, Any]:
    """Run `python -m module` under `wrapper` with {"base": base} on stdin; its last stdout
    line is the JSON result."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(base)}
    done = subprocess.run(
        [*wrapper, sys.executable, "-m", module],
        input=json.dumps({"base": str(base)}),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _can_enter(directory: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` (its own group only: the children run with --clear-groups) may pass
    through `directory`."""
    info = directory.stat()
    if info.st_uid == user.pw_uid:
        return bool(info.st_mode & 0o100)
    if info.st_gid == user.pw_gid:
        return bool(info.st_mode & 0o010)
    return bool(info.st_mode & 0o001)


def _outermost(paths: list[Path]) -> list[Path]:
    """`paths` without those inside another of them."""
    unique = sorted(set(paths))
    return [p for p in unique if not any(other in p.parents for other in unique)]


def python_view(user: pwd.struct_passwd) -> list[str]:
    """bwrap options for a child: the host as it is (own mount namespace only), except that
    what the child needs, the interpreter and this checkout, becomes reachable for `user`
    when a directory above it shuts that user out (/root is 0700, and so is a checkout made
    in `mktemp -d`). Each such directory is replaced by an empty one, 0755, holding only
    the way down to what is needed, which is bound read-only: the same paths, the same
    files, nothing else of that directory."""
    needed = _outermost([*sandbox.python_prefixes(), REPO])
    blocked: list[Path] = []  # above each needed path, the first that `user` cannot enter
    for path in needed:
        for parent in reversed(path.parents):  # from / down
            if not _can_enter(parent, user):
                blocked.append(parent)
                break
    blocked = _outermost(blocked)
    args = ["--dev-bind", "/", "/"]
    for directory in blocked:
        args += ["--tmpfs", str(directory)]
    made: set[Path] = set()
    for path in needed:
        top = next((b for b in blocked if b in path.parents), None)
        if top is None:
            continue
        for parent in reversed(path.parents):
            if top in parent.parents and parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(path), str(path)]
    return args


# Run in the staged view as the unprivileged user: can it read this checkout and run Python?
_READABLE = """import os, sys
for path in sys.argv[1:]:
    os.listdir(path)
    for name in ("slackinterp/__init__.py", "tests/sandbox_attacks.py"):
        open(os.path.join(path, name)).close()
"""


def unreadable_checkout(wrapper: list[str]) -> str | None:
    """Why the unprivileged child cannot run this checkout even in its staged view (files
    or the checkout itself not readable by others, e.g. a clone made under umask 077), or
    None. The view only replaces directories above the checkout; it changes no mode."""
    probe = subprocess.run(
        [*wrapper, sys.executable, "-I", "-S", "-c", _READABLE, str(REPO)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"]
    return lines[-1][:300]


def run_child(targets: Targets, wrapper: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": targets.base}
    done = subprocess.run(
        [*wrapper, sys.executable, "-m", "tests.sandbox_attacks"],
        input=json.dumps(asdict(targets)),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class Host:
    """Targets on the host, made by the test process (root when CI runs), removed after."""

    def __init__(self, owner: pwd.struct_passwd | None):
        self.base = Path(tempfile.mkdtemp(prefix="slackinterp-attack-"))
        self.owner = owner
        self.plant = self.base / "plant"
        self.plant.mkdir()
        self.secret: Path | None = None
        if ROOT:
            self.secret = Path("/etc") / f"slackinterp-attack-{uuid.uuid4().hex[:8]}.secret"
            self.secret.write_text("root only")
            self.secret.chmod(0o600)
        self.servers = []
        self.socket_paths: list[str] = []
        for directory in ("/var/tmp", "/dev/shm", "/tmp"):
            if os.access(directory, os.W_OK):
                path = f"{directory}/slackinterp-attack-{uuid.uuid4().hex[:8]}.sock"
                self.servers.append(listen(path))
                self.socket_paths.append(path)
        if owner is not None:
            for path in (self.base, self.plant):
                os.chown(path, owner.pw_uid, owner.pw_gid)

    def targets(self, sandbox_mode: str = "bwrap", kernel_start: str = "spawn") -> Targets:
        return Targets(
            base=str(self.base),
            secret=str(self.secret) if self.secret else None,
            plant_dir=str(self.plant),
            sockets=self.socket_paths,
            sandbox=sandbox_mode,
            kernel_start=kernel_start,
        )

    def remove(self) -> None:
        for server in self.servers:
            server.close()
        for path in self.socket_paths:
            Path(path).unlink(missing_ok=True)
        if self.secret is not None:
            self.secret.unlink(missing_ok=True)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(
    scope="module",
    params=[
        ("bot_user", "spawn"),
        ("unprivileged", "spawn"),
        ("bot_user", "fork"),
        ("unprivileged", "fork"),
    ],
    ids=lambda p: "-".join(p),
)
def attacks(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Each attack against both start modes: kernels spawned under bubblewrap, and kernels
    forked from the warm template (SLACKINTERP_KERNEL_START=fork, which fails rather than
    falling back, so the fork runs really are forked)."""
    who, start = request.param
    if who == "unprivileged":
        if not ROOT:
            pytest.skip("not root: the bot_user run already ran as an unprivileged user")
        nobody = _nobody()
        if nobody is None:
            pytest.skip("no 'nobody' user to run the unprivileged case as")
        drop = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}"]
        wrapper = ["bwrap", *python_view(nobody), "--", *drop, "--clear-groups", "--"]
        why = unreadable_checkout(wrapper)
        if why is not None:
            pytest.skip(f"'nobody' cannot read this checkout or its interpreter: {why}")
        host = Host(nobody)
    else:
        host = Host(None)
        wrapper = []
    try:
        found = run_child(host.targets(kernel_start=start), wrapper)
        assert found["start_mode"] == start
        yield found
    finally:
        host.remove()


def test_0_this_module_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    """`--dist loadgroup` marks a grouped test's id with its group; without that mark the
    group is ignored and every worker builds the attack runs again (a pytest/xdist mismatch
    did exactly that, silently)."""
    if not getattr(request.config.option, "loadgroup", False):  # set on xdist's workers
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@sandbox_attacks"), request.node.nodeid


def test_1_kernel_code_has_no_privileges(attacks: dict[str, Any]) -> None:
    got = attacks["privileges"]
    assert got["capeff"] == "0000000000000000" and got["capprm"] == "0000000000000000"
    assert got["uid"] != 0 and got["gid"] != 0 and 0 not in got["groups"]
    for call in ("umount_home", "umount_data", "mount", "remount_rw", "chroot"):
        assert got[call] != "ok", (call, got)
    assert got["setuid0"] != "ok"
    assert got["ptrace_init"] != "ok" and got["ptrace_child"] != "ok"
    assert got["raw_socket"] != "ok"
    assert got["cgroup_escape"] == []
    # No user namespace, by clone, clone3 or unshare, whether the bot is root or not.
    assert set(got["userns"]) == {"clone", "clone3", "unshare"}, got["userns"]
    assert "ok" not in got["userns"].values(), got["userns"]
    # Kernels run below the bot, and cannot climb back (the bot's acks stay prompt).
    nice = min(19, attacks["bot_nice"] + sandbox.KERNEL_NICE)
    assert got["nice"] == nice
    assert got["nice_raised"] != "ok"
    # A thread and a process the cell made in its first second, at the bot's niceness when
    # the bot may renice (root), went below the bot with the rest of the kernel.
    assert got["born_nice"] in (attacks["bot_nice"], nice)
    assert got["thread_nice"] == nice and got["process_nice"] == nice, got
    if ROOT:  # a root-owned 0600 file outside the hidden paths stays unreadable
        assert got["secret"] == "Permission denied"
    assert got["upload"] == "1,2\n3,4\n"  # the bot's 0600 upload is the kernel's to change


def test_2_a_planted_link_never_makes_the_bot_write_outside(
    attacks: dict[str, Any], tmp_path: Path
) -> None:
    got = attacks["plant"]
    assert got["planted"] == "planted" and got["after"] == "still works"
    assert got["outside"] == []  # the font cache was not seeded through .cache -> outside
    # The same bot-side call, directly: a link at any component refuses the whole seeding.
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "fontlist-v390.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    for planted in (".cache", ".cache/matplotlib"):
        work = tmp_path / f"work-{planted.count('/')}"
        (work / ".cache").mkdir(parents=True) if "/" in planted else work.mkdir()
        (work / planted).symlink_to(outside)
        assert sandbox.seed_font_cache(shared, work) is False
        assert list(outside.iterdir()) == []
    fine = tmp_path / "fine"
    fine.mkdir()
    assert sandbox.seed_font_cache(shared, fine) is True
    assert (fine / ".cache" / "matplotlib" / "fontlist-v390.json").read_text() == "{}"


def test_3_the_quota_counts_everything_a_kernel_writes(
    attacks: dict[str, Any], tmp_path: Path
) -> None:
    got = attacks["quota"]
    # 20,001 empty files no longer hide the bytes written after them
    assert any("WORKSPACE_QUOTA_MB" in n for n in got["hidden"]), got
    # the kernel's /tmp is on disk in its runtime directory and counted
    assert any("WORKSPACE_QUOTA_MB" in n for n in got["tmp_bytes"]), got
    # and so are entries, in bytes or not
    assert any("WORKSPACE_MAX_FILES" in n for n in got["tmp_files"]), got
    # The walk itself: bounded by time, not by count.
    (tmp_path / "many").mkdir()
    for i in range(20_001):
        (tmp_path / "many" / str(i)).touch()
    (tmp_path / "zz.bin").write_bytes(b"1" * 1_000_000)
    used = workspace.usage([tmp_path])
    assert used.complete and used.files == 20_003 and used.bytes >= 1_000_000
    assert not workspace.usage([tmp_path], seconds=0.0).complete
    assert workspace.usage([tmp_path], stop_after=MAX_FILES // 5).files > MAX_FILES // 5


def test_4_no_writable_tmpfs_in_the_sandbox(attacks: dict[str, Any]) -> None:
    got = attacks["tmpfs"]
    assert got["writable_tmpfs"] == []  # RAM and inodes that no limit counts
    assert got["dev"] != "ok"  # /dev is read-only
    assert got["tmp"] != "tmpfs" and got["shm"] != "tmpfs"  # on disk, under the quota
    assert got["tmp_write"] == "ok" and got["shm_write"] == "ok"  # and usable


def test_8_produced_file_names_are_inert(attacks: dict[str, Any]) -> None:
    names = attacks["names"]
    assert len(names) == 4
    for name in names:
        assert "`" not in name
        assert not [c for c in name if unicodedata.category(c) in ("Cc", "Cf")], repr(name)
    assert "evil_gnp.exe" in names  # the right-to-left override no longer hides ".exe"
    for raw in ("a\u202eb`c\u200b.txt", "x\x00y.csv", "\u2028line.txt"):
        clean = workspace.sanitize_filename(raw)
        assert "`" not in clean
        assert not [c for c in clean if unicodedata.category(c) in ("Cc", "Cf", "Zl")]


def test_9_no_host_unix_socket_is_reachable(attacks: dict[str, Any]) -> None:
    got = attacks["sockets"]
    assert got, "no world-writable host directory to plant a socket in"
    assert "connected" not in got.values(), got


def test_10_produced_files_never_collide_in_the_outbox(attacks: dict[str, Any]) -> None:
    assert attacks["collide"] == {"a/b.txt": "one", "a__b.txt": "two"}


def test_11_nothing_host_specific_in_the_kernels_view(attacks: dict[str, Any]) -> None:
    seen = "\n".join(attacks["view"])
    host = attacks["host"]
    assert "ipykernel" in seen  # the probe did read the command lines
    assert host["data"] not in seen
    assert host["workdir"] not in seen
    assert f"k{host['pid']}-" not in seen and "JPY_PARENT_PID" not in seen


@pytest.mark.skipif(not ROOT, reason="only a root bot switches kernels to another user")
def test_1_without_the_sandbox_a_root_bot_still_runs_kernels_unprivileged() -> None:
    nobody = _nobody()
    if nobody is None:
        pytest.skip("no 'nobody' user to run kernels as")
    wrapper = ["bwrap", *python_view(nobody), "--"]
    drop = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    why = unreadable_checkout([*wrapper, *drop, "--"])
    if why is not None:
        pytest.skip(f"'nobody' cannot read this checkout or its interpreter: {why}")
    host = Host(None)
    os.chmod(host.base, 0o755)  # the kernel user must reach its directories
    try:
        got = run_child(host.targets("none"), wrapper)
    finally:
        host.remove()
    kernel = got["privileges"]
    assert got["bot_uid"] == 0
    assert kernel["uid"] == nobody.pw_uid and kernel["groups"] in ([], [nobody.pw_gid])
    assert kernel["capeff"] == "0000000000000000"
    assert kernel["setuid0"] != "ok" and kernel["raw_socket"] != "ok"
    assert kernel["mount"] != "ok" and kernel["ptrace_init"] != "ok"
    assert kernel["cgroup_escape"] == []  # it cannot leave its pids cgroup to outlive a reset
    nice = min(19, got["bot_nice"] + sandbox.KERNEL_NICE)
    assert kernel["nice"] == nice
    assert kernel["nice_raised"] != "ok"
    assert kernel["thread_nice"] == nice and kernel["process_nice"] == nice, kernel
    assert kernel["secret"] == "Permission denied"
    assert kernel["upload"] == "1,2\n3,4\n"


@pytest.mark.skipif(not ROOT, reason="only a root bot switches kernels to another user")
async def test_1_an_unreachable_kernel_user_is_refused_with_a_clear_message(
    tmp_path: Path,
) -> None:
    """pytest's tmp_path lies under a 0700 directory: the kernel user cannot reach it, and
    the thread is told so (without host paths) instead of the kernel running as root."""
    from slackinterp.engine.events import CellFinished, TurnFailed
    from slackinterp.engine.workspace import ThreadKey
    from tests.conftest import run_turn

    rt = await Runtime.open(make_settings(tmp_path, sandbox="none"))
    try:
        events = await run_turn(rt.engine, ThreadKey("T", "C", "1.1"), "```python\n1+1\n```")
    finally:
        await rt.stop()
    failure = next(e for e in events if isinstance(e, TurnFailed))
    assert failure.kind == "kernel_start" and "SLACKINTERP_KERNEL_USER" in failure.message
    assert str(tmp_path) not in failure.message and "/root" not in failure.message
    assert not [e for e in events if isinstance(e, CellFinished)]


@pytest.mark.skipif(not ROOT, reason="only a root bot resolves SLACKINTERP_KERNEL_USER")
async def test_1_an_unknown_kernel_user_stops_the_bot_with_a_clear_message(
    tmp_path: Path,
) -> None:
    from slackinterp.runtime import SandboxUnavailable

    with pytest.raises(SandboxUnavailable, match="SLACKINTERP_KERNEL_USER=no-such-user-x"):
        await Runtime.open(make_settings(tmp_path, kernel_user="no-such-user-x"))
    assert privileges.kernel_user("root") is None  # the operator's explicit choice
    assert privileges.kernel_user("nobody") is not None
