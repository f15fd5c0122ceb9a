#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_bootstrap (tests/fuzz/corpus): one valid
message of each kind the target reads, and a few that are refused for one
reason each. Layouts: runtime/boot/bootstrap_wire.h, transport/tcp.c and
transport/ibverbs.c. Run from the repository root."""
import hashlib
import hmac
import os
import struct

SECRET = b"\x5a" * 16
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


NONCE = b"\0" * 16  # of every challenge the fuzzed acceptors send


def proof(msg, secret=SECRET, nonce=NONCE):
    """Bootstrap version 3: HMAC-SHA-256(secret, nonce || msg with bytes 4..20 zeroed)[:16]."""
    return hmac.new(secret, nonce + msg[:4] + b"\0" * 16 + msg[20:], hashlib.sha256).digest()[:16]


def signed(msg, secret=SECRET):
    return msg[:4] + proof(msg, secret) + msg[20:]


def tag(dialer_nonce=NONCE):
    return hmac.new(SECRET, b"BRGT" + dialer_nonce, hashlib.sha256).digest()[:16]


def addr(a):
    return a.encode().ljust(64, b"\0")


def hello(rank, nranks, blob=b"blobdata", secret=SECRET, port=None, magic=0x42524731, pid=None,
          host="fuzz-host"):
    port = 20000 + rank if port is None else port
    pid = 1000 + rank if pid is None else pid
    nonce = bytes([rank + 1]) * 16
    return signed(struct.pack("<I", magic) + b"\0" * 16 + struct.pack("<ii", rank, nranks) +
                  addr("127.0.0.1") + struct.pack("<HHIi", port, 0, len(blob), pid) +
                  host.encode().ljust(64, b"\0") + nonce + blob, secret)


def confirm(rank):
    return struct.pack("<Ii", 0x42524743, rank)


def pieces(*ps):
    return b"".join(struct.pack("<H", len(p)) + p for p in ps)


def table(nranks, blob_bytes, status=0, text=b""):
    if status:
        return struct.pack("<I", 0x42524754) + tag() + struct.pack("<II", status, len(text)) + text
    body = struct.pack("<II", nranks, blob_bytes)
    for k in range(nranks):
        body += addr("127.0.0.1") + struct.pack("<HH", 20000 + k, 0) + bytes([k]) * blob_bytes
    return struct.pack("<I", 0x42524754) + tag() + struct.pack("<II", 0, len(body)) + body


def entry(rank, blob_bytes, port=None):
    port = 20000 + rank if port is None else port
    return addr("127.0.0.1") + struct.pack("<HH", port, 0) + bytes([rank]) * blob_bytes


def gather(ranks, blob_bytes):
    return struct.pack("<I", len(ranks)) + b"".join(
        struct.pack("<i", r) + entry(r, blob_bytes) for r in ranks)


def neigh(nranks, blob_bytes, parent):
    body = struct.pack("<II", nranks, blob_bytes)
    body += entry(parent, 0) if parent is not None else b"\0" * 68
    return struct.pack("<I", 0x42524754) + tag() + struct.pack("<II", 0, len(body)) + body


def peer_hello(magic, frm, to):
    return signed(struct.pack("<I", magic) + b"\0" * 16 + struct.pack("<ii", frm, to) +
                  b"\x33" * 16)


def frame(t, payload):
    return struct.pack("<II", t, len(payload)) + payload


def tcp_hello(index, nsocks, rank=0, secret=SECRET):
    return struct.pack(">IiHHI", 0x42524748, rank, index, nsocks, 0) + secret


def ib_hello(rank=0, nslots=4, nqps=2):
    h = struct.pack(">Ii", 0x42524948, rank) + SECRET + struct.pack("<QIIII", 0x1000, 7, nslots,
                                                                     nqps, 0)
    return h.ljust(2048, b"\0")


seeds = {
    "hello-ok": b"\x00" + hello(0, 2),
    "hello-noblob": b"\x00" + hello(3, 4, blob=b""),
    "id-ok": b"\x01\x01" + struct.pack("<II", 0x42524731, 2) + SECRET + addr("127.0.0.1") +
             struct.pack("<HHI", 29500, 0, 0),
    "root-two-ranks": b"\x02\x03" + pieces(hello(0, 2) + confirm(0), hello(1, 2) + confirm(1)),
    "root-unconfirmed": b"\x02\x03" + pieces(hello(0, 2) + confirm(0), hello(1, 2) + b"junk!!!!"),
    "root-same-rank-twice": b"\x02\x03" + pieces(hello(1, 3), hello(1, 3, pid=666, host="rogue"),
                                                  hello(0, 3)),
    "root-wrong-secret": b"\x02\x02" + pieces(hello(0, 2, secret=b"\x00" * 16)),
    "root-blob-mismatch": b"\x02\x03" + pieces(hello(0, 2), hello(1, 2, blob=b"x")),
    "root-nranks-mismatch": b"\x02\x03" + pieces(hello(0, 2), hello(1, 3)),
    "root-not-brigade": b"\x02\x01" + pieces(b"GET / HTTP/1.0\r\n\r\n" * 8),
    "table-ok": b"\x03\x01\x01\x04" + table(2, 4),
    "table-error": b"\x03\x02\x00\x00" + table(3, 0, status=5, text=b"rank 2 never arrived"),
    "ring-frames": b"\x04\x01" + frame(1, b"hello") + frame(2, b"") + frame(3, b"x" * 100),
    "ring-oversized": b"\x04\x01" + struct.pack("<II", 1, 5000),
    "net-tcp-two": b"\x05\x02" + pieces(tcp_hello(0, 2), tcp_hello(1, 2)),
    "net-tcp-dup-index": b"\x05\x02" + pieces(tcp_hello(0, 2), tcp_hello(0, 2)),
    "net-tcp-wrong-rank": b"\x05\x00" + pieces(tcp_hello(0, 1, rank=3)),
    "net-ib": b"\x05\x01" + pieces(ib_hello()),
    # 7 ranks, parent 0, child 1 (subtree 1, 3, 4), 4-byte blobs
    "gather-ok": b"\x06\x05\x00\x08" + gather([1, 3, 4], 4),
    "gather-not-subtree": b"\x06\x05\x00\x08" + gather([1, 2, 4], 4),
    "gather-twice": b"\x06\x05\x00\x08" + gather([1, 3, 3], 4),
    "gather-short-count": b"\x06\x05\x00\x08" + gather([1, 3], 4),
    "neigh-ok": b"\x07\x03\x02\x04" + neigh(4, 4, 0),
    "neigh-rank0": b"\x07\x03\x00\x04" + neigh(4, 4, None),
    "peer-hello-ring": b"\xf0\x00" + peer_hello(0x42524752, 1, 2),
    "peer-hello-tree": b"\xf0\x02" + peer_hello(0x42524741, 3, 1),
    "peer-hello-unsigned": b"\xf0\x01" + struct.pack("<I", 0x42524752) + b"\0" * 40,
    "root-resigned": b"\x02\x83" + pieces(hello(0, 2, secret=b"\x11" * 16) + confirm(0),
                                           hello(1, 2, secret=b"\x11" * 16) + confirm(1)),
    "challenge-ok": b"\xf1" + struct.pack("<II", 0x4252474e, 3) + b"\x07" * 16,
    "challenge-old": b"\xf1" + struct.pack("<II", 0x4252474e, 2) + b"\x07" * 16,
    "neigh-error": b"\x07\x03\x01\x00" + table(4, 0, status=5, text=b"out of file descriptors"),
}

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {OUT}")
