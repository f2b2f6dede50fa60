"""Code that runs inside a kernel, sent to it by the bot: `figure_alt` (a plot's title as alt
text), `walks` (a working directory's walks, also imported by the bot for its own disk) and
`transfer` (moving a gateway kernel's files in and out).
"""
