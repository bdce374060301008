//! Decoding arbitrary bytes: entry probes, segment headers, footers,
//! trailers and segment file names. Nothing may panic, and whatever decodes
//! must re-encode to the very bytes it came from.
//!
//! Input layout: `seq: u64 LE | max_len: u32 LE | bytes...` (missing bytes
//! of the prefix read as zero).

#![no_main]

use fencelog_wal::format::{
    self, ENTRY_HEADER_LEN, FOOTER_HEADER_LEN, HEADER_LEN, Invalid, Probe, TRAILER_LEN,
};
use libfuzzer_sys::fuzz_target;

/// How many entries to follow one after the other (as recovery does) before
/// stopping: bounds the time spent on one input.
const MAX_CHAIN: usize = 64;

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    let n = b.len().min(4);
    a[..n].copy_from_slice(&b[..n]);
    u32::from_le_bytes(a)
}

/// Checks what `probe_entry` says about the start of `b`; answers the
/// entry's length in the segment if it found one.
fn check_probe(b: &[u8], seq: u64, max_len: u32) -> Option<usize> {
    let probe = format::probe_entry(b, seq, max_len);
    // Deterministic: the same bytes probe the same way.
    assert_eq!(probe, format::probe_entry(b, seq, max_len));
    match probe {
        Probe::Zeros => {
            let n = b.len().min(ENTRY_HEADER_LEN);
            assert!(b[..n].iter().all(|&x| x == 0), "Zeros on non-zero bytes");
            None
        }
        Probe::Invalid(Invalid::Truncated) => {
            assert!(b.len() < ENTRY_HEADER_LEN, "Truncated with a whole header");
            None
        }
        Probe::Invalid(Invalid::BadLength(len)) => {
            assert_eq!(len, le_u32(&b[4..8]), "BadLength names another length");
            assert!(
                len > max_len || ENTRY_HEADER_LEN + len as usize > b.len(),
                "BadLength({len}) for a payload that fits (max {max_len}, {} bytes)",
                b.len()
            );
            None
        }
        Probe::Invalid(_) => None,
        Probe::Entry(h) => {
            let len = h.len as usize;
            assert!(h.len <= max_len, "entry over max_len");
            assert!(ENTRY_HEADER_LEN + len <= b.len(), "entry runs past the end");
            // LSN 0 is never written, nor u64::MAX (its successor overflows).
            assert!(h.lsn >= 1 && h.lsn < u64::MAX, "entry with LSN {}", h.lsn);
            assert!(
                h.epoch_first_lsn >= 1 && h.epoch_first_lsn <= h.lsn,
                "epoch_first_lsn {} outside 1..={}",
                h.epoch_first_lsn,
                h.lsn
            );
            let encoded = usize::try_from(h.encoded_len()).expect("entry length fits usize");
            assert_eq!(encoded, format::entry_len(len) as usize);
            assert_eq!(encoded % format::ALIGN as usize, 0);
            // The entry may end in the last, unpadded bytes of `b`, but never
            // past `b` rounded up to a multiple of 8.
            assert!(
                encoded as u64 <= format::align_up(b.len() as u64),
                "encoded_len {encoded} beyond {} bytes rounded up",
                b.len()
            );
            // Padding that is there must be zero.
            let padded = encoded.min(b.len());
            assert!(
                b[ENTRY_HEADER_LEN + len..padded].iter().all(|&x| x == 0),
                "non-zero padding accepted"
            );

            // Re-encoding the header over the same payload gives the same
            // 24 bytes.
            let payload = &b[ENTRY_HEADER_LEN..ENTRY_HEADER_LEN + len];
            let mut header = [0u8; ENTRY_HEADER_LEN];
            format::encode_entry_header(
                &mut header,
                seq,
                h.lsn,
                h.epoch_first_lsn,
                h.kind,
                payload,
            );
            assert_eq!(
                header[..],
                b[..ENTRY_HEADER_LEN],
                "re-encoded header differs from the decoded one"
            );

            // An entry depends on its own bytes only: the entry alone (and
            // with its padding) decodes the same.
            assert_eq!(
                format::probe_entry(&b[..ENTRY_HEADER_LEN + len], seq, max_len),
                probe
            );
            assert_eq!(format::probe_entry(&b[..padded], seq, max_len), probe);
            // The checksum covers the segment's sequence number: one bit
            // of difference there is always caught by a CRC.
            assert_eq!(
                format::probe_entry(b, seq ^ 1, max_len),
                Probe::Invalid(Invalid::Checksum),
                "entry accepted in the wrong segment"
            );
            // A limit just below its length refuses it.
            if h.len > 0 {
                assert_eq!(
                    format::probe_entry(b, seq, h.len - 1),
                    Probe::Invalid(Invalid::BadLength(h.len))
                );
            }
            Some(encoded)
        }
    }
}

fn check_header(b: &[u8]) {
    match format::decode_header(b) {
        Ok(seq) => {
            assert!(b.len() >= HEADER_LEN as usize);
            assert_eq!(b[0..8], format::SEGMENT_MAGIC);
            assert_eq!(seq, le_u64(&b[16..24]));
            // Flags and reserved bytes are checksummed but not required to be
            // zero; when they are, the header is exactly what we would write.
            if b[12..16].iter().chain(&b[24..60]).all(|&x| x == 0) {
                assert_eq!(format::encode_header(seq)[..], b[..HEADER_LEN as usize]);
            }
        }
        Err(format::HeaderError::Short) => assert!(b.len() < HEADER_LEN as usize),
        Err(_) => assert!(b.len() >= HEADER_LEN as usize),
    }
}

fn check_footer(b: &[u8], seq: u64) {
    if let Some(f) = format::decode_footer(b, seq) {
        let end = FOOTER_HEADER_LEN + f.len as usize;
        assert!(end <= b.len(), "footer runs past the end");
        let payload = &b[FOOTER_HEADER_LEN..end];
        let encoded = format::encode_footer(seq, f.first_lsn, f.last_lsn, payload)
            .expect("a payload that fit a footer fits again");
        assert_eq!(encoded[..], b[..end], "re-encoded footer differs");
        assert!(format::decode_footer(b, seq ^ 1).is_none());
    }
}

fn check_trailer(b: &[u8], seq: u64) {
    if let Some(t) = format::decode_trailer(b, seq) {
        assert_eq!(b.len(), TRAILER_LEN as usize);
        assert_eq!(
            format::encode_trailer(seq, t)[..],
            b[..],
            "re-encoded trailer differs"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let seq = le_u64(data);
    let max_len = le_u32(data.get(8..).unwrap_or(&[]));
    let b = data.get(12..).unwrap_or(&[]);

    // Entries, followed one after another as a scan does.
    let mut at = 0usize;
    for _ in 0..MAX_CHAIN {
        match check_probe(&b[at..], seq, max_len) {
            Some(n) => at = (at + n).min(b.len()),
            None => break,
        }
    }
    // Also with the limits recovery and reads use.
    check_probe(b, seq, u32::MAX);
    check_probe(b, seq, 16 << 10);

    // Headers: the bytes as they are, and the header of `seq` round trip.
    check_header(b);
    check_header(data);
    assert_eq!(format::decode_header(&format::encode_header(seq)), Ok(seq));

    // Footers, at the start and as they would sit after the header.
    check_footer(b, seq);
    check_footer(data, seq);

    // Trailers: the last 32 bytes (as a sealed segment is read), the first
    // 32, and whatever length the input has.
    check_trailer(b, seq);
    if b.len() >= TRAILER_LEN as usize {
        check_trailer(&b[b.len() - TRAILER_LEN as usize..], seq);
        check_trailer(&b[..TRAILER_LEN as usize], seq);
    }

    // File names.
    let name = String::from_utf8_lossy(b);
    if let Some(n) = format::parse_segment_file_name(&name) {
        assert_eq!(
            format::segment_file_name(n),
            name,
            "name does not round trip"
        );
    }
    let own = format::segment_file_name(seq);
    assert_eq!(format::parse_segment_file_name(&own), Some(seq));
});
