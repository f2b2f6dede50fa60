"""Kernels forked from a warm template (SLACKINTERP_KERNEL_START=fork|auto).

`template` runs in the kernel's interpreter (standard library only, imports nothing of
slackinterp); `client` is the bot's side of its control socket and a jupyter_client
provisioner; `starter` decides fork or spawn and starts a forked kernel.
"""
