#!/usr/bin/env python3
"""Writes the seed inputs of segment_recover (see the format in
fuzz_targets/segment_recover.rs, struct Builder) into seeds/segment_recover/."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "segment_recover")


def head(flags=0, first_lsn=0, append_len=8):
    return bytes([flags]) + struct.pack("<H", first_lsn) + bytes([append_len])


def entry(kind=0, lsn=0, epoch=0, payload=b""):
    return bytes([0, kind, lsn, epoch, len(payload)]) + payload


def checkpoint(count):
    return entry(kind=1, payload=struct.pack("<QQ", count, 0))


def records(n, epoch=0, size=5):
    return b"".join(entry(epoch=epoch, payload=bytes([i]) * size) for i in range(n))


def segment(mode=0):
    return bytes([1, mode])


def raw(b):
    return bytes([2, len(b)]) + b


def zeros(n):
    return bytes([3, n])


def space(n):
    return bytes([4, n])


def seal(mode=0, pad=0):
    return bytes([5, mode, pad])


def flip(pos, bit):
    return bytes([6]) + struct.pack("<H", pos) + bytes([bit])


def truncate(n):
    return bytes([7]) + struct.pack("<H", n)


SEEDS = {
    # One segment: a checkpoint and records, then preallocated space.
    "one_segment": head() + checkpoint(0) + records(6) + space(4),
    # Three segments, the first two sealed as the log seals them.
    "three_segments": head(first_lsn=10)
    + checkpoint(0) + records(4)
    + segment() + checkpoint(4) + records(4)
    + segment() + checkpoint(8) + records(3) + space(2),
    # A torn tail: the last epoch is half written (junk, then an entry of it).
    "torn_tail": head()
    + checkpoint(0) + records(3)
    + entry(epoch=1, payload=b"new epoch") + raw(b"\xff" * 40)
    + entry(lsn=3, epoch=0, payload=b"same epoch") + space(1),
    # Damage to the last entry of a synced epoch: a later epoch follows it.
    "damage_then_later_epoch": head()
    + checkpoint(0) + records(3) + flip(64 + 40 + 2 * 32, 3)
    + entry(epoch=1, payload=b"later") + space(1),
    # A sealed segment whose footer disagrees with its entries.
    "footer_mismatch": head()
    + checkpoint(0) + records(2) + seal(mode=1) + segment(mode=1)
    + checkpoint(2) + records(2),
    # A segment left unsealed before the last one, a skipped sequence number.
    "unsealed_middle": head(flags=0x30)
    + checkpoint(0) + records(2) + segment(mode=1 | 8) + checkpoint(2) + records(1),
    # Power cut before reopening, a stray .wal.tmp file.
    "power_cut_stray_tmp": head(flags=3, append_len=200)
    + checkpoint(7) + records(5, size=100) + space(8),
    # The newest segment has no header: salvage sets it aside.
    "headerless_last": head()
    + checkpoint(0) + records(2) + segment(mode=4) + checkpoint(2) + records(2),
    # A truncated tail segment.
    "truncated": head() + checkpoint(0) + records(5, size=30) + truncate(200),
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(SEEDS)} seeds in {OUT}")
