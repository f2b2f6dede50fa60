"""Checks that FakeSlack speaks the wire protocol the real slack_sdk expects.

Every test drives the fake with the real ``AsyncWebClient`` / aiohttp
``SocketModeClient``; if an SDK upgrade changes how it calls Slack, these tests
fail first instead of the bot's own tests failing in confusing ways.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from .slack import FakeSlack

CHANNEL = "C1"


@pytest.fixture
async def socket_client(fake: FakeSlack) -> AsyncIterator[SocketModeClient]:
    """A real Socket Mode client that acks every request with an empty payload."""
    web_client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    sm = SocketModeClient(app_token=fake.app_token, web_client=web_client, ping_interval=1)
    received: list[SocketModeRequest] = []

    async def ack(client: SocketModeClient, req: SocketModeRequest) -> None:
        received.append(req)
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))

    sm.socket_mode_request_listeners.append(ack)  # type: ignore[arg-type]
    sm.received = received  # type: ignore[attr-defined]
    yield sm
    await sm.close()


# ----------------------------------------------------------------- Web API


async def test_auth_test_reports_bot_identity_and_scopes(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    fake.scopes = ["chat:write", "files:read"]
    resp = await client.auth_test()
    assert resp["user_id"] == fake.bot_user_id == "UBOT"
    assert resp["bot_id"] == "BBOT"
    assert resp["team_id"] == "T1"
    assert resp.headers["x-oauth-scopes"] == "chat:write,files:read"
    assert fake.calls_to("auth.test") == [{}]


async def test_wrong_token_is_invalid_auth(fake: FakeSlack) -> None:
    bad = AsyncWebClient(token="xoxb-wrong", base_url=fake.api_url)
    with pytest.raises(SlackApiError) as info:
        await bad.chat_postMessage(channel=CHANNEL, text="hi")
    assert info.value.response["error"] == "invalid_auth"


async def test_app_token_is_only_for_connections_open(fake: FakeSlack) -> None:
    app_client = AsyncWebClient(base_url=fake.api_url)
    resp = await app_client.apps_connections_open(app_token=fake.app_token)
    assert resp["url"].startswith(f"ws://127.0.0.1:{fake.port}/socket?")
    with pytest.raises(SlackApiError) as info:
        await app_client.apps_connections_open(app_token=fake.bot_token)
    assert info.value.response["error"] == "not_allowed_token_type"


async def test_post_update_and_replies(fake: FakeSlack, client: AsyncWebClient) -> None:
    root_ts, _ = await fake.user_message(CHANNEL, "please compute")
    posted = await client.chat_postMessage(channel=CHANNEL, thread_ts=root_ts, text="working")
    await client.chat_update(channel=CHANNEL, ts=posted["ts"], text="done: 42")

    replies = await client.conversations_replies(channel=CHANNEL, ts=root_ts)
    texts = [m["text"] for m in replies["messages"]]
    assert texts == ["please compute", "done: 42"]
    assert replies["messages"][1]["bot_id"] == fake.bot_id
    assert replies["messages"][0]["reply_count"] == 1
    assert [m["text"] for m in fake.edits(CHANNEL, posted["ts"])] == ["working"]
    assert float(posted["ts"]) > float(root_ts)

    link = await client.chat_getPermalink(channel=CHANNEL, message_ts=posted["ts"])
    assert link["permalink"].endswith(f"?thread_ts={root_ts}&cid={CHANNEL}")


async def test_msg_too_long_and_invalid_blocks(fake: FakeSlack, client: AsyncWebClient) -> None:
    with pytest.raises(SlackApiError) as info:
        await client.chat_postMessage(channel=CHANNEL, text="x" * 4001)
    assert info.value.response["error"] == "msg_too_long"

    section = {"type": "section", "text": {"type": "mrkdwn", "text": "y" * 3001}}
    with pytest.raises(SlackApiError) as info:
        await client.chat_postMessage(channel=CHANNEL, text="ok", blocks=[section])
    assert info.value.response["error"] == "invalid_blocks"

    many = [{"type": "divider"}] * 51
    with pytest.raises(SlackApiError) as info:
        await client.chat_postMessage(channel=CHANNEL, text="ok", blocks=many)
    assert info.value.response["error"] == "invalid_blocks"

    posted = await client.chat_postMessage(channel=CHANNEL, text="short")
    with pytest.raises(SlackApiError) as info:
        await client.chat_update(channel=CHANNEL, ts=posted["ts"], text="z" * 4001)
    assert info.value.response["error"] == "msg_too_long"
    assert fake.calls_to("chat.postMessage")[1]["blocks"] == [section]


async def test_unknown_method_is_recorded(fake: FakeSlack, client: AsyncWebClient) -> None:
    with pytest.raises(SlackApiError) as info:
        await client.api_call("chat.noSuchThing", json={"x": 1})
    assert info.value.response["error"] == "unknown_method"
    assert fake.calls_to("chat.noSuchThing") == [{"x": 1}]


async def test_reactions_status_and_ephemeral(fake: FakeSlack, client: AsyncWebClient) -> None:
    ts, _ = await fake.user_message(CHANNEL, "hi")
    await client.reactions_add(channel=CHANNEL, timestamp=ts, name="eyes")
    assert fake.reactions[(CHANNEL, ts)] == ["eyes"]
    await client.reactions_remove(channel=CHANNEL, timestamp=ts, name="eyes")
    assert fake.reactions[(CHANNEL, ts)] == []

    await client.assistant_threads_setStatus(channel_id=CHANNEL, thread_ts=ts, status="thinking")
    assert fake.statuses[-1]["status"] == "thinking"

    await client.chat_postEphemeral(channel=CHANNEL, user="U1", text="only you", thread_ts=ts)
    assert fake.ephemerals[-1]["text"] == "only you"
    assert [m["text"] for m in fake.thread(CHANNEL, ts)] == ["hi"]


async def test_chat_stream_helper(fake: FakeSlack, client: AsyncWebClient) -> None:
    ts, _ = await fake.user_message(CHANNEL, "stream please")
    streamer = await client.chat_stream(
        channel=CHANNEL,
        thread_ts=ts,
        recipient_team_id="T1",
        recipient_user_id="U1",
        buffer_size=5,
    )
    await streamer.append(markdown_text="hello ")
    await streamer.append(markdown_text="world")
    await streamer.stop()
    stream = fake.streams[streamer.ts]  # type: ignore[index]
    assert stream.text == "hello world" and stream.stopped
    assert fake.thread(CHANNEL, ts)[-1]["text"] == "hello world"


# ------------------------------------------------------------------ files


async def test_files_upload_v2_into_thread(fake: FakeSlack, client: AsyncWebClient) -> None:
    ts, _ = await fake.user_message(CHANNEL, "plot it")
    resp = await client.files_upload_v2(
        channel=CHANNEL,
        thread_ts=ts,
        content=b"\x89PNG fake",
        filename="plot.png",
        title="Plot",
        initial_comment="here you go",
    )
    assert resp["file"]["name"] == "plot.png"
    [upload] = fake.uploads
    assert (upload.filename, upload.title, upload.content) == ("plot.png", "Plot", b"\x89PNG fake")
    assert (upload.channel, upload.thread_ts) == (CHANNEL, ts)
    # How the SDK drove it: query-string params, then raw bytes to the upload URL.
    assert fake.calls_to("files.getUploadURLExternal")[0]["length"] == str(len(b"\x89PNG fake"))
    assert fake.upload_posts[0]["content_type"] == "application/octet-stream"
    file_message = fake.thread(CHANNEL, ts)[-1]
    assert file_message["text"] == "here you go"
    assert file_message["files"][0]["id"] == upload.file_id

    info = await client.files_info(file=upload.file_id)
    assert info["file"]["title"] == "Plot"


async def test_files_delete_removes_the_file_and_its_share(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    ts, _ = await fake.user_message(CHANNEL, "plot it")
    resp = await client.files_upload_v2(
        channel=CHANNEL, thread_ts=ts, content=b"png", filename="a.png", alt_txt="Sales"
    )
    file_id = resp["file"]["id"]
    assert fake.uploads[0].alt_txt == "Sales"
    assert len(fake.thread(CHANNEL, ts)) == 2
    await client.files_delete(file=file_id)
    assert fake.uploads[0].deleted and fake.live_uploads() == []
    assert len(fake.thread(CHANNEL, ts)) == 1  # the share message had nothing else
    with pytest.raises(SlackApiError) as err:
        await client.files_delete(file=file_id)
    assert err.value.response["error"] == "file_not_found"
    user_file = fake.add_user_file("theirs.csv", b"a", "text/csv")
    with pytest.raises(SlackApiError) as err:
        await client.files_delete(file=user_file["id"])
    assert err.value.response["error"] == "cant_delete_file"


async def test_table_block_limits(fake: FakeSlack, client: AsyncWebClient) -> None:
    def table(rows: int, cells: int) -> dict:
        row = [{"type": "raw_text", "text": "x"}] * cells
        return {"type": "table", "rows": [row] * rows}

    await client.chat_postMessage(channel=CHANNEL, text="t", blocks=[table(100, 20)])
    for blocks in ([table(101, 1)], [table(1, 21)], [table(1, 1), table(1, 1)]):
        with pytest.raises(SlackApiError) as err:
            await client.chat_postMessage(channel=CHANNEL, text="t", blocks=blocks)
        assert err.value.response["error"] == "invalid_blocks"
    bad_cell = {"type": "table", "rows": [[{"type": "mrkdwn", "text": "x"}]]}
    with pytest.raises(SlackApiError):
        await client.chat_postMessage(channel=CHANNEL, text="t", blocks=[bad_cell])


async def test_user_file_download_needs_bot_token(fake: FakeSlack) -> None:
    file_obj = fake.add_user_file("data.csv", b"a,b\n1,2\n", mimetype="text/csv", filetype="csv")
    url = file_obj["url_private_download"]
    async with aiohttp.ClientSession() as session:
        auth = {"Authorization": f"Bearer {fake.bot_token}"}
        async with session.get(url, headers=auth) as resp:
            assert resp.status == 200
            assert await resp.read() == b"a,b\n1,2\n"
        async with session.get(url, headers={"Authorization": "Bearer xoxb-wrong"}) as resp:
            assert resp.status == 200
            assert resp.content_type == "text/html"
            assert "<html" in await resp.text()
        fake.file_scope_missing = True
        async with session.get(url, headers=auth) as resp:
            assert resp.content_type == "text/html"


# ----------------------------------------------------------------- faults


async def test_429_is_retried_by_rate_limit_handler(fake: FakeSlack) -> None:
    client = AsyncWebClient(
        token=fake.bot_token,
        base_url=fake.api_url,
        retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=2)],
    )
    fake.fail("chat.postMessage", 429, retry_after=1)
    resp = await client.chat_postMessage(channel=CHANNEL, text="eventually")
    assert resp["ok"]
    assert len(fake.calls_to("chat.postMessage")) == 2
    assert [m["text"] for m in fake.history(CHANNEL)] == ["eventually"]


async def test_429_without_retry_handler_carries_retry_after(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    fake.fail("chat.postMessage", 429, retry_after=7)
    with pytest.raises(SlackApiError) as info:
        await client.chat_postMessage(channel=CHANNEL, text="x")
    assert info.value.response.status_code == 429
    assert info.value.response["error"] == "ratelimited"
    assert info.value.response.headers["Retry-After"] == "7"


async def test_error_fault_and_fail_rate(fake: FakeSlack, client: AsyncWebClient) -> None:
    fake.fail("chat.update", error="message_not_found")
    with pytest.raises(SlackApiError) as info:
        await client.chat_update(channel=CHANNEL, ts="1.2", text="x")
    assert info.value.response.status_code == 200
    assert info.value.response["error"] == "message_not_found"

    fake.fail_rate(1.0, statuses=(500,), seed=1)
    with pytest.raises(SlackApiError) as info:
        await client.auth_test()
    assert info.value.response.status_code == 500
    fake.fail_rate(0.0)
    assert (await client.auth_test())["ok"]


# ------------------------------------------------------------ Socket Mode


async def test_socket_mode_event_is_delivered_and_acked(
    fake: FakeSlack, socket_client: SocketModeClient
) -> None:
    await socket_client.connect()
    await fake.wait_socket_connected()
    ts, envelope_ids = await fake.user_message(CHANNEL, "hello <@UBOT>", thread_ts=None)
    assert len(envelope_ids) == 2  # message + app_mention
    for envelope_id in envelope_ids:
        assert await fake.wait_ack(envelope_id, timeout=5) is None
        assert fake.acks[envelope_id].latency < 5
    received = socket_client.received  # type: ignore[attr-defined]
    kinds = sorted(r.payload["event"]["type"] for r in received)
    assert kinds == ["app_mention", "message"]
    event = received[0].payload
    assert event["type"] == "event_callback"
    assert event["authorizations"][0]["user_id"] == "UBOT"
    assert received[0].payload["event"]["ts"] == ts


async def test_socket_mode_reconnects_after_drop(
    fake: FakeSlack, socket_client: SocketModeClient
) -> None:
    await socket_client.connect()
    await fake.wait_socket_connected()
    assert len(fake.calls_to("apps.connections.open")) == 1

    await fake.drop_socket()
    await fake.wait_for(lambda: fake.socket_connects >= 2 and fake.live_sockets == 1)
    assert len(fake.calls_to("apps.connections.open")) == 2

    envelope_id = await fake.send_event({"type": "reaction_added", "user": "U1"})
    await fake.wait_ack(envelope_id, timeout=5)
    received = socket_client.received  # type: ignore[attr-defined]
    assert received[-1].envelope_id == envelope_id


async def test_redelivery_keeps_event_id(fake: FakeSlack, socket_client: SocketModeClient) -> None:
    await socket_client.connect()
    await fake.wait_socket_connected()
    first = await fake.send_event({"type": "app_mention", "text": "<@UBOT> hi"})
    again = await fake.redeliver(first)
    await fake.wait_ack(again)
    a, b = socket_client.received  # type: ignore[attr-defined]
    assert a.payload["event_id"] == b.payload["event_id"]
    assert (b.retry_attempt, b.retry_reason) == (1, "timeout")


async def test_slash_command_and_button_payloads(
    fake: FakeSlack, socket_client: SocketModeClient, client: AsyncWebClient
) -> None:
    await socket_client.connect()
    await fake.wait_socket_connected()
    command_id = await fake.slash_command("/py", "1+1", channel=CHANNEL)
    await fake.wait_ack(command_id)
    posted = await client.chat_postMessage(
        channel=CHANNEL,
        text="run?",
        blocks=[
            {
                "type": "actions",
                "block_id": "b1",
                "elements": [
                    {
                        "type": "button",
                        "action_id": "run",
                        "text": {"type": "plain_text", "text": "Run"},
                        "value": "v",
                    }
                ],
            }
        ],
    )
    click_id = await fake.click_button("run", "v", message=posted["ts"], channel=CHANNEL)
    await fake.wait_ack(click_id)
    command, click = socket_client.received  # type: ignore[attr-defined]
    assert command.type == "slash_commands" and command.payload["command"] == "/py"
    assert command.payload["text"] == "1+1"
    action = click.payload["actions"][0]
    assert (action["action_id"], action["block_id"], action["value"]) == ("run", "b1", "v")

    async with aiohttp.ClientSession() as session:
        body = {"response_type": "in_channel", "text": "2"}
        async with session.post(command.payload["response_url"], json=body) as resp:
            assert resp.status == 200
    assert fake.responses[-1]["body"] == body
    assert fake.history(CHANNEL)[-1]["text"] == "2"


# --------------------------------------------------------------- HTTP mode


async def test_http_mode_posts_signed_requests(fake: FakeSlack) -> None:
    secret = "shh"
    verifier = SignatureVerifier(secret)
    seen: list[tuple[dict[str, str], str]] = []

    async def endpoint(request: web.Request) -> web.Response:
        body = await request.text()
        seen.append((dict(request.headers), body))
        if not verifier.is_valid_request(body, dict(request.headers)):
            return web.Response(status=401)
        if request.content_type == "application/json":
            return web.Response(text="")
        return web.json_response({"text": "ack"})

    app = web.Application()
    app.router.add_post("/slack/events", endpoint)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        fake.use_http(f"http://127.0.0.1:{port}/slack/events", secret)
        event_id = await fake.send_event({"type": "app_mention"}, retry_attempt=2)
        command_id = await fake.slash_command("/py", "x", channel=CHANNEL)
        assert await fake.wait_ack(event_id) is None
        assert await fake.wait_ack(command_id) == {"text": "ack"}
    finally:
        await runner.cleanup()
    assert fake.acks[event_id].status == 200
    event_headers, event_body = seen[0]
    assert event_headers["X-Slack-Retry-Num"] == "2"
    assert json.loads(event_body)["type"] == "event_callback"
    assert abs(int(event_headers["X-Slack-Request-Timestamp"]) - time.time()) < 60
    command_form = parse_qs(seen[1][1])
    assert command_form["command"] == ["/py"]
    # The slash-command ack body is shown to the user as an ephemeral message.
    assert fake.ephemerals[-1]["text"] == "ack"


async def test_wait_for_times_out_with_context(fake: FakeSlack) -> None:
    with pytest.raises(TimeoutError, match="condition not met"):
        await fake.wait_for(lambda: False, timeout=0.05)


async def test_replies_bounds_pages_and_parent(fake: FakeSlack, client: AsyncWebClient) -> None:
    root = fake.workspace.post(CHANNEL, author={"user": "U1"}, text="root")["ts"]
    ts = [
        fake.workspace.post(CHANNEL, author={"user": "U1"}, text=f"r{i}", thread_ts=root)["ts"]
        for i in range(6)
    ]
    page = await client.conversations_replies(
        channel=CHANNEL, ts=root, oldest=ts[1], latest=ts[5], limit=2
    )
    # The parent opens the first page even outside the bounds; both bounds are exclusive.
    assert [m["text"] for m in page["messages"]] == ["root", "r2"]
    assert page["has_more"]
    cursor = page["response_metadata"]["next_cursor"]
    page = await client.conversations_replies(
        channel=CHANNEL, ts=root, oldest=ts[1], latest=ts[5], limit=2, cursor=cursor
    )
    assert [m["text"] for m in page["messages"]] == ["r3", "r4"] and not page["has_more"]
    inclusive = await client.conversations_replies(
        channel=CHANNEL, ts=root, oldest=ts[4], latest=ts[5], inclusive=True
    )
    assert [m["text"] for m in inclusive["messages"]] == ["root", "r4", "r5"]
    fake.replies_max_limit = 3
    capped = await client.conversations_replies(channel=CHANNEL, ts=root, limit=100)
    assert len(capped["messages"]) == 3 and capped["has_more"]


async def test_edit_and_other_bot_events(fake: FakeSlack, socket_client: SocketModeClient) -> None:
    await socket_client.connect()
    ts, _ = await fake.user_message(CHANNEL, "plain")
    envelopes = await fake.edit_message(CHANNEL, ts, f"<@{fake.bot_user_id}> now")
    assert len(envelopes) == 2
    changed, mention = (fake.envelopes[e].payload["event"] for e in envelopes)
    assert changed["subtype"] == "message_changed" and changed["hidden"]
    assert changed["previous_message"]["text"] == "plain"
    assert changed["message"]["edited"]["user"] == "U1"
    assert mention["type"] == "app_mention" and mention["ts"] == ts and mention["edited"]
    assert (
        fake.envelopes[envelopes[0]].payload["event_id"]
        != fake.envelopes[envelopes[1]].payload["event_id"]
    )
    bot_ts = await fake.other_bot_message(CHANNEL, "beep", thread_ts=ts)
    message = fake.message(CHANNEL, bot_ts)
    assert message is not None and message["bot_id"] == "BOTHER" and message["thread_ts"] == ts
