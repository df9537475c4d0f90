"""The ceiling: an aiohttp handler on uvloop that decodes the msgpack body and answers,
doing no work. What sharecoord's HTTP path could reach at best on this machine.

    python -m bench.ceiling PORT
"""

from __future__ import annotations

import sys

import msgpack
import uvloop
from aiohttp import web

_ANSWER = msgpack.packb({"results": []})


async def handle(request: web.Request) -> web.Response:
    msgpack.unpackb(await request.read())
    return web.Response(body=_ANSWER, content_type="application/msgpack")


def main() -> None:
    app = web.Application()
    app.router.add_post("/v1/share-group-state/{rpc}", handle)
    web.run_app(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
