"""`slackinterp chat`: the same engine as the Slack bot, rendered in a terminal.

`chat` (the session, the input loop, Ctrl-C), `input` (line editing and history), `render`
(events to terminal text). Run one with `python -m slackinterp.console.chat`.
"""
