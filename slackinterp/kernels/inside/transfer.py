"""Code that runs inside a gateway kernel to move files in and out of its working directory.

Each is a small %-template filled in by kernels/gateway/files.py and run as a silent cell; the
walks (snapshot, usage, measure) are real code in walks.py, sent by source.
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
