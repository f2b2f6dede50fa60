"""`sql()` and `%%sql` inside a kernel: ask the bot, over this kernel's own data socket.

This module's source runs inside kernels, as a module of its own (named by its content, see
kernels/inside/__init__.py); an exec_lines entry calls `_install`, and only `sql` and the
magic reach the user's namespace. It holds no credential and no address: the socket in the
kernel's private runtime directory is the whole way out, and the bot decides per query what
the thread's channel may read (slackinterp/datasources). The frame format is
datasources/wire.py's, repeated here by value: this file must not import slackinterp.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from typing import Any

SOCKET_VARIABLE = "SLACKINTERP_DATA_SOCKET"
HEADER = struct.Struct(">cQ")
SCHEMA, BATCH, END, ERROR = b"S", b"B", b"E", b"X"


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

    path = os.environ.get(SOCKET_VARIABLE)
    if not path:
        raise SQLError("no data sources are configured for this bot")
    if not isinstance(query, str):
        raise TypeError("sql() takes the query as a string")
    request = {"sql": query, "source": source, "max_rows": max_rows}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        schema = None
        batches = []
        while True:
            kind, size = HEADER.unpack(_read_exact(sock, HEADER.size))
            body = _read_exact(sock, size)
            if kind == SCHEMA:
                schema = pa.ipc.read_schema(pa.py_buffer(body))
            elif kind == BATCH:
                batches.append(pa.ipc.read_record_batch(pa.py_buffer(body), schema))
            elif kind == ERROR:
                raise SQLError(json.loads(body)["message"])
            elif kind == END:
                trailer = json.loads(body)
                break
            else:
                raise SQLError("the bot's answer was not understood")
    except OSError as exc:
        raise SQLError(f"could not reach the bot's data socket: {exc.strerror or exc}") from None
    finally:
        sock.close()
    table = pa.Table.from_batches(batches, schema=schema)
    del batches
    frame = _to_pandas(table)
    frame.attrs["sql"] = trailer
    if trailer.get("capped"):
        print(f"sql: {trailer['capped']}; {trailer['rows']:,} rows returned", file=sys.stderr)
    return frame


def _to_pandas(table: Any) -> Any:
    import pandas as pd
    import pyarrow as pa

    options: dict[str, Any] = {"split_blocks": True, "self_destruct": True}
    if int(pd.__version__.split(".", 1)[0]) < 3:  # pandas 2: pyarrow-backed strings are ~50x faster
        strings = pd.StringDtype("pyarrow")
        options["types_mapper"] = {pa.string(): strings, pa.large_string(): strings}.get
    return table.to_pandas(**options)


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


def _install() -> None:
    """Run by the kernel's exec_lines entry, never at import: a forked kernel's template loads
    this module before the fork, with no kernel's environment or shell yet."""
    if not os.environ.get(SOCKET_VARIABLE):
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    sql.__module__ = "slackinterp"
    SQLError.__module__ = "slackinterp"
    shell.user_ns["sql"] = sql
    shell.user_ns["SQLError"] = SQLError
    shell.user_ns_hidden["sql"] = sql
    shell.user_ns_hidden["SQLError"] = SQLError
    shell.register_magic_function(_magic, magic_kind="line_cell", magic_name="sql")
