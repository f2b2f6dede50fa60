"""Code that runs inside a kernel to reach its working directory (gateway kernels).

The same rules as the local versions in kernels/workdir.py and kernels/local/files.py: links
never followed, hidden entries counted but not listed, walks bounded by entries and time.
Each is a %-template filled in by kernels/gateway/files.py and run as a silent cell.
"""

SNAPSHOT = r"""
def __si_snapshot():
    import json, os, stat
    found = {}
    for dirpath, dirnames, filenames in os.walk("."):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            found[os.path.relpath(path, ".")] = [st.st_size, st.st_mtime_ns]
            if len(found) >= %d:
                return json.dumps(found)
    return json.dumps(found)
print(__si_snapshot())
del __si_snapshot
"""

USAGE = r"""
def __si_usage(seconds, stop_after):
    import os, stat, time
    total = entries = 0
    end = time.monotonic() + seconds
    stack = ["."]
    while stack:
        try:
            listing = os.scandir(stack.pop())
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries %% 512 == 0 and time.monotonic() > end:
                    return total, entries, 0
                if stop_after and entries > stop_after:
                    return total, entries, 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used = info.st_blocks * 512
                if stat.S_ISREG(info.st_mode):
                    used = max(used, info.st_size)
                elif stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                total += used
    return total, entries, 1
print(*__si_usage(%r, %d))
del __si_usage
"""

MEASURE = r"""
def __si_measure(seconds, stop_after, max_listed):
    import json, os, stat, time
    found = {}
    total = entries = 0
    complete = 1
    end = time.monotonic() + seconds
    stack = [(".", ())]
    while stack:
        directory, parts = stack.pop()
        try:
            listing = os.scandir(directory)
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries %% 512 == 0 and time.monotonic() > end:
                    complete = 0
                    stack.clear()
                    break
                if stop_after and entries > stop_after:
                    stack.clear()
                    break
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used = info.st_blocks * 512
                visible = parts is not None and not entry.name.startswith(".")
                if stat.S_ISREG(info.st_mode):
                    used = max(used, info.st_size)
                    if visible and len(found) < max_listed:
                        key = tuple((1, p) for p in parts) + ((0, entry.name),)
                        name = os.path.join(*parts, entry.name)
                        found[key] = (name, [info.st_size, info.st_mtime_ns])
                elif stat.S_ISDIR(info.st_mode):
                    stack.append((entry.path, parts + (entry.name,) if visible else None))
                total += used
    listed = dict(found[k] for k in sorted(found))
    return json.dumps({"files": listed, "usage": [total, entries, complete]})
print(__si_measure(%r, %d, %d))
del __si_measure
"""

OPEN = r"""
def __si_open(name):
    import os
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    candidate, n = name, 0
    while os.path.exists(candidate):
        n += 1
        candidate = f"{stem}-{n}" + (f".{ext}" if ext else "")
    open(".slackinterp-upload", "wb").close()
    print(candidate)
__si_open(%r)
del __si_open
"""

APPEND = "open('.slackinterp-upload', 'ab').write(__import__('base64').b64decode(%r))"
FINISH = "__import__('os').replace('.slackinterp-upload', %r)"
READ = r"""
with open(%r, "rb") as __f:
    __f.seek(%d)
    print(__import__("base64").b64encode(__f.read(%d)).decode())
del __f
"""
WIPE = r"""
def __si_wipe():
    import os, shutil
    for name in os.listdir("."):
        path = os.path.join(".", name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
__si_wipe()
del __si_wipe
"""
