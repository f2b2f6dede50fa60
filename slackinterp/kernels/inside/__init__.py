"""Code that runs inside a kernel, sent to it by the bot: `figure_alt` (a plot's title as alt
text), `transfer` (a gateway kernel's files: walks, reads and writes), `snapshot` and `rebuild`
(a thread's variables saved and loaded by its own kernel: kernels/snapshots.py).
"""
