"""A gateway kernel's working directory: where the bot's next cells run.

A plain gateway kernel sees the gateway's disk: it makes `<start>/slackinterp-threads/<name>`
and moves there. A kernel confined by the shipped kernelspec sees only its own directory at
$HOME: a new thread's directory there is the launcher's work (kernels/gateway/moves.py), asked
for through the FIFO in its runtime directory with the request the bot signed, and awaited.

A fork's copy of another thread's files is the launcher's work too (`fetch`): the kernel
passes on the bot's signed request and prints the launcher's answer for the bot.

Only definitions at import (kernels/inside/__init__.py): the bot calls `enter` and `fetch`.
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


def fetch(name: str, nonce: str, signature: str, timeout: float) -> None:
    """Ask the launcher to copy thread `name`'s folder into this one; print its answer."""
    import os
    import time

    runtime = "/run/kernel"
    fd = os.open(os.path.join(runtime, "move"), os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"copy {name} {nonce} {signature}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(runtime, "copied")) as handle:
                found, _, answer = handle.read().strip().partition(" ")
            if found == nonce:
                print(answer)
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError("the launcher did not copy the thread's folder")
