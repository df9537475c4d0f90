"""The Kafka-protocol ceiling: a uvloop Protocol that reads each request frame, takes its
correlation id from the header and answers a fixed WriteShareGroupState response (one
topic, one partition, error 0), doing no other work. What the Kafka listener could reach
at best on this machine, as bench/ceiling.py is for HTTP.

    python -m bench.kafka_null PORT
"""

from __future__ import annotations

import asyncio
import struct
import sys

import uvloop

# The answer's body after the correlation id: header tagged fields, then one result
# (a zero topic id, partition 0, error 0, null message) and the empty tagged fields.
_BODY = b"\x00" + b"\x02" + bytes(16) + b"\x02" + struct.pack(">ih", 0, 0) + b"\x00\x00\x00\x00"
_SIZE = struct.pack(">i", 4 + len(_BODY))


class _Null(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        out = []
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = struct.unpack_from(">i", buf, pos)
            if len(buf) - pos < 4 + size:
                break
            correlation = buf[pos + 8 : pos + 12]  # after api key and version
            out.append(_SIZE + correlation + _BODY)
            pos += 4 + size
        self.buf = buf[pos:]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Null, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    uvloop.run(_serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
