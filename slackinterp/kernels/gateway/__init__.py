"""Kernels on a Jupyter Kernel/Enterprise Gateway: `backend` (REST + the channels WebSocket)
and `files` (a thread's files reached through its kernel, by the code in kernels/inside/).
"""
