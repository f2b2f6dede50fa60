"""Egress by policy: what a sandboxed kernel may reach on the network, and how.

`policy` decides (pure: canonicalise the host, deny rules, then allow rules, before any DNS
lookup); `addresses` vets what an allowed name resolves to; `proxy` is the filtering proxy in
the bot's event loop with one Unix-socket listener per kernel (`head` parses a request's head,
`tunnel` carries an allowed connection's bytes, `shares` keeps the connection caps fair,
`journal` bounds each kernel's log); `relay` is the few lines the kernel runs to reach it from
inside its own network namespace; `service` ties them to the kernels, the settings and the
per-channel overrides in the store.
"""
