"""Code that runs inside a kernel, sent to it by the bot: `figure_alt` (a plot's title as alt
text) and `transfer` (a gateway kernel's files: walks, reads and writes).
"""
