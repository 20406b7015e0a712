"""A TLS front for a plaintext gRPC server, as a cluster's Spark Connect behind TLS is.

``python tls_relay.py LISTEN_HOST LISTEN_PORT CERT KEY TO_PORT``: accepts TLS (ALPN
``h2``, which gRPC requires and socat cannot offer) on LISTEN_HOST:LISTEN_PORT and relays
the bytes to 127.0.0.1:TO_PORT.  Prints ``listening`` once it does.
"""

from __future__ import annotations

import asyncio
import ssl
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main() -> None:
    host, port, cert, key, to = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], \
        int(sys.argv[5])
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", to)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    server = await asyncio.start_server(serve, host, port, ssl=ctx)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
