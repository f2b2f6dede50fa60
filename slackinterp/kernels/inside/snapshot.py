"""Inside a thread's kernel: its variables saved after a turn, loaded into its next kernel.

Sent to the kernel by source (kernels/snapshots.py), it runs inside the thread's sandbox: the
kernel writes its own snapshot and the thread's next kernel loads it, so a crafted pickle only
ever runs code in the sandbox of the thread that wrote it. The bot reads only the JSON line
each call prints.

`.slackinterp-snapshots/` in the working directory (hidden, so counted by the quota, not listed):
  blobs/<hash>   immutable and content-addressed: a variable's pickle (protocol 5) or one of its
                 out-of-band buffers, written once and shared by every generation that uses it
  gen-<n>.json   one generation: name → how to load it, and the last cell it includes

Only what changed is written (an unchanged buffer hashes to an existing blob; a costly variable
no cell named since the last save, still the same object, is not pickled again). Locks, open
files, sockets, generators and what fails to pickle are recorded as unsaved: rebuild.py re-runs
the cells that made them.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import io
import json
import mmap
import os
import pickle
import sys
import threading
import time
import types
from typing import Any

from IPython import get_ipython as _shell

DIR = ".slackinterp-snapshots"
FORMAT = 1
MARK = "slackinterp-snapshot:"
# Re-pickling a variable no cell named since the last save is skipped when it cost this much.
COSTLY = 0.02
_STATE: dict[str, Any] = {"root": None, "seen": {}, "pending": [], "hooked": False}


class _Unsaveable(Exception):
    """This object must not be pickled (or cannot be): the reason, for the notice."""


class _NeedsDill(Exception):  # a function or class defined in a cell: pickle would only name it
    pass


_LOCKS = (type(threading.Lock()), type(threading.RLock()))
_GENERATORS = (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)


def _why(obj: Any) -> str | None:
    """Why `obj` must not come back from a pickle; None when it may."""
    if isinstance(obj, _LOCKS):
        return "a lock"
    if isinstance(obj, io.IOBase):  # dill would reopen (and truncate) a file opened for writing
        return "an open file"
    if isinstance(obj, _GENERATORS):
        return "a generator"
    if isinstance(obj, threading.Thread):
        return "a thread"
    name = type(obj).__module__
    if name in ("socket", "ssl") or (name == "sqlite3" and type(obj).__name__ == "Connection"):
        return "a connection"
    return None


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        why = _why(obj)
        if why is not None:
            raise _Unsaveable(why)
        if isinstance(obj, (types.FunctionType, type)) and obj.__module__ == "__main__":
            raise _NeedsDill  # defined in a cell
        return NotImplemented


def _dill_pickler(dill: Any) -> Any:
    class DillPickler(dill.Pickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            why = _why(obj)
            if why is not None:
                raise _Unsaveable(why)
            return NotImplemented

    return DillPickler


def _dump(obj: Any) -> tuple[str, bytes, list[memoryview]]:
    """(kind, skeleton, out-of-band buffers): protocol 5 keeps array data out of the pickle."""
    try:
        return _dump_as("pickle", obj)
    except _NeedsDill:
        return _dump_as("dill", obj)


def _dump_as(kind: str, obj: Any, out_of_band: bool = True) -> tuple[str, bytes, list[memoryview]]:
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    callback = buffers.append if out_of_band else None
    if kind == "pickle":
        pickler: Any = _Pickler(out, protocol=5, buffer_callback=callback)
    else:
        try:
            import dill  # type: ignore[import-untyped]
        except ImportError:
            raise _Unsaveable("a function or class defined in a cell (no dill)") from None
        pickler = _dill_pickler(dill)(out, protocol=5, buffer_callback=callback)
    try:
        pickler.dump(obj)
    except (_NeedsDill, _Unsaveable):
        raise
    except RecursionError:
        raise _Unsaveable("too deeply nested to save") from None
    except Exception as exc:
        raise _Unsaveable(f"a {type(obj).__name__} that could not be saved") from exc
    try:
        views = [b.raw() for b in buffers]
    except BufferError:  # a non-contiguous buffer: keep everything inside the pickle
        return _dump_as(kind, obj, out_of_band=False)
    return kind, out.getvalue(), views


def _hash(data: Any) -> str:
    try:
        import xxhash

        return str(xxhash.xxh3_128_hexdigest(data))
    except ImportError:
        return hashlib.blake2b(data, digest_size=16).hexdigest()


def _root() -> str:
    if _STATE["root"] is None:  # the working directory when first used in this kernel
        _STATE["root"] = os.path.join(os.getcwd(), DIR)
    return str(_STATE["root"])


def _hook() -> None:
    """Collect the code of the user's cells (never the bot's silent ones) until the next save."""
    if _STATE["hooked"]:
        return

    def pre_run_cell(info: Any) -> None:
        if not getattr(info, "silent", False):
            _STATE["pending"].append(getattr(info, "raw_cell", "") or "")

    _shell().events.register("pre_run_cell", pre_run_cell)
    _STATE["hooked"] = True


def _user_names(ns: dict[str, Any], hidden: dict[str, Any]) -> dict[str, Any]:
    """The user's variables, by IPython's %who rule: no `_` names, nothing IPython put there."""
    return {
        name: value
        for name, value in list(ns.items())
        if not name.startswith("_") and not (name in hidden and hidden[name] is value)
    }


_READERS = frozenset({"len", "print", "repr", "str", "type", "id", "isinstance", "display"})


def _touched(ns: dict[str, Any]) -> set[str] | None:
    """Names the cells since the last save mention, and the globals the functions they name
    use; None: unknown (read everything)."""
    if not _STATE["hooked"]:
        return None
    names: set[str] = set()
    shell = _shell()
    for code in _STATE["pending"]:
        try:
            tree = ast.parse(shell.transform_cell(code))
        except SyntaxError:
            return None
        looked_at: set[int] = set()  # `len(x)`, `print(x)`: a builtin that only reads its argument
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in _READERS:
                looked_at.update(id(a) for a in node.args if isinstance(a, ast.Name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and id(node) not in looked_at:
                names.add(node.id)
            elif isinstance(node, ast.Global):
                names.update(node.names)
    todo = [ns[n] for n in names if n in ns and callable(ns[n])]
    seen: set[int] = set()
    while todo:
        code_obj = getattr(todo.pop(), "__code__", None)
        if code_obj is None or id(code_obj) in seen:
            continue
        seen.add(id(code_obj))
        for name in code_obj.co_names:
            names.add(name)
            if name in ns and callable(ns[name]):
                todo.append(ns[name])
    return names


def _write_blob(blobs: str, name: str, data: Any) -> None:
    path = os.path.join(blobs, name)
    if os.path.lexists(path):
        return
    temp = os.path.join(blobs, f".{name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(temp, path)


def _generations(root: str) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return found
    for name in names:
        if name.startswith("gen-") and name.endswith(".json") and name[4:-5].isdigit():
            try:
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    found[int(name[4:-5])] = json.load(f)
            except (OSError, ValueError):
                continue
    return found


def _drop_stale(root: str, since: int) -> dict[int, dict[str, Any]]:
    """Generations from before the thread's last reset (their cell is older than `since`)
    are gone; the rest, by number."""
    gens = _generations(root)
    for number, gen in list(gens.items()):
        if int(gen.get("cell", 0)) < since or gen.get("format") != FORMAT:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, f"gen-{number}.json"))
            del gens[number]
    return gens


def _collect(root: str, gens: dict[int, dict[str, Any]], keep: int, max_bytes: int) -> None:
    """Keep the newest `keep` generations, fewer when their blobs exceed `max_bytes`; delete
    blobs no kept generation uses."""
    blobs = os.path.join(root, "blobs")
    with os.scandir(blobs) as entries:
        sizes = {e.name: e.stat(follow_symlinks=False).st_size for e in entries}
    kept: list[int] = []
    used: set[str] = set()
    total = 0
    for number in sorted(gens, reverse=True):
        mine = {b for e in gens[number]["vars"].values() for b in e.get("blobs", ())}
        extra = sum(sizes.get(b, 0) for b in mine - used)
        if kept and (len(kept) >= keep or total + extra > max_bytes):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, f"gen-{number}.json"))
            continue
        kept.append(number)
        used |= mine
        total += extra
    with contextlib.suppress(OSError):
        for name in os.listdir(blobs):
            if name not in used:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(blobs, name))


def _write_gen(root: str, number: int, gen: dict[str, Any]) -> None:
    temp = os.path.join(root, f".gen-{number}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(gen, out)
    os.replace(temp, os.path.join(root, f"gen-{number}.json"))


def save(cell: int, since: int, keep: int, max_bytes: int) -> str:
    """Save the user's variables as a new generation that includes cell `cell`."""
    began = time.perf_counter()
    _hook()
    shell = _shell()
    ns = shell.user_ns
    root = _root()
    blobs = os.path.join(root, "blobs")
    os.makedirs(blobs, exist_ok=True)
    gens = _drop_stale(root, since)
    head = gens[max(gens)] if gens else None
    touched = _touched(ns)
    seen: dict[str, tuple[Any, dict[str, Any]]] = _STATE["seen"]
    entries: dict[str, dict[str, Any]] = {}
    pending: dict[str, Any] = {}  # blob → data to write
    by_id: dict[int, dict[str, Any]] = {}
    for name, value in _user_names(ns, shell.user_ns_hidden).items():
        if isinstance(value, io.IOBase) and value.closed:
            continue  # `with open(…) as f` leaves one behind: nothing worth a re-run
        old = seen.get(name)
        if old is not None and old[0] is value and head and head["vars"].get(name) == old[1]:
            costly = old[1].get("cost", 0.0) >= COSTLY
            if touched is not None and name not in touched and costly:
                entries[name] = old[1]
                continue
        if id(value) in by_id:  # another name for the same object: loaded once, shared
            entries[name] = by_id[id(value)]
            continue
        entries[name] = by_id[id(value)] = _entry(value, pending, max_bytes)
    # Over the cap: the largest new variables wait for replay instead.
    total = sum(len(d) for d in pending.values())
    over: list[str] = []
    for name, entry in sorted(entries.items(), key=lambda kv: -kv[1].get("size", 0)):
        if total <= max_bytes:
            break
        if entry.get("blobs") and any(b in pending for b in entry["blobs"]):
            total -= sum(len(pending.pop(b, b"")) for b in entry["blobs"])
            entries[name] = {"k": "unsaved", "why": "over the snapshot size cap", "cap": 1}
            over.append(name)
    written = 0
    for blob, data in pending.items():
        if not os.path.lexists(os.path.join(blobs, blob)):
            _write_blob(blobs, blob, data)
            written += len(data)
    number = max(gens) + 1 if gens else 1
    gen = {
        "format": FORMAT,
        "cell": cell,
        "prev": max(gens) if gens else 0,
        "python": list(sys.version_info[:2]),
        "vars": entries,
        "saved_at": time.time(),
    }
    _write_gen(root, number, gen)
    gens[number] = gen
    _collect(root, gens, keep, max_bytes)
    _STATE["seen"] = {n: (ns[n], e) for n, e in entries.items() if e["k"] != "unsaved"}
    _STATE["pending"] = []
    unsaved = {n: e["why"] for n, e in entries.items() if e["k"] == "unsaved"}
    seconds = time.perf_counter() - began
    return _report(generation=number, variables=len(entries), written=written, over_cap=over,
                   seconds=seconds, unsaved=unsaved)  # fmt: skip


def _entry(value: Any, pending: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    if isinstance(value, types.ModuleType):
        return {"k": "module", "name": value.__name__}
    began = time.perf_counter()
    try:
        kind, skeleton, views = _dump(value)
    except _Unsaveable as exc:
        return {"k": "unsaved", "why": str(exc)}
    size = len(skeleton) + sum(v.nbytes for v in views)
    if size > max_bytes:
        return {"k": "unsaved", "why": "over the snapshot size cap", "cap": 1}
    names = []
    for data in (skeleton, *views):
        blob = _hash(data)
        pending.setdefault(blob, data)
        names.append(blob)
    return {"k": kind, "blobs": names, "size": size, "cost": time.perf_counter() - began}


def _load_entry(root: str, entry: dict[str, Any]) -> Any:
    blobs = os.path.join(root, "blobs")
    names = [str(b) for b in entry["blobs"]]
    if not names or not all(len(n) == 32 and n.isalnum() for n in names):
        raise ValueError("bad blob name")
    with open(os.path.join(blobs, names[0]), "rb") as f:
        skeleton = f.read()
    buffers: list[Any] = []
    for name in names[1:]:
        fd = os.open(os.path.join(blobs, name), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            # A private, copy-on-write map: loaded lazily, writable, never written back.
            buffers.append(mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else bytearray())
        finally:
            os.close(fd)
    loads = __import__("dill").loads if entry["k"] == "dill" else pickle.loads
    return loads(skeleton, buffers=buffers)


def _head(root: str, since: int) -> tuple[int, dict[str, Any]] | None:
    return (max(gens), gens[max(gens)]) if (gens := _drop_stale(root, since)) else None


def load(since: int) -> str:
    """Load the newest generation into this (new) kernel. What it could not hold is named in
    the answer (`unsaved`): kernels/inside/rebuild.py re-runs the cells that made it."""
    began, cpu = time.perf_counter(), time.process_time()
    _hook()
    root = _root()
    found = _head(root, since)
    if found is None:
        return _report(found=False)
    number, gen = found
    if list(gen.get("python", ())) != list(sys.version_info[:2]):
        return _report(found=False, why="made by another Python version")
    ns = _shell().user_ns
    restored, unsaved = _assign(root, gen["vars"], ns, keep_live=False)
    _STATE["seen"] = {
        n: (ns[n], e) for n, e in gen["vars"].items() if e["k"] != "unsaved" and n in ns
    }
    _STATE["pending"] = []
    return _report(
        found=True,
        generation=number,
        cell=int(gen["cell"]),
        restored=restored,
        unsaved=unsaved,
        seconds=time.perf_counter() - began,
        cpu=time.process_time() - cpu,  # the kernel's own CPU: the time on an idle machine
    )


def _assign(
    root: str, entries: dict[str, dict[str, Any]], ns: dict[str, Any], *, keep_live: bool
) -> tuple[int, dict[str, str]]:
    """Put the generation's variables into `ns`; (how many, {unsaved name: why}). With
    `keep_live`, a variable whose live object is the one this kernel saved stays as it is."""
    seen: dict[str, tuple[Any, dict[str, Any]]] = _STATE["seen"]
    loaded: dict[tuple[str, ...], Any] = {}
    restored = 0
    unsaved: dict[str, str] = {}
    for name, entry in entries.items():
        if not name.isidentifier():
            continue
        try:
            if entry["k"] == "module":
                ns[name] = importlib.import_module(str(entry["name"]))
            elif entry["k"] in ("pickle", "dill"):
                old = seen.get(name)
                live = old is not None and old[1] == entry and ns.get(name) is old[0]
                if not (keep_live and live):
                    blobs = tuple(entry["blobs"])
                    if blobs not in loaded:
                        loaded[blobs] = _load_entry(root, entry)
                    ns[name] = loaded[blobs]
            else:
                unsaved[name] = str(entry.get("why", "could not be saved"))
                continue
            restored += 1
        except Exception as exc:
            unsaved[name] = f"could not be loaded ({type(exc).__name__})"
    return restored, unsaved


def undo(since: int) -> str:
    """Back to the generation before the newest: changed variables load, new ones go, the rest
    stay as they are. The newest generation is deleted."""
    _hook()
    began = time.perf_counter()
    root = _root()
    found = _head(root, since)
    if found is None:
        return _report(undone=False)
    number, head = found
    previous = int(head.get("prev", -1))
    if previous == 0:
        target: dict[str, Any] = {"vars": {}, "cell": 0}
    else:
        gens = _generations(root)
        if previous not in gens or int(gens[previous].get("cell", 0)) < since:
            return _report(undone=False)
        target = gens[previous]
    shell = _shell()
    ns = shell.user_ns
    for name in _user_names(ns, shell.user_ns_hidden):
        if name not in target["vars"]:
            del ns[name]
    changed, unsaved = _assign(root, target["vars"], ns, keep_live=True)
    kept = sorted(n for n in unsaved if n in ns)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(root, f"gen-{number}.json"))
    _STATE["seen"] = {
        n: (ns[n], e) for n, e in target["vars"].items() if e["k"] != "unsaved" and n in ns
    }
    _STATE["pending"] = []
    return _report(
        undone=True,
        cell=int(target["cell"]),
        undone_cell=int(head["cell"]),
        variables=changed,
        kept=kept,
        lost=sorted(n for n in unsaved if n not in ns),
        seconds=time.perf_counter() - began,
    )


def _report(**fields: Any) -> str:
    return MARK + json.dumps(fields)
