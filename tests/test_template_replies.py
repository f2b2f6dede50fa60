"""The template (which imports nothing of slackinterp) and the bot agree on why a fork was
refused: every `why` the template can send is a TemplateFailure the bot acts on."""

from __future__ import annotations

import ast

from slackinterp.kernels.local.fork import client


def test_every_why_the_template_sends_is_a_failure_the_bot_knows() -> None:
    tree = ast.parse(client.TEMPLATE_FILE.read_text())
    sent = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.startswith("WHY_")
        and isinstance(node.value, ast.Constant)
    }
    assert set(sent) == {"WHY_THREADS", "WHY_STALE", "WHY_FORK"}
    assert {client.TemplateFailure(value) for value in sent.values()} == {
        client.TemplateFailure.THREADS,
        client.TemplateFailure.STALE,
        client.TemplateFailure.FORK,
    }
    # Each reply names its why through a constant, never a bare string.
    replies = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "why" for k in node.keys)
    ]
    assert replies, "the template's refusals carry a why"
    for reply in replies:
        why = reply.values[[getattr(k, "value", None) for k in reply.keys].index("why")]
        assert isinstance(why, ast.Name) and why.id in sent


def test_an_unknown_why_is_a_failed_fork() -> None:
    assert client.TemplateFailure.of_reply("stale") is client.TemplateFailure.STALE
    assert client.TemplateFailure.of_reply("from-a-newer-template") is client.TemplateFailure.FORK
    assert client.TemplateFailure.of_reply(None) is client.TemplateFailure.FORK
