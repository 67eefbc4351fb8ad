"""web_fetch never reaches a service of this machine, even on an address that is public.

A server bound to every interface (``0.0.0.0`` or ``::``: the ops port when an operator opens it, a
local model server, a database) answers on the machine's public addresses too, and those pass every
range check. The test gives a network namespace of its own a public IPv4 and IPv6 address on its
loopback interface, so the machine's own public address exists without touching the real network,
and runs the fetch in there (``python -m tests.bot.tools.test_web_fetch_own_address HOST``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import httpx
import pytest

from bot.tools import ToolContext, ToolError
from bot.tools.web_fetch import WebFetchTool
from tests.bot.tools.test_web_fetch import start

OWN_V4 = "1.2.3.4"  # public addresses, given only to the test's own network namespace
OWN_V6 = "2a00:1450::1"
NAMESPACE = ["unshare", "--user", "--map-root-user", "--net"]
SETUP = f"ip link set lo up && ip addr add {OWN_V4}/32 dev lo && ip addr add {OWN_V6}/128 dev lo nodad"


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run([*NAMESPACE, "sh", "-c", SETUP], capture_output=True, check=False)
    return probe.returncode == 0


needs_netns = pytest.mark.skipif(
    not _namespaces_work(), reason="needs unshare and ip, and user and network namespaces"
)


@needs_netns
@pytest.mark.parametrize("host", [OWN_V4, OWN_V6])
async def test_a_server_on_the_machines_own_public_address_is_not_reached(host: str) -> None:
    child = f"{SETUP} && exec {sys.executable} -m tests.bot.tools.test_web_fetch_own_address {host}"
    process = await asyncio.create_subprocess_exec(
        *NAMESPACE, "sh", "-c", child, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    seen = json.loads(out.decode().splitlines()[-1])

    assert seen["hits"] == [], seen
    assert seen["said"].startswith("refused:") and "this machine" in seen["said"], seen


async def _fetch_own(host: str) -> dict[str, object]:
    """Inside the namespace: a server on ``host``, and what the tool said and the server saw."""
    server = await start(host)
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            tool = WebFetchTool(http, max_bytes=10_000, timeout=5.0, max_redirects=3)
            try:
                said = await tool.run({"url": f"{server.base}/metrics"}, ToolContext("t:c", "t", "1"))
            except ToolError as exc:
                said = str(exc)
    finally:
        await server.close()
    return {"said": said, "hits": server.hits}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_fetch_own(sys.argv[1]))))
