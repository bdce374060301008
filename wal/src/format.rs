//! The on-disk format, byte by byte. `docs/FORMAT.md` says the same in prose.
//!
//! Every integer is little-endian. A segment file is:
//!
//! ```text
//! [ SegmentHeader 64 B ][ Entry ]*[ zeros or stale bytes ][ Footer ][ ... ][ Trailer 32 B ]
//!                                                          \________ sealed segments only ___/
//! ```
//!
//! Checksums are CRC-32 (crc32fast). The checksum of an entry and of a footer
//! covers the segment's sequence number and the entry's log sequence number
//! (LSN), so bytes left in preallocated or recycled space, or copied from
//! another segment, never pass as a live entry.

use crc32fast::Hasher;

/// First bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"FENCELOG";
/// First bytes of the trailer that marks a segment as sealed.
pub const TRAILER_MAGIC: [u8; 8] = *b"FLSEALED";
/// The format version this build writes and reads. Version 2 added
/// [`EntryKind::Link`] (segments that open without a checkpoint) and changed
/// what the engine stores in checkpoints and footers; version 1 logs are
/// refused with [`crate::WalError::UnknownVersion`].
pub const FORMAT_VERSION: u32 = 2;

/// Length of the segment header; the first entry starts here.
pub const HEADER_LEN: u64 = 64;
/// Length of an entry's header; its payload follows.
pub const ENTRY_HEADER_LEN: usize = 24;
/// Length of a footer's header; its payload follows.
pub const FOOTER_HEADER_LEN: usize = 32;
/// Length of the trailer, the last bytes of a sealed segment.
pub const TRAILER_LEN: u64 = 32;
/// Entries and footers start at multiples of this.
pub const ALIGN: u64 = 8;

/// LSNs are below this: 2^62 entries is more than any log will hold, and
/// the margin keeps every `lsn + 1` from overflowing.
pub const MAX_LSN: u64 = 1 << 62;

/// Rounds `n` up to a multiple of [`ALIGN`].
pub const fn align_up(n: u64) -> u64 {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// Bytes an entry with a payload of `payload_len` bytes takes in a segment.
pub const fn entry_len(payload_len: usize) -> u64 {
    align_up(ENTRY_HEADER_LEN as u64 + payload_len as u64)
}

/// The little-endian `u32` at `at`. The caller has checked that `b` holds
/// it (a layout already validated against its length); it panics otherwise.
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The little-endian `u64` at `at`; as [`u32_at`], `b` must hold it.
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Why a segment header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer than [`HEADER_LEN`] bytes.
    Short,
    /// Not a fencelog segment.
    BadMagic,
    /// Written by a format version this build does not know.
    UnknownVersion(u32),
    /// The header's checksum does not match.
    Checksum,
}

// SegmentHeader: { magic: [u8; 8] | version: u32 | flags: u32 | seq: u64 | reserved: [u8; 36] | crc: u32 }
/// Encodes the header of segment `seq`.
pub fn encode_header(seq: u64) -> [u8; HEADER_LEN as usize] {
    let mut b = [0u8; HEADER_LEN as usize];
    b[0..8].copy_from_slice(&SEGMENT_MAGIC);
    b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32fast::hash(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a segment header and answers its sequence number.
pub fn decode_header(b: &[u8]) -> Result<u64, HeaderError> {
    if b.len() < HEADER_LEN as usize {
        return Err(HeaderError::Short);
    }
    if b[0..8] != SEGMENT_MAGIC {
        return Err(HeaderError::BadMagic);
    }
    // A version this build does not read is reported as such only when the
    // header's checksum holds: otherwise a damaged version field would pass
    // for a log from another version instead of damage.
    let version = u32_at(b, 8);
    if crc32fast::hash(&b[..60]) != u32_at(b, 60) {
        return Err(HeaderError::Checksum);
    }
    if version != FORMAT_VERSION {
        return Err(HeaderError::UnknownVersion(version));
    }
    Ok(u64_at(b, 16))
}

/// What an entry is for. The log itself writes the entry that opens each
/// segment (a checkpoint or a link); everything the layer above submits is
/// a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// The state of the layer above at the start of a segment: recovery
    /// replays from the newest one.
    Checkpoint,
    /// An entry submitted by the layer above.
    Record,
    /// Opens a segment that carries no checkpoint: replay reaches it from
    /// an older segment's checkpoint. Written when a whole checkpoint in
    /// every segment would cost too much of it.
    Link,
}

impl EntryKind {
    fn code(self) -> u8 {
        match self {
            EntryKind::Checkpoint => 1,
            EntryKind::Record => 2,
            EntryKind::Link => 3,
        }
    }

    fn from_code(code: u8) -> Option<EntryKind> {
        match code {
            1 => Some(EntryKind::Checkpoint),
            2 => Some(EntryKind::Record),
            3 => Some(EntryKind::Link),
            _ => None,
        }
    }

    /// Whether entries of this kind open a segment (and appear nowhere
    /// else).
    pub fn opens_segment(self) -> bool {
        matches!(self, EntryKind::Checkpoint | EntryKind::Link)
    }
}

/// A decoded entry header, checksum verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// The entry's log sequence number: 1, 2, 3, … across all segments.
    pub lsn: u64,
    /// Payload length in bytes.
    pub len: u32,
    /// LSN of the first entry of the sync epoch this entry was written in:
    /// entries of one epoch reach the disk with one `fdatasync`.
    pub epoch_first_lsn: u64,
    /// What the entry is for.
    pub kind: EntryKind,
}

impl EntryHeader {
    /// Bytes this entry takes in the segment, header and padding included.
    pub fn encoded_len(&self) -> u64 {
        entry_len(self.len as usize)
    }
}

// Entry: { crc: u32 | len: u32 | lsn: u64 | epoch_back: u32 | kind: u8 | reserved: [u8; 3] | payload: [u8; len] | zeros to a multiple of 8 }
//   crc = CRC-32 of (segment seq: u64 | bytes 4..24 of the header | payload)
//   epoch_back = lsn - (LSN of the first entry of the entry's sync epoch)
/// Writes an entry header for `payload` into `out[..ENTRY_HEADER_LEN]`.
///
/// # Panics
///
/// If `out` is shorter than [`ENTRY_HEADER_LEN`] or the payload is longer
/// than `u32::MAX`: both are bugs of the caller, which bounds entry sizes.
pub fn encode_entry_header(
    out: &mut [u8],
    seq: u64,
    lsn: u64,
    epoch_first_lsn: u64,
    kind: EntryKind,
    payload: &[u8],
) {
    assert!(lsn >= epoch_first_lsn && lsn - epoch_first_lsn <= u64::from(u32::MAX));
    let len = u32::try_from(payload.len()).expect("entry payload bounded by max_entry_bytes");
    encode_entry_fields(out, lsn, epoch_first_lsn, kind, len);
    let h = &mut out[..ENTRY_HEADER_LEN];
    let crc = entry_crc(seq, h, payload);
    h[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// Writes an entry header's fields into `out[..ENTRY_HEADER_LEN]`, leaving
/// the checksum to [`fill_checksums`]: the log computes checksums on its
/// sync thread, outside the lock where entries are decided.
pub(crate) fn encode_entry_fields(
    out: &mut [u8],
    lsn: u64,
    epoch_first_lsn: u64,
    kind: EntryKind,
    len: u32,
) {
    debug_assert!(lsn >= epoch_first_lsn && lsn - epoch_first_lsn <= u64::from(u32::MAX));
    let h = &mut out[..ENTRY_HEADER_LEN];
    h[0..4].fill(0);
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&lsn.to_le_bytes());
    h[16..20].copy_from_slice(&((lsn - epoch_first_lsn) as u32).to_le_bytes());
    h[20] = kind.code();
    h[21..24].fill(0);
}

/// Computes and stores the checksum of every entry in `buf`, a run of
/// whole entries of segment `seq` written by [`encode_entry_fields`].
pub(crate) fn fill_checksums(buf: &mut [u8], seq: u64) {
    let seeded = seeded(seq);
    let mut at = 0;
    while at + ENTRY_HEADER_LEN <= buf.len() {
        let len = u32_at(buf, at + 4) as usize;
        let end = (at + ENTRY_HEADER_LEN + len).min(buf.len());
        let crc = entry_crc_after(&seeded, &buf[at + 4..end]);
        buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        at += entry_len(len) as usize;
    }
}

/// An entry's checksum, its header and payload apart.
fn entry_crc(seq: u64, header: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = seeded(seq);
    hasher.update(&header[4..ENTRY_HEADER_LEN]);
    hasher.update(payload);
    hasher.finalize()
}

/// The checksum's state after segment `seq`'s number, which every entry's
/// checksum in that segment starts with: made once for a run of entries
/// (`Hasher::new` checks the CPU's features each time it is called).
fn seeded(seq: u64) -> Hasher {
    let mut hasher = Hasher::new();
    hasher.update(&seq.to_le_bytes());
    hasher
}

/// An entry's checksum from [`seeded`] and its bytes from 4 on (the rest of
/// its header, then its payload, which lie together): one pass over them
/// instead of one per part, the header's 20 bytes with the payload.
fn entry_crc_after(seeded: &Hasher, rest: &[u8]) -> u32 {
    let mut hasher = seeded.clone();
    hasher.update(rest);
    hasher.finalize()
}

/// What is found at a position where an entry may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A whole entry whose checksum matches.
    Entry(EntryHeader),
    /// The 24 header bytes are all zero: never-written (preallocated) space.
    Zeros,
    /// Something else: a torn or damaged entry, or stale bytes.
    Invalid(Invalid),
}

/// Why the bytes at a position are not an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// Not even a whole header fits before the end.
    Truncated,
    /// The header claims a payload that runs past the end or over the limit.
    BadLength(u32),
    /// LSN 0 or an unknown kind.
    BadHeader,
    /// The checksum does not match.
    Checksum,
}

/// Looks for an entry at the start of `b` (the rest of segment `seq`), with
/// payloads of at most `max_len` bytes.
///
/// Never panics and never allocates, whatever the bytes.
pub fn probe_entry(b: &[u8], seq: u64, max_len: u32) -> Probe {
    if b.len() < ENTRY_HEADER_LEN {
        return if b.iter().all(|&x| x == 0) {
            Probe::Zeros
        } else {
            Probe::Invalid(Invalid::Truncated)
        };
    }
    let h = &b[..ENTRY_HEADER_LEN];
    if h.iter().all(|&x| x == 0) {
        return Probe::Zeros;
    }
    let len = u32_at(h, 4);
    let lsn = u64_at(h, 8);
    let back = u32_at(h, 16);
    let kind = EntryKind::from_code(h[20]);
    let Some(kind) = kind else {
        return Probe::Invalid(Invalid::BadHeader);
    };
    // LSN 0 is never written, nor anything from MAX_LSN on (no log gets
    // there, and the LSN after it must not overflow).
    if lsn == 0 || lsn >= MAX_LSN || u64::from(back) >= lsn || h[21..24] != [0, 0, 0] {
        return Probe::Invalid(Invalid::BadHeader);
    }
    if len > max_len || ENTRY_HEADER_LEN + len as usize > b.len() {
        return Probe::Invalid(Invalid::BadLength(len));
    }
    if entry_crc_after(&seeded(seq), &b[4..ENTRY_HEADER_LEN + len as usize]) != u32_at(h, 0) {
        return Probe::Invalid(Invalid::Checksum);
    }
    // The padding is not checksummed but must be zero, so that no bit of an
    // entry can change unnoticed.
    let padded = (entry_len(len as usize) as usize).min(b.len());
    if b[ENTRY_HEADER_LEN + len as usize..padded]
        .iter()
        .any(|&x| x != 0)
    {
        return Probe::Invalid(Invalid::Checksum);
    }
    Probe::Entry(EntryHeader {
        lsn,
        len,
        epoch_first_lsn: lsn - u64::from(back),
        kind,
    })
}

/// A decoded footer header, checksum verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FooterHeader {
    /// Payload length in bytes.
    pub len: u32,
    /// LSN of the segment's first entry.
    pub first_lsn: u64,
    /// LSN of the segment's last entry.
    pub last_lsn: u64,
}

// Footer: { crc: u32 | len: u32 | seq: u64 | first_lsn: u64 | last_lsn: u64 | payload: [u8; len] }
//   crc = CRC-32 of bytes 4..32 of the header and the payload
/// Encodes a footer (header and payload) for segment `seq`.
///
/// # Errors
///
/// A payload of 4 GiB or more does not fit the footer's length field.
pub fn encode_footer(
    seq: u64,
    first_lsn: u64,
    last_lsn: u64,
    payload: &[u8],
) -> Result<Vec<u8>, crate::WalError> {
    let mut b = Vec::with_capacity(FOOTER_HEADER_LEN + payload.len());
    b.resize(FOOTER_HEADER_LEN, 0);
    b.extend_from_slice(payload);
    frame_footer(seq, first_lsn, last_lsn, b)
}

/// Makes a footer of `b`, whose first [`FOOTER_HEADER_LEN`] bytes are
/// room for the header and the rest the payload: the header is written in
/// place, so a footer of megabytes is never copied to be framed.
///
/// # Errors
///
/// A payload of 4 GiB or more does not fit the footer's length field.
pub fn frame_footer(
    seq: u64,
    first_lsn: u64,
    last_lsn: u64,
    mut b: Vec<u8>,
) -> Result<Vec<u8>, crate::WalError> {
    debug_assert!(b.len() >= FOOTER_HEADER_LEN);
    let payload_len = b.len().saturating_sub(FOOTER_HEADER_LEN);
    let len = u32::try_from(payload_len).map_err(|_| crate::WalError::TooLarge {
        len: payload_len as u64,
        max: u64::from(u32::MAX),
    })?;
    b[4..8].copy_from_slice(&len.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&first_lsn.to_le_bytes());
    b[24..32].copy_from_slice(&last_lsn.to_le_bytes());
    let crc = crc32fast::hash(&b[4..]);
    b[0..4].copy_from_slice(&crc.to_le_bytes());
    Ok(b)
}

/// Decodes the footer at the start of `b` for segment `seq`, answering its
/// header; the payload is `b[FOOTER_HEADER_LEN..][..len]`.
pub fn decode_footer(b: &[u8], seq: u64) -> Option<FooterHeader> {
    if b.len() < FOOTER_HEADER_LEN {
        return None;
    }
    let len = u32_at(b, 4);
    let end = FOOTER_HEADER_LEN.checked_add(len as usize)?;
    if end > b.len() || u64_at(b, 8) != seq {
        return None;
    }
    if crc32fast::hash(&b[4..end]) != u32_at(b, 0) {
        return None;
    }
    Some(FooterHeader {
        len,
        first_lsn: u64_at(b, 16),
        last_lsn: u64_at(b, 24),
    })
}

/// Where a sealed segment's footer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Position of the footer in the file.
    pub footer_pos: u64,
    /// Length of the footer, header included.
    pub footer_len: u32,
}

// Trailer: { magic: [u8; 8] | seq: u64 | footer_pos: u64 | footer_len: u32 | crc: u32 }
//   the last 32 bytes of a sealed segment; crc = CRC-32 of bytes 0..28
/// Encodes the trailer of segment `seq`.
pub fn encode_trailer(seq: u64, t: Trailer) -> [u8; TRAILER_LEN as usize] {
    let mut b = [0u8; TRAILER_LEN as usize];
    b[0..8].copy_from_slice(&TRAILER_MAGIC);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&t.footer_pos.to_le_bytes());
    b[24..28].copy_from_slice(&t.footer_len.to_le_bytes());
    let crc = crc32fast::hash(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a trailer of segment `seq`; `None` unless every field checks out.
pub fn decode_trailer(b: &[u8], seq: u64) -> Option<Trailer> {
    if b.len() != TRAILER_LEN as usize || b[0..8] != TRAILER_MAGIC || u64_at(b, 8) != seq {
        return None;
    }
    if crc32fast::hash(&b[..28]) != u32_at(b, 28) {
        return None;
    }
    Some(Trailer {
        footer_pos: u64_at(b, 16),
        footer_len: u32_at(b, 24),
    })
}

/// The file name of segment `seq`: names sort in sequence order.
pub fn segment_file_name(seq: u64) -> String {
    format!("{seq:020}.wal")
}

/// The sequence number in a segment file name, if it is one.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksums the sync thread fills in for a run of entries (one
    /// pass over each from its byte 4, after the segment's number) are
    /// the ones a header encoded alone carries (header and payload apart),
    /// and every entry probes whole, a flipped byte anywhere refused.
    #[test]
    fn checksums_filled_in_a_run_are_the_entrys_own() {
        let seq = 0x0123_4567_89ab_cdef;
        let lens = [0usize, 1, 7, 8, 63, 64, 100, 127, 128, 129, 200, 1000];
        let entries: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let payload: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
                entry(seq, 10 + i as u64, 10, &payload)
            })
            .collect();
        let mut run: Vec<u8> = entries.concat();
        // As the log writes them: fields only, checksums zero.
        let mut at = 0;
        for e in &entries {
            run[at..at + 4].fill(0);
            at += e.len();
        }
        fill_checksums(&mut run, seq);
        assert_eq!(run, entries.concat());
        let mut at = 0;
        for (e, len) in entries.iter().zip(lens) {
            assert!(matches!(
                probe_entry(&run[at..], seq, 1 << 20),
                Probe::Entry(_)
            ));
            for flip in [4, 23, 24 + len / 2] {
                if flip < ENTRY_HEADER_LEN + len {
                    let mut bad = e.clone();
                    bad[flip] ^= 0x10;
                    assert!(
                        matches!(probe_entry(&bad, seq, 1 << 20), Probe::Invalid(_)),
                        "entry of {len} bytes, byte {flip} flipped"
                    );
                }
            }
            assert!(matches!(
                probe_entry(e, seq + 1, 1 << 20),
                Probe::Invalid(_)
            ));
            at += e.len();
        }
    }

    #[test]
    fn header_round_trip_and_refusals() {
        let h = encode_header(42);
        assert_eq!(decode_header(&h), Ok(42));
        assert_eq!(decode_header(&h[..63]), Err(HeaderError::Short));
        let mut bad = h;
        bad[0] ^= 1;
        assert_eq!(decode_header(&bad), Err(HeaderError::BadMagic));
        let mut v1 = h;
        v1[8] = 1;
        assert_eq!(decode_header(&v1), Err(HeaderError::Checksum));
        let crc = crc32fast::hash(&v1[..60]);
        v1[60..64].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_header(&v1), Err(HeaderError::UnknownVersion(1)));
        let mut flipped = h;
        flipped[17] ^= 4;
        assert_eq!(decode_header(&flipped), Err(HeaderError::Checksum));
    }

    fn entry(seq: u64, lsn: u64, epoch: u64, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; entry_len(payload.len()) as usize];
        b[ENTRY_HEADER_LEN..ENTRY_HEADER_LEN + payload.len()].copy_from_slice(payload);
        let (h, p) = b.split_at_mut(ENTRY_HEADER_LEN);
        encode_entry_header(h, seq, lsn, epoch, EntryKind::Record, &p[..payload.len()]);
        b
    }

    #[test]
    fn entry_round_trip() {
        let b = entry(7, 10, 8, b"hello");
        assert_eq!(b.len(), 32);
        assert_eq!(
            probe_entry(&b, 7, 1 << 20),
            Probe::Entry(EntryHeader {
                lsn: 10,
                len: 5,
                epoch_first_lsn: 8,
                kind: EntryKind::Record
            })
        );
    }

    #[test]
    fn entry_from_another_segment_is_refused() {
        let b = entry(7, 10, 10, b"hello");
        assert_eq!(
            probe_entry(&b, 8, 1 << 20),
            Probe::Invalid(Invalid::Checksum)
        );
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let b = entry(3, 99, 90, b"some payload bytes");
        for byte in 0..b.len() {
            for bit in 0..8 {
                let mut d = b.clone();
                d[byte] ^= 1 << bit;
                assert!(
                    !matches!(probe_entry(&d, 3, 1 << 20), Probe::Entry(_)),
                    "flip of bit {bit} of byte {byte} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn zeros_and_limits() {
        assert_eq!(probe_entry(&[0u8; 64], 1, 100), Probe::Zeros);
        assert_eq!(probe_entry(&[0u8; 3], 1, 100), Probe::Zeros);
        let b = entry(1, 1, 1, &[9u8; 200]);
        assert_eq!(
            probe_entry(&b, 1, 100),
            Probe::Invalid(Invalid::BadLength(200))
        );
        assert_eq!(
            probe_entry(&b[..100], 1, 1000),
            Probe::Invalid(Invalid::BadLength(200))
        );
    }

    #[test]
    fn footer_and_trailer_round_trip() {
        let f = encode_footer(5, 100, 200, b"index").unwrap();
        let h = decode_footer(&f, 5).unwrap();
        assert_eq!((h.len, h.first_lsn, h.last_lsn), (5, 100, 200));
        assert!(decode_footer(&f, 6).is_none());
        let mut d = f.clone();
        d[FOOTER_HEADER_LEN] ^= 1;
        assert!(decode_footer(&d, 5).is_none());

        let t = Trailer {
            footer_pos: 4096,
            footer_len: 37,
        };
        let b = encode_trailer(5, t);
        assert_eq!(decode_trailer(&b, 5), Some(t));
        assert_eq!(decode_trailer(&b, 4), None);
    }

    #[test]
    fn file_names_sort_and_parse() {
        assert_eq!(segment_file_name(12), "00000000000000000012.wal");
        assert_eq!(
            parse_segment_file_name("00000000000000000012.wal"),
            Some(12)
        );
        assert_eq!(parse_segment_file_name("12.wal"), None);
        assert_eq!(parse_segment_file_name("0000000000000000001x.wal"), None);
        assert!(segment_file_name(9) < segment_file_name(10));
    }
}
