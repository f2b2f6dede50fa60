"""The kernel-side modules the warm template loads before it forks (template.INSIDE): under
the names the bot looks them up by, doing nothing at import a kernel must do for itself, and
found by a forked kernel instead of compiled again there, which still behaves as before."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slackinterp.kernels import inside, snapshots
from slackinterp.kernels.local import sandbox
from slackinterp.kernels.local.fork import client, template

LOAD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import template
missing = template.load_inside()
names = sorted(n for n in sys.modules if n.startswith("_slackinterp_"))
print(json.dumps({"missing": missing, "names": names, "threads": template.threads()}))
"""

# What a module body may call at import: building constants. Anything else (an environment,
# path, user or clock read, a file, a thread) would run in the template, for every kernel.
CONSTANT_CALLS = {"struct.Struct", "type", "threading.Lock", "threading.RLock", "frozenset"}


def test_the_template_loads_each_under_the_name_the_bot_uses() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(Path(client.TEMPLATE_FILE).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["missing"] == [] and found["threads"] == 1
    expected = {inside.named(module)[0] for module in template.INSIDE}
    assert set(found["names"]) == expected
    for name, _source in (snapshots.SNAPSHOT, snapshots.REBUILD, snapshots.FORKING):
        assert name in expected
    assert any(inside.named("sql")[0] in arg for arg in sandbox.KERNEL_ARGUMENTS)


@pytest.mark.parametrize("module", template.INSIDE)
def test_a_module_the_template_loads_only_defines_things_at_import(module: str) -> None:
    _name, source = inside.named(module)
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.FunctionDef | ast.ClassDef):
            continue  # their bodies run when called, in the kernel
        if isinstance(statement, ast.Import | ast.ImportFrom):
            continue
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # the docstring
        assert isinstance(statement, ast.Assign | ast.AnnAssign), ast.unparse(statement)
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                assert ast.unparse(node.func) in CONSTANT_CALLS, ast.unparse(node)
            if isinstance(node, ast.Attribute | ast.Name):
                assert ast.unparse(node) not in ("os", "sys", "time"), ast.unparse(statement)


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
@pytest.mark.xdist_group("forked_kernels")
async def test_a_forked_kernel_finds_them_loaded_and_starts_as_before(tmp_path: Path) -> None:
    """Loaded before its first cell (the template's copies), sql() not offered without a data
    socket (the exec_lines entry still decides, in the kernel), and a snapshot call uses the
    module already there."""
    from tests.forked_child import cell, fork_backend

    backend = fork_backend(tmp_path)
    try:
        kernel = await backend.start_kernel(tmp_path / "w")
        try:
            assert backend.start_mode == "fork"
            names = [inside.named(module)[0] for module in template.INSIDE]
            snapshot = snapshots.SNAPSHOT[0]
            probe = (
                "import sys, json\n"
                f"print(json.dumps([[n in sys.modules for n in {names!r}], 'sql' in globals(),"
                f" id(sys.modules.get({snapshot!r}))]))"
            )
            loaded, offered, module_id = json.loads(await cell(kernel, probe))
            assert loaded == [True] * len(names) and offered is False
            call = snapshots.call_code(snapshots.SNAPSHOT, "__name__")
            assert (await cell(kernel, call)).strip() == snapshot
            again = json.loads(await cell(kernel, probe))
            assert again[2] == module_id  # the same module: nothing compiled again
        finally:
            await kernel.shutdown()
    finally:
        await backend.close()
