"""Subscription tokens signed by a tenant's backend with its own private key: the public key is
registered (`pressroom tenants token-key`), the token names it by `kid`, and opens its scope
only, on SSE, the long-poll and Socket.IO alike; tokens may name up to 20 channels; removing a
key refuses its tokens and closes their streams; the alg confusions get 401."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import pytest
from aiohttp import ClientResponse, ClientSession
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from jwt.algorithms import ECAlgorithm

from server.access import apikeys, token_keys
from server.access.signing import MAX_TOKEN_CHANNELS
from server.channels import MAX_CHANNEL_CHARS
from server.cli import admin, tenant_settings
from server.events.hub import Hub, Subscription
from server.keys import HUB
from server.settings import Settings
from server.web import auth, credentials
from tests.conftest import RunningApp
from tests.processes import admin_cli
from tests.sio import SioClient
from tests.sse import messages
from tests.tenants import Tenant, bearer, made
from tests.tokenkeys import (
    claims,
    hs256_by_hand,
    mint,
    private_key,
    private_pem,
    public_pem,
)

ROOT = Path(__file__).resolve().parents[2]


class KeyedTenant(Tenant):
    """A tenant that has registered key pairs its backend signs tokens with."""

    def __init__(self, app: RunningApp, pool: asyncpg.Pool, name: str, key: str, secret: str):
        super().__init__(app, name, key, secret)
        self.pool = pool
        self.signers: dict[str, PrivateKeyTypes] = {}

    async def register(self, kid: str, kind: str) -> PrivateKeyTypes:
        """Make a key pair and register its public half under `kid`."""
        signer = private_key(kind)
        key = token_keys.read_public_key(public_pem(signer))
        await token_keys.add(self.pool, self.name, dataclasses.replace(key, kid=kid))
        self.signers[kid] = signer
        return signer

    def token(self, kid: str, scope: dict[str, Any], **kwargs: Any) -> str:
        return mint(self.signers[kid], self.name, scope, kid=kid, **kwargs)


async def new_tenant(app: RunningApp, pool: asyncpg.Pool, name: str) -> KeyedTenant:
    return KeyedTenant(app, pool, name, *await made(pool, name))


async def status(browser: ClientSession, url: str, token: str) -> tuple[int, str]:
    """What a request with `token` is answered: the status, and a problem's detail."""
    async with browser.get(url, params={"token": token}) as resp:
        if resp.status == 200 and resp.content_type == "text/event-stream":
            return 200, ""  # a stream: it opened, which is all that is asked here
        if resp.content_type == "application/problem+json":
            return resp.status, (await resp.json())["detail"]
        await resp.read()
        return resp.status, ""


async def sio_refusal(token: str, app: RunningApp) -> int:
    """The status a Socket.IO connection made with `token` is refused with."""
    client = SioClient()
    refusals: list[Any] = []
    client.client.on("connect_error", refusals.append)
    try:
        await client.connect(app.url("/"), auth={"token": token})
    except Exception:
        code: int = refusals[0]["data"]["status"]
        return code
    await client.close()
    return 200


@pytest.fixture
async def app(start_app: Callable[..., Any]) -> RunningApp:
    """Keyed mode (the tests make keys first), no worker: jobs stay queued; the cache off, so
    that what the database says counts for the very next request."""
    running: RunningApp = await start_app(render_slots=0)
    return running


async def test_a_backend_signed_token_opens_its_scope_and_nothing_else(
    app: RunningApp, pool: asyncpg.Pool, sio: Callable[[], SioClient]
) -> None:
    acme = await new_tenant(app, pool, "acme")
    for kid, kind in (("acme-rsa", "rsa"), ("acme-ec", "ec"), ("acme-ed", "ed25519")):
        await acme.register(kid, kind)
    in_a, in_b, in_c = await acme.submit("A"), await acme.submit("B"), await acme.submit("C")
    two = {"scope": "channels", "channels": ["A", "B"]}
    tokens = {
        "channels A and B": [acme.token(kid, two) for kid in acme.signers],
        "job in A": [acme.token("acme-ed", {"scope": "job", "job_id": in_a})],
        "tenant": [acme.token("acme-rsa", {"scope": "tenant"})],
    }
    streams = {
        "tenant stream": "/v1/events",
        "channel A": "/v1/events?channel=A",
        "channel B": "/v1/events?channel=B",
        "channel C": "/v1/events?channel=C",
        "job in A": f"/v1/jobs/{in_a}/events",
        "job in B": f"/v1/jobs/{in_b}/events",
        "job in C": f"/v1/jobs/{in_c}/events",
        "long-poll of job in A": f"/v1/jobs/{in_a}?wait=0",
        "long-poll of job in B": f"/v1/jobs/{in_b}?wait=0",
        "long-poll of job in C": f"/v1/jobs/{in_c}?wait=0",
    }
    opens = {
        "channels A and B": {n for n in streams if n.endswith(("A", "B"))} - {"tenant stream"},
        "job in A": {"job in A", "long-poll of job in A"},
        "tenant": set(streams),
    }
    async with ClientSession() as browser:  # no key: the token alone
        for name, minted in tokens.items():
            for token in minted:
                for target, path in streams.items():
                    got, _ = await status(browser, app.url(path), token)
                    assert got == (200 if target in opens[name] else 403), (name, target)
        # Nothing else: the other REST routes take no token, and the 403 says what it opens.
        token = tokens["channels A and B"][0]
        assert (await status(browser, app.url("/v1/jobs"), token))[0] == 401
        got, detail = await status(browser, app.url("/v1/events?channel=C"), token)
        assert (got, detail) == (
            403,
            "This subscription token opens channels 'A' and 'B' (their streams and their jobs) "
            "only.",
        )

    # Socket.IO: the same token opens the same things.
    client = sio()
    await client.connect(app.url("/"), auth={"token": tokens["channels A and B"][1]})
    for subscription, allowed in (
        ({"channel": "A", "since": 0}, True),
        ({"channel": "B"}, True),
        ({"job_id": in_b}, True),
        ({"channel": "C"}, False),
        ({"job_id": in_c}, False),
        ({"all": True}, False),
    ):
        ack = await client.call("subscribe", subscription)
        assert ack["ok"] is allowed, (subscription, ack)
        assert allowed or ack["error"]["status"] == 403
    emitted = await client.take_until(lambda n, d: n == "job" and d["job"]["id"] == in_a)
    assert all(d["job"]["channel"] == "A" for n, d in emitted if n == "job")


async def test_the_alg_confusions_are_refused(app: RunningApp, pool: asyncpg.Pool) -> None:
    acme, bob = await new_tenant(app, pool, "acme"), await new_tenant(app, pool, "bob")
    acme_ec = await acme.register("acme-ec", "ec")
    acme_rsa = await acme.register("acme-rsa", "rsa")
    bob_ec = await bob.register("bob-ec", "ec")
    stranger = ec.generate_private_key(ec.SECP256R1())
    scope = {"scope": "tenant"}
    body = claims("acme", scope)
    refused = {
        "alg none": jwt.encode(body, None, algorithm="none", headers={"kid": "acme-ec"}),
        "HS256 keyed with a registered public key's PEM": hs256_by_hand(
            {"kid": "acme-ec"}, body, public_pem(acme_ec)
        ),
        "HS256 keyed with the PEM, no kid": hs256_by_hand({}, body, public_pem(acme_rsa)),
        "a kid of another tenant's key": mint(bob_ec, "acme", scope, kid="bob-ec"),
        "another tenant's key and sub, with its own kid": mint(
            acme_ec, "bob", scope, kid="acme-ec"
        ),
        "RS256 naming an ES256 key": mint(acme_rsa, "acme", scope, kid="acme-ec"),
        "PS256 with the RSA key": mint(acme_rsa, "acme", scope, kid="acme-rsa", algorithm="PS256"),
        "an unknown kid": mint(acme_ec, "acme", scope, kid="nope"),
        "no kid": mint(acme_ec, "acme", scope, kid=None),
        "a key the token carries": jwt.encode(
            body,
            stranger,
            algorithm="ES256",
            headers={"kid": "acme-ec", "jwk": ECAlgorithm.to_jwk(stranger.public_key(), True)},
        ),
        "HS256 with a kid, signed with another tenant's secret": jwt.encode(
            body, bob.secret, algorithm="HS256", headers={"kid": "acme-ec"}
        ),
        "expired": acme.token("acme-ec", scope, ttl_s=-1),
    }
    async with ClientSession() as browser:
        for what, token in refused.items():
            async with browser.get(app.url("/v1/events"), params={"token": token}) as resp:
                assert resp.status == 401, what
                assert 'error="invalid_token"' in resp.headers["WWW-Authenticate"]
            assert await sio_refusal(token, app) == 401, what
        _, detail = await status(browser, app.url("/v1/events"), refused["an unknown kid"])
        assert detail == auth.UNKNOWN_KEY_TOKEN

        # Decided: HS256 is the secret's, and a kid on it is ignored (never looked up).
        for kid in ("acme-ec", "nope"):
            hs256 = jwt.encode(body, acme.secret, algorithm="HS256", headers={"kid": kid})
            assert (await status(browser, app.url("/v1/events"), hs256))[0] == 200
        # Each key opens its own tenant's streams.
        assert (await status(browser, app.url("/v1/events"), acme.token("acme-rsa", scope)))[
            0
        ] == 200
        bobs = bob.token("bob-ec", {"scope": "tenant"})
        assert (await status(browser, app.url("/v1/events"), bobs))[0] == 200
        acmes_job = await acme.submit()
        assert (await status(browser, app.url(f"/v1/jobs/{acmes_job}"), bobs))[0] == 404


async def until_closed(stream: ClientResponse) -> list[Any]:
    return [message async for message in messages(stream)]


async def test_removing_a_key_closes_its_streams_and_refuses_its_tokens_the_other_goes_on(
    start_app: Callable[..., Any],
    pool: asyncpg.Pool,
    sio: Callable[[], SioClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    acme = await new_tenant(app, pool, "acme")
    await acme.register("old", "ec")
    await acme.register("new", "ed25519")  # a rotation: two keys at once
    await acme.register("again", "rsa")
    channel_a = {"scope": "channel", "channel": "A"}
    old, new, again = (acme.token(kid, channel_a) for kid in ("old", "new", "again"))
    job = await acme.submit("A")
    async with ClientSession() as browser, asyncio.timeout(30):
        opened = [
            await browser.get(app.url("/v1/events?channel=A"), params={"token": token})
            for token in (old, new, again)
        ]
        assert [resp.status for resp in opened] == [200, 200, 200]
        on_sio = sio()
        await on_sio.connect(app.url("/"), auth={"token": old})
        await on_sio.subscribe(channel="A")
        # A long-poll subscribes to the job's events, with its watch, before it waits.
        hub, waiting = app.app[HUB], asyncio.Queue[str]()

        def subscribe(**kwargs: Any) -> Subscription:
            waiting.put_nowait(kwargs.get("transport", "sse"))
            return Hub.subscribe(hub, **kwargs)

        monkeypatch.setattr(hub, "subscribe", subscribe)
        poll = asyncio.create_task(status(browser, app.url(f"/v1/jobs/{job}?wait=25"), old))
        assert await waiting.get() == "longpoll"
        ending = asyncio.create_task(until_closed(opened[0]))

        assert await token_keys.remove(pool, "acme", "old")
        got = await ending
        # The job's job.queued may come first: it committed just before the stream opened, and
        # a stream opened without a cursor starts where its process's log reader is.
        assert [m.event for m in got if m.event != "job.queued"] == ["closed"]
        assert got[-1].event == "closed"
        assert got[-1].json["reason"] == credentials.KEY_REMOVED_REASON
        # As on SSE, the job's job.queued may come first.
        *before, (name, body) = await on_sio.take_until(lambda name, _body: name != "job")
        assert all(body["job"]["id"] == job for _name, body in before), before
        assert name == "closed" and body["reason"] == credentials.KEY_REMOVED_REASON
        await on_sio.disconnected.wait()
        assert (await poll)[0] == 401

        # The other keys' streams carry on.
        stream = messages(opened[1])
        await acme.submit("A")
        assert (await anext(stream)).json["job"]["channel"] == "A"
        assert await status(browser, app.url("/v1/events?channel=A"), old) == (
            401,
            auth.UNKNOWN_KEY_TOKEN,
        )
        assert (await status(browser, app.url("/v1/events?channel=A"), new))[0] == 200

        # A kid removed and added again names another key: the first key's streams close too.
        await token_keys.remove(pool, "acme", "again")
        await acme.register("again", "rsa")
        *events, last = await until_closed(opened[2])
        assert all(m.event == "job.queued" for m in events)  # the job submitted above
        assert (last.event, last.json["reason"]) == ("closed", credentials.KEY_REMOVED_REASON)
        assert (await status(browser, app.url("/v1/events?channel=A"), again))[0] == 401
        for resp in opened:
            resp.close()


async def test_post_tokens_takes_up_to_20_channels_and_refuses_more_or_repeats(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    acme = await new_tenant(app, pool, "acme")
    # The longest names: the token still fits in the URL of a stream.
    names = [f"{n:02}" + "c" * (MAX_CHANNEL_CHARS - 2) for n in range(MAX_TOKEN_CHANNELS)]
    job = await acme.submit(names[7])
    async with app.http.post(
        app.url("/v1/tokens"), json={"channels": names}, headers=bearer(acme.key)
    ) as resp:
        assert resp.status == 200, await resp.text()
        token = (await resp.json())["token"]
    minted = jwt.decode(token, acme.secret, ["HS256"])["pressroom"]
    assert minted == {"scope": "channels", "channels": sorted(names), "key": minted["key"]}
    async with ClientSession() as browser:
        for path in (f"/v1/events?channel={names[19]}", f"/v1/jobs/{job}/events"):
            assert (await status(browser, app.url(path), token))[0] == 200
        got, detail = await status(browser, app.url("/v1/events?channel=other"), token)
        assert got == 403 and "and 17 more (their streams and their jobs)" in detail

    for body, field in (
        ({"channels": [*names, "one-more"]}, "channels"),
        ({"channels": []}, "channels"),
        ({"channels": ["A", "B", "A"]}, "channels"),
        ({"channels": ["A", "not a channel"]}, "channels"),
        ({"channels": "A"}, "channels"),
        ({"channels": ["A"], "channel": "B"}, ""),
        ({"channels": ["A"], "job_id": job}, ""),
    ):
        async with app.http.post(
            app.url("/v1/tokens"), json=body, headers=bearer(acme.key)
        ) as resp:
            problem = await resp.json()
            assert resp.status == 422, body
            fields = [error["field"] for error in problem["errors"]]
            assert any(f.split(".")[0].split("[")[0] == field for f in fields), (body, problem)
    async with app.http.post(
        app.url("/v1/tokens"), json={"channels": ["A", "B", "A"]}, headers=bearer(acme.key)
    ) as resp:
        assert "named twice: A" in str(await resp.json())
    # One channel in a list is a channel token, as {"channel": …} gives.
    async with app.http.post(
        app.url("/v1/tokens"), json={"channels": ["A"]}, headers=bearer(acme.key)
    ) as resp:
        one = jwt.decode((await resp.json())["token"], acme.secret, ["HS256"])["pressroom"]
    assert one["scope"] == "channel" and one["channel"] == "A"


async def test_the_cli_registers_lists_and_removes_keys_and_the_docs_example_signs_for_one(
    app: RunningApp,
    pool: asyncpg.Pool,
    dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The round trip as docs/tokens.md tells it: its commands' files, its Python example."""
    acme = await new_tenant(app, pool, "acme")
    signer = private_key("ec")
    (tmp_path / "token-key.pem").write_bytes(private_pem(signer))
    (tmp_path / "token-key.pub.pem").write_bytes(public_pem(signer))
    other = private_key("rsa")
    (tmp_path / "other.pub.pem").write_bytes(public_pem(other))
    example = docs_example()
    kid = re.search(r'^KID = "([^"]+)"', example, re.MULTILINE)
    assert kid is not None, "the example names its kid"

    async def pressroom(*args: str) -> tuple[int, str, str]:
        return await admin_cli(dsn, tmp_path / "cli", "tenants", "token-key", "acme", *args)

    code, out, err = await pressroom("--add", str(tmp_path / "token-key.pub.pem"), "--kid", kid[1])
    assert (code, out) == (0, kid[1] + "\n"), err
    assert "ES256" in err and f'"kid": "{kid[1]}"' in err
    code, derived, err = await pressroom("--add", str(tmp_path / "other.pub.pem"))
    expected = token_keys.read_public_key(public_pem(other)).kid
    assert (code, derived) == (0, expected + "\n"), err
    code, listed, err = await pressroom("--list")
    assert code == 0, err
    rows = [line.split("\t") for line in listed.splitlines()]
    assert rows[0] == ["kid", "algorithm", "added"]
    assert [row[:2] for row in rows[1:]] == [[kid[1], "ES256"], [expected, "RS256"]]

    # The example, run as the docs give it, mints a token that opens what it names.
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(example, "docs/tokens.md", "exec"), namespace)
    token = namespace["token"]
    async with ClientSession() as browser:
        for channel, expected_status in (("user-42", 200), ("org-7", 200), ("user-43", 403)):
            got, _ = await status(browser, app.url(f"/v1/events?channel={channel}"), token)
            assert got == expected_status, channel

        # With `=`: a derived kid may start with "-", which argparse would take for an option.
        code, out, err = await pressroom(f"--remove={expected}")
        assert (code, out) == (0, ""), err
        assert "every server refuses the tokens signed with it" in err
        code, out, err = await pressroom(f"--remove={expected}")
        assert (code, out) == (1, "") and "no token key" in err
        code, listed, _err = await pressroom("--list")
        assert [line.split("\t")[0] for line in listed.splitlines()[1:]] == [kid[1]]
    assert acme.signers == {}  # every key of this test went through the CLI


def docs_example() -> str:
    """The one Python block of docs/tokens.md."""
    text = (ROOT / "docs" / "tokens.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "docs/tokens.md has one Python example"
    return str(blocks[0])


async def test_the_cli_refuses_what_is_not_a_public_key_and_changes_nothing(
    pool: asyncpg.Pool,
    make_settings: Callable[..., Settings],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = make_settings()
    await apikeys.create_key_and_tenant(pool, "acme")

    async def pressroom(*argv: str) -> tuple[int, str, str]:
        """The CLI's command, run here (the round trip test runs the real process)."""
        args = admin.build_parser().parse_args(["tenants", "token-key", *argv])
        code = await tenant_settings.run_tenants(settings, args)
        out, err = capsys.readouterr()
        return code, out, err

    signer = private_key("ed25519")
    files = {
        "private.pem": (private_pem(signer), "private key"),
        "garbage.pem": (b"hello", "expected one block: a PEM public key"),
        "small.pem": (
            public_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)),
            "1024 bits; RS256 takes 2048 to 4096",
        ),
    }
    for name, (content, said) in files.items():
        (tmp_path / name).write_bytes(content)
        code, out, err = await pressroom("acme", "--add", str(tmp_path / name))
        assert (code, out) == (2, ""), (name, err)
        assert said in err and err.count("\n") == 1, (name, err)
    code, out, err = await pressroom("acme", "--add", str(tmp_path / "missing.pem"))
    assert (code, out) == (2, "") and "cannot read" in err
    assert await pool.fetchval("SELECT count(*) FROM tenant_token_keys") == 0

    (tmp_path / "key.pem").write_bytes(public_pem(signer))
    assert (await pressroom("acme", "--add", str(tmp_path / "key.pem"), "--kid", "k1"))[0] == 0
    code, out, err = await pressroom("acme", "--add", str(tmp_path / "key.pem"), "--kid", "k2")
    assert (code, out) == (1, "") and "registered already, as kid 'k1'" in err
    (tmp_path / "other.pem").write_bytes(public_pem(private_key("ec")))
    code, out, err = await pressroom("acme", "--add", str(tmp_path / "other.pem"), "--kid", "k1")
    assert (code, out) == (1, "") and "has a key with kid 'k1' already" in err
    assert await pool.fetchval("SELECT count(*) FROM tenant_token_keys") == 1

    code, out, err = await pressroom("nobody", "--add", str(tmp_path / "other.pem"))
    assert (code, out) == (1, "") and "no API key" in err
    code, out, err = await pressroom("acme", "--list", "--kid", "k3")
    assert (code, out) == (2, "") and "--kid" in err
    with pytest.raises(SystemExit) as exited:
        admin.build_parser().parse_args(
            ["tenants", "token-key", "acme", "--remove", "k1", "--list"]
        )
    assert exited.value.code == 2
    with pytest.raises(SystemExit):
        admin.build_parser().parse_args(
            ["tenants", "token-key", "acme", "--add", "key.pem", "--kid", "has space"]
        )
    assert "a kid is 1-64 letters" in capsys.readouterr().err
