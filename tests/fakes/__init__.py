"""Loopback fakes of Slack and of an OpenAI-compatible model server."""

# How long a test waits for an event by default: generous, since a busy machine (a CPU hog
# beside the suite, a kernel's first start) stretches seconds into tens. Waits are event
# driven, so only a failing test waits it out.
WAIT_TIMEOUT = 60.0
