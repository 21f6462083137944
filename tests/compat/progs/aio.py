"""asyncio (standard library only) echo server and a client with many concurrent connections.

  aio.py serve                       listen on 127.0.0.1:0, print "READY <port>", echo every
                                     connection until EOF; runs until killed
  aio.py client PORT CONNS MAXBYTES  open CONNS connections, wait until all are connected,
                                     (and 0.3 s more), then on each send a different
                                     pseudo-random payload of up
                                     to MAXBYTES while reading the echo concurrently, half-close,
                                     read to EOF and compare; prints one line per failure and
                                     "OK conns=N bytes=B" at the end; exit 1 on any failure
Every wait is bounded (asyncio.wait_for); a stuck connection fails instead of hanging."""

import asyncio
import random
import sys

TIMEOUT = 60
HOLD = 0.3


async def serve():
    async def handle(reader, writer):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            writer.write_eof()
            await writer.drain()
        except (ConnectionError, OSError) as e:
            print(f"server: connection error {e!r}", file=sys.stderr, flush=True)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"READY {port}", flush=True)
    async with server:
        await server.serve_forever()


async def client(port, conns, maxbytes):
    connected = 0
    all_connected = asyncio.Event()
    failures = []

    async def one(i):
        nonlocal connected
        rng = random.Random(i)
        size = rng.randint(1, maxbytes)
        payload = rng.randbytes(size)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
        except (OSError, asyncio.TimeoutError) as e:
            failures.append(f"conn {i}: connect failed: {e!r}")
            connected += 1
            if connected == conns:
                all_connected.set()
            return 0
        connected += 1
        if connected == conns:
            all_connected.set()
        try:
            await asyncio.wait_for(all_connected.wait(), TIMEOUT)
            # all connections stay open at least this long, so an observer (canal stat) sees them
            await asyncio.sleep(HOLD)

            async def send():
                for off in range(0, size, 16384):
                    writer.write(payload[off:off + 16384])
                    await writer.drain()
                writer.write_eof()

            async def receive():
                chunks = []
                while True:
                    b = await reader.read(65536)
                    if not b:
                        return b"".join(chunks)
                    chunks.append(b)

            _, got = await asyncio.wait_for(asyncio.gather(send(), receive()), TIMEOUT)
            if got != payload:
                first = next((k for k, (a, b) in enumerate(zip(got, payload)) if a != b), min(len(got), size))
                failures.append(f"conn {i}: echo differs: got {len(got)} bytes, sent {size}, first difference at {first}")
            return size
        except (OSError, asyncio.TimeoutError) as e:
            failures.append(f"conn {i}: {e!r}")
            return 0
        finally:
            writer.close()

    sizes = await asyncio.gather(*(one(i) for i in range(conns)))
    for f in failures:
        print("FAIL " + f, flush=True)
    if failures:
        return 1
    print(f"OK conns={conns} bytes={sum(sizes)}", flush=True)
    return 0


def main():
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(serve())
        return 0
    if sys.argv[1:2] == ["client"] and len(sys.argv) == 5:
        return asyncio.run(client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
