"""A network cable in userspace: two TAP devices, every frame copied from one to the other, and
on SIGUSR1 the frames towards the far end delayed and some dropped (SIGUSR2 makes it clean).

It stands in for `tc qdisc ... netem delay 50ms loss 1%` on kernels built without sch_netem:
the frames are real Ethernet frames, so the two TCP stacks see real delay and real loss and
retransmit as they would on a slow line. Frames keep their order (netem without jitter does
too). Run by tests/netns.py in the network's switch namespace:

    python tests/slowlink.py NEAR FAR --delay-ms 50 --loss 0.01

creates TAP devices NEAR and FAR there, prints "ready", and copies frames until SIGTERM.
Only frames from NEAR to FAR are impaired ("to the database" when FAR is its link).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import random
import signal
import struct
import sys

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
MAX_FRAME = 65536


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Link:
    def __init__(self, near: int, far: int, *, delay_s: float, loss: float) -> None:
        self.near, self.far = near, far
        self.delay_s, self.loss = delay_s, loss
        self.impaired = False
        self.dropped = 0
        self._last_due = 0.0

    def _write(self, fd: int, frame: bytes) -> None:
        try:
            os.write(fd, frame)
        except BlockingIOError:
            self.dropped += 1  # the device's queue is full: a real link drops the frame too
        except OSError:
            pass  # the device is down for now (a test took the link down)

    def forward(self, src: int, dst: int, impair: bool) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                frame = os.read(src, MAX_FRAME)
            except (BlockingIOError, OSError):
                return
            if not (impair and self.impaired):
                self._write(dst, frame)
                continue
            if random.random() < self.loss:
                self.dropped += 1
                continue
            # In order, as netem without jitter: never before the frame ahead of it.
            due = max(loop.time() + self.delay_s, self._last_due)
            self._last_due = due
            loop.call_at(due, self._write, dst, frame)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("near")
    parser.add_argument("far")
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--loss", type=float, default=0.01)
    args = parser.parse_args()
    near, far = open_tap(args.near), open_tap(args.far)
    link = Link(near, far, delay_s=args.delay_ms / 1000, loss=args.loss)
    loop = asyncio.get_running_loop()
    loop.add_reader(near, link.forward, near, far, True)
    loop.add_reader(far, link.forward, far, near, False)
    stop = asyncio.Event()

    def impair(on: bool) -> None:
        link.impaired = on
        print(f"impaired={on} dropped={link.dropped}", flush=True)

    loop.add_signal_handler(signal.SIGUSR1, impair, True)
    loop.add_signal_handler(signal.SIGUSR2, impair, False)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
