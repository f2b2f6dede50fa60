"""SQL data sources: named by an admin, queried by kernels through the bot, never directly.

`sources` (what is configured), `guard` (one reading statement), `readers` (read-only
execution per database, in threads, as Arrow batches), `wire` (the data socket's frames),
`listener` (one socket per kernel), `catalog` (the bounded summary the model gets) and
`service` (`DataSources`: channels, queries, audit). Like `kernels/` and `egress/`, it gets
its settings as constructor arguments from `runtime.py` and imports no config.
"""
