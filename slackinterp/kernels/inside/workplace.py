"""A gateway kernel's working directory: where the bot's next cells run.

A plain gateway kernel sees the gateway's disk: it makes `<start>/slackinterp-threads/<name>`
and moves there. A kernel confined by the shipped kernelspec sees only its own directory at
$HOME: a new thread's directory there is the launcher's work (kernels/gateway/moves.py), asked
for through the FIFO in its runtime directory with the request the bot signed, and awaited.

Only definitions at import (kernels/inside/__init__.py): the bot calls `enter`.
"""


def enter(root: str, name: str, signature: str, timeout: float) -> None:
    import os
    import time

    if os.environ.get("SLACKINTERP_CONFINED") != "kernelspec":
        start = os.environ.setdefault("SLACKINTERP_START_DIR", os.getcwd())
        where = os.path.join(start, root, name)
        os.makedirs(where, exist_ok=True)
        os.chdir(where)
        return
    home = os.environ["HOME"]
    if os.environ.get("SLACKINTERP_WORKDIR_NAME") != name:
        runtime = "/run/kernel"
        done = os.path.join(runtime, "moved")
        fd = os.open(os.path.join(runtime, "move"), os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, f"{name} {signature}\n".encode())
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(done) as handle:
                    if handle.read().strip() == name:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the working directory did not move")
            time.sleep(0.02)
        os.environ["SLACKINTERP_WORKDIR_NAME"] = name
    os.chdir(home)
