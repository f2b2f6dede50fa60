"""`sql()` and `%%sql` inside a kernel: ask the bot, over this kernel's own connection.

This module's source runs inside kernels, as a module of its own (named by its content, see
kernels/inside/__init__.py); the bot calls `_install` (an exec_lines entry for a local
kernel, a silent cell for a gateway's), and only `sql` and the magic reach the user's
namespace. It holds no credential and no address. Two ways out, the same frames on both:
- a local sandboxed kernel's data socket in its private runtime directory;
- every other kernel's own Jupyter connection: a comm (COMM_TARGET). The request goes out on
  iopub; the bot answers on a kernel subshell of its own (ipykernel 7), whose thread hands
  the frames to this cell while the cell waits (the main shell is busy running it). Nothing
  to reach but the connection the bot opened, so it works wherever the kernel runs.
The bot decides per query what the thread's channel may read (slackinterp/datasources). The
frame format is datasources/wire.py's, repeated here by value: this file must not import
slackinterp.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from typing import Any, cast

SOCKET_VARIABLE = "SLACKINTERP_DATA_SOCKET"
HEADER = struct.Struct(">cQ")
SCHEMA, BATCH, END, ERROR = b"S", b"B", b"E", b"X"
COMM_TARGET = "slackinterp.data"  # kernels/datachannel.py answers it
# Seconds without a word from the bot before a query gives up (the bot's own timeout, 60 s by
# default, ends a slow query long before).
COMM_PATIENCE = 600.0
_LINK: dict[str, Any] = {}  # "comm": this kernel's _CommLink, once _install(comm=True) ran


class SQLError(Exception):
    """The query was refused or failed: the database's own message, or the bot's."""


def _read_exact(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], min(size - got, 1 << 22))
        if not n:
            raise SQLError("the bot closed the data connection (was the kernel restarted?)")
        got += n
    return buffer


def sql(query: str, source: str | None = None, *, max_rows: int | None = None) -> Any:
    """Run one read-only SELECT on a data source of this channel; a pandas DataFrame.

    The bot runs the query (credentials never enter this kernel) and streams the result as
    Arrow batches. `source` may be left out when the channel has one source. The frame's
    `attrs["sql"]` holds rows, seconds and whether a cap cut the result."""
    import pyarrow as pa

    if not isinstance(query, str):
        raise TypeError("sql() takes the query as a string")
    request = {"sql": query, "source": source, "max_rows": max_rows}
    link = _LINK.get("comm")
    path = os.environ.get(SOCKET_VARIABLE)
    if link is not None:
        schema, batches, trailer = link.ask(request)
    elif path:
        schema, batches, trailer = _ask_socket(path, request)
    else:
        raise SQLError("no data sources are configured for this bot")
    table = pa.Table.from_batches(batches, schema=schema)
    del batches
    frame = _to_pandas(table)
    frame.attrs["sql"] = trailer
    if trailer.get("capped"):
        print(f"sql: {trailer['capped']}; {trailer['rows']:,} rows returned", file=sys.stderr)
    return frame


def _frames(read_exact: Any) -> tuple[Any, list[Any], dict[str, Any]]:
    """The answer's frames, read with `read_exact(size)`: schema, batches, trailer."""
    import pyarrow as pa

    schema = None
    batches = []
    while True:
        kind, size = HEADER.unpack(bytes(read_exact(HEADER.size)))
        body = read_exact(size)
        if kind == SCHEMA:
            schema = pa.ipc.read_schema(pa.py_buffer(body))
        elif kind == BATCH:
            batches.append(pa.ipc.read_record_batch(pa.py_buffer(body), schema))
        elif kind == ERROR:
            raise SQLError(json.loads(bytes(body))["message"])
        elif kind == END:
            return schema, batches, json.loads(bytes(body))
        else:
            raise SQLError("the bot's answer was not understood")


def _ask_socket(path: str, request: dict[str, Any]) -> tuple[Any, list[Any], dict[str, Any]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        return _frames(lambda size: _read_exact(sock, size))
    except OSError as exc:
        raise SQLError(f"could not reach the bot's data socket: {exc.strerror or exc}") from None
    finally:
        sock.close()


class _CommLink:
    """This kernel's data comm: requests out on iopub, answers in on the bot's subshell.

    The bot's messages arrive on its subshell's thread (`_arrived`), each with the query's
    id, the answering connection's token (`by`) and a piece of the answer's byte stream as a
    buffer; the waiting cell reads them from its query's queue and acknowledges each piece, so
    the bot never has more than its window in flight. iopub reaches every connection to the
    kernel (a bot replica that served it before may still hold one): the first connection to
    answer a query keeps it, and any other is told to stop."""

    def __init__(self) -> None:
        import queue
        import threading

        from comm import create_comm

        self.queue_type = queue.SimpleQueue
        self.empty = queue.Empty
        self.lock = threading.Lock()
        self.waiting: dict[str, Any] = {}
        self.comm: Any = cast(Any, create_comm(target_name=COMM_TARGET, data={}))
        # ipykernel sends a comm's replies to the subshell its last message came from: this
        # cell's main shell, busy until sql() returns. The bot names its own subshell.
        self.comm._reply_subshell_for = lambda _data, default: default
        self.comm.on_msg(self._arrived)

    def _arrived(self, msg: dict[str, Any]) -> None:
        data = msg.get("content", {}).get("data") or {}
        ident, by = str(data.get("id")), data.get("by")
        with self.lock:
            entry = self.waiting.get(ident)
            if entry is None:
                return
            if entry[1] is None:
                entry[1] = by
            mine = entry[1] == by
        if mine:
            entry[0].put(list(msg.get("buffers") or []))
        else:
            self.comm.send({"cancel": ident, "by": by})

    def ask(self, request: dict[str, Any]) -> tuple[Any, list[Any], dict[str, Any]]:
        import uuid

        ident = uuid.uuid4().hex
        entry: list[Any] = [self.queue_type(), None]  # the answers, who answers
        with self.lock:
            self.waiting[ident] = entry

        def ack(n: int) -> None:
            self.comm.send({"ack": ident, "n": n, "by": entry[1]})

        pieces = _Pieces(entry[0], self.empty, ack)
        done = False
        try:
            self.comm.send({"query": request, "id": ident})
            found = _frames(pieces.read_exact)
            done = True
            return found
        finally:
            with self.lock:
                self.waiting.pop(ident, None)
            if not done:  # interrupted or failed: the bot stops sending
                self.comm.send({"cancel": ident})


class _Pieces:
    """The answer's byte stream, read across the pieces the bot sent (one acknowledged per
    message); a frame inside one piece is returned without a copy."""

    def __init__(self, answers: Any, empty: type[Exception], ack: Any) -> None:
        self.answers = answers
        self.empty = empty
        self.ack = ack
        self.piece: memoryview = memoryview(b"")
        self.at = 0

    def _next(self) -> None:
        try:
            buffers = self.answers.get(timeout=COMM_PATIENCE)
        except self.empty:
            raise SQLError(f"the bot did not answer for {COMM_PATIENCE:.0f} s") from None
        self.ack(1)
        self.piece = memoryview(
            b"".join(bytes(b) for b in buffers) if len(buffers) != 1 else buffers[0]
        ).cast("B")
        self.at = 0

    def read_exact(self, size: int) -> Any:
        if self.at == len(self.piece):
            self._next()
        if len(self.piece) - self.at >= size:
            found = self.piece[self.at : self.at + size]
            self.at += size
            return found
        out = bytearray(size)
        got = 0
        while got < size:
            if self.at == len(self.piece):
                self._next()
            n = min(size - got, len(self.piece) - self.at)
            out[got : got + n] = self.piece[self.at : self.at + n]
            got += n
            self.at += n
        return out


def _to_pandas(table: Any) -> Any:
    import pandas as pd
    import pyarrow as pa

    options: dict[str, Any] = {"split_blocks": True, "self_destruct": True}
    if int(pd.__version__.split(".", 1)[0]) < 3:  # pandas 2: pyarrow-backed strings are ~50x faster
        strings = pd.StringDtype("pyarrow")
        options["types_mapper"] = {pa.string(): strings, pa.large_string(): strings}.get
    return table.to_pandas(**options)


def _no_subshells(*_args: Any, **_kwargs: Any) -> Any:
    """sql() in a kernel that cannot take the bot's answer while a cell runs."""
    raise SQLError(
        "sql() needs kernel subshells (ipykernel 7 or later) in this kernel's environment; "
        "ask the bot's admin to upgrade ipykernel there"
    )


def _magic(line: str, cell: str | None = None) -> Any:
    """`%%sql [NAME] [--source S] [--max-rows N]` runs the cell's SQL; with NAME the frame is
    bound to it (and not shown), without it the frame is the cell's result. `%sql SELECT …`
    on one line returns the frame."""
    from IPython import get_ipython

    if cell is None:
        return sql(line)
    words = line.split()
    name = source = None
    max_rows = None
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("--source", "-s") and i + 1 < len(words):
            source, i = words[i + 1], i + 2
        elif word == "--max-rows" and i + 1 < len(words):
            max_rows, i = int(words[i + 1]), i + 2
        elif name is None and word.isidentifier():
            name, i = word, i + 1
        else:
            raise SQLError(f"%%sql: did not understand {word!r} (%%sql [NAME] [--source S])")
    frame = sql(cell, source, max_rows=max_rows)
    if name is None:
        return frame
    shell = get_ipython()
    if shell is not None:
        shell.user_ns[name] = frame
    return None


def _install(comm: bool = False) -> None:
    """Run by the kernel's exec_lines entry (the data socket) or by the bot's silent cell
    (`comm`), never at import: a forked kernel's template loads this module before the fork,
    with no kernel's environment or shell yet."""
    if not comm and not os.environ.get(SOCKET_VARIABLE):
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    if comm and "comm" not in _LINK:
        kernel = getattr(shell, "kernel", None)
        if not getattr(kernel, "_supports_kernel_subshells", False):
            shell.user_ns["sql"] = _no_subshells
            return
        _LINK["comm"] = _CommLink()
    sql.__module__ = "slackinterp"
    SQLError.__module__ = "slackinterp"
    shell.user_ns["sql"] = sql
    shell.user_ns["SQLError"] = SQLError
    shell.user_ns_hidden["sql"] = sql
    shell.user_ns_hidden["SQLError"] = SQLError
    shell.register_magic_function(_magic, magic_kind="line_cell", magic_name="sql")
