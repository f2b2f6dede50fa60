"""The working-directory walks: one walk (measure) gives what snapshot and usage gave apart,
and the walk a gateway kernel runs (transfer.MEASURE) gives the same as the local one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slackinterp.kernels import workdir
from slackinterp.kernels.inside import transfer


def tree(root: Path, outside: Path) -> Path:
    """Nested folders, hidden files and folders, links to files and folders outside, a
    sparse file: everything the rules treat differently. Returns a scratch directory."""
    (root / "b" / "deep").mkdir(parents=True)
    (root / "a").mkdir()
    (root / ".hidden").mkdir()
    (root / "z.txt").write_text("z")
    (root / "a" / "one.csv").write_text("1,2\n")
    (root / "b" / "two.txt").write_text("two")
    (root / "b" / "deep" / "three.bin").write_bytes(b"\0" * 3000)
    (root / ".hidden" / "secret.txt").write_text("not listed, but counted")
    (root / ".dotfile").write_text("also counted")
    outside.mkdir()
    with open(outside / "big.bin", "wb") as handle:  # 50 MB if a link were followed
        handle.seek(50_000_000)
        handle.write(b"!")
    (root / "link.txt").symlink_to(outside / "big.bin")
    (root / "linkdir").symlink_to(outside)
    with open(root / "sparse.bin", "wb") as handle:
        handle.seek(1_000_000)
        handle.write(b"!")
    scratch = root.parent / "scratch"
    scratch.mkdir()
    (scratch / "tmp.dat").write_bytes(b"t" * 7000)
    return scratch


def test_measure_is_snapshot_and_usage_in_one_walk(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    scratch = tree(root, tmp_path / "outside")
    measured = workdir.measure(root, [scratch])
    # Same files, same signatures, same order (the order produced files are reported in).
    assert list(measured.snapshot.items()) == list(workdir.snapshot(root).items())
    assert list(measured.snapshot) == [
        "sparse.bin",
        "z.txt",
        os.path.join("a", "one.csv"),
        os.path.join("b", "two.txt"),
        os.path.join("b", "deep", "three.bin"),
    ]
    assert measured.usage == workdir.usage([root, scratch])
    assert measured.usage.bytes >= 1_000_001 + 7000  # sparse counts in full, scratch too
    assert measured.usage.bytes < 2_000_000  # links are not followed


def test_measure_stops_once_over_the_entry_limit(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    for n in range(50):
        (root / f"f{n:02}.txt").write_text("x")
    measured = workdir.measure(root, [], stop_after=10)
    assert measured.usage.files == 11 and measured.usage.complete
    assert workdir.usage([root], stop_after=10) == measured.usage


def test_the_kernel_side_walk_follows_the_local_rules(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    tree(root, tmp_path / "outside")
    code = transfer.MEASURE % (workdir.USAGE_SECONDS, 0, workdir.MAX_SCAN_ENTRIES)
    ran = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    raw = json.loads(ran.stdout)
    local = workdir.measure(root, [])
    assert {name: tuple(sig) for name, sig in raw["files"].items()} == local.snapshot
    assert list(raw["files"]) == list(local.snapshot)
    assert raw["usage"] == [local.usage.bytes, local.usage.files, 1]
    # The old kernel-side snapshot, too, lists no link (it used to follow them).
    ran = subprocess.run(
        [sys.executable, "-I", "-c", transfer.SNAPSHOT % workdir.MAX_SCAN_ENTRIES],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert set(json.loads(ran.stdout)) == set(local.snapshot)
