#!/usr/bin/env python3
"""Writes the seed inputs of both targets into seeds/<target>/.

segment_recover: the format is in fuzz_targets/segment_recover.rs (struct
Builder). entry_decode: `seq: u64 LE | max_len: u32 LE | bytes`, the bytes
encoded as wal/src/format.rs does (so the fuzzer starts from valid headers,
entries, footers and trailers: their checksums are hard to guess).
"""
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "segment_recover")
OUT_DECODE = os.path.join(HERE, "entry_decode")


def enc_header(seq):
    b = bytearray(64)
    b[0:8] = b"FENCELOG"
    b[8:12] = struct.pack("<I", 1)
    b[16:24] = struct.pack("<Q", seq)
    b[60:64] = struct.pack("<I", zlib.crc32(bytes(b[:60])))
    return bytes(b)


def enc_entry(seq, lsn, epoch_first, kind, payload):
    h = bytearray(24)
    h[4:8] = struct.pack("<I", len(payload))
    h[8:16] = struct.pack("<Q", lsn)
    h[16:20] = struct.pack("<I", lsn - epoch_first)
    h[20] = kind  # 1 checkpoint, 2 record
    crc = zlib.crc32(struct.pack("<Q", seq) + bytes(h[4:24]) + payload)
    h[0:4] = struct.pack("<I", crc)
    b = bytes(h) + payload
    return b + b"\0" * (-len(b) % 8)


def enc_footer(seq, first, last, payload):
    b = struct.pack("<IQQQ", len(payload), seq, first, last) + payload
    return struct.pack("<I", zlib.crc32(b)) + b


def enc_trailer(seq, footer_pos, footer_len):
    b = b"FLSEALED" + struct.pack("<QQI", seq, footer_pos, footer_len)
    return b + struct.pack("<I", zlib.crc32(b))


def decode_input(seq, max_len, b):
    return struct.pack("<QI", seq, max_len) + b


footer = enc_footer(5, 100, 200, b"index")
DECODE_SEEDS = {
    "entries": decode_input(
        7,
        1 << 20,
        enc_entry(7, 10, 8, 1, struct.pack("<QQ", 3, 0))
        + enc_entry(7, 11, 8, 2, b"hello")
        + enc_entry(7, 12, 12, 2, b"x" * 40),
    ),
    "unpadded_entry": decode_input(7, 100, enc_entry(7, 3, 1, 2, b"abc")[:27]),
    "header": decode_input(42, 0, enc_header(42)),
    "footer_trailer": decode_input(5, 0, footer + b"\0" * (-len(footer) % 8) + enc_trailer(5, 64, len(footer))),
    "trailer_only": decode_input(5, 0, enc_trailer(5, 4096, 37)),
    "name": decode_input(12, 0, b"00000000000000000012.wal"),
}


def head(flags=0, first_lsn=0, append_len=8):
    return bytes([flags]) + struct.pack("<H", first_lsn) + bytes([append_len])


def entry(kind=0, lsn=0, epoch=0, payload=b""):
    return bytes([0, kind, lsn, epoch, len(payload)]) + payload


def entry_at(lsn, kind=0, epoch=1, payload=b""):
    """An entry with an absolute LSN."""
    return bytes([0, kind, 2]) + struct.pack("<Q", lsn) + bytes([epoch, len(payload)]) + payload


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


def seal(mode=0, pad=0, lsns=None):
    if lsns is None:
        return bytes([5, mode, pad])
    return bytes([5, mode | 4, pad]) + struct.pack("<QQ", *lsns)


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
    # Once crashes (fixed): a checkpoint with LSN u64::MAX (now invalid).
    "lsn_u64_max": head() + entry_at(2**64 - 1, kind=1),
    # Once a crash (fixed): an interrupted seal whose footer names LSN u64::MAX.
    "footer_last_lsn_u64_max": head() + entry(kind=1) + seal(mode=8, lsns=(1, 2**64 - 1)) + space(1),
}

# Inputs that once crashed segment_recover (fixed; see README.md): seeds too.
SEEDS.update({
    # Records 2..4 of epoch 1, then LSN 5 of epoch 5; LSN 2's checksum is
    # flipped. Recovery takes the stop for a torn tail and drops 2..5.
    "torn_tail_hides_acked_damage": head()
    + checkpoint(0) + records(3) + flip(64 + 40, 3)
    + entry(epoch=1, payload=b"later") + space(1),
    # A checkpoint with LSN u64::MAX - 1: the next LSN is u64::MAX, and the
    # first append overflows it.
    "next_lsn_u64_max_append_overflow": head() + entry_at(2**64 - 2, kind=1),
    # The file ends inside the last entry's padding (130 bytes: header,
    # checkpoint to 104, a 2-byte record to 130 whose padding would run to
    # 136): the scan stops at 136, past the end, and the interrupted-seal
    # check slices data[136..] of 130 bytes.
    "unpadded_last_entry_slice_panic": head()
    + checkpoint(0) + entry(payload=b"ab") + truncate(130),
})

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
os.makedirs(OUT_DECODE, exist_ok=True)
for name, data in DECODE_SEEDS.items():
    with open(os.path.join(OUT_DECODE, name), "wb") as f:
        f.write(data)
print(f"{len(SEEDS)} seeds in {OUT}, {len(DECODE_SEEDS)} in {OUT_DECODE}")
