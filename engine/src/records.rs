//! An append's records, however they are held: given one by one (a
//! client's payloads, `[P]`), or laid out already as an append op holds
//! them ([`Laid`]: a replica's append read in place from its entry, whose
//! records have the op's layout). The checks and the write of an append
//! take either, so both are decided by the same code.

use crate::op;

/// An append's records.
pub(crate) trait Records {
    /// How many.
    fn count(&self) -> usize;

    /// Each record's length, in order.
    fn lens(&self) -> impl Iterator<Item = usize> + '_;

    /// Bytes of their layout in an append op, `[len: u32 | payload]*`.
    fn laid_len(&self) -> usize {
        self.lens().map(|len| 4 + len).sum()
    }

    /// Writes their layout into `out`, exactly [`Records::laid_len`] long.
    fn lay(&self, out: &mut [u8]);
}

impl<P: AsRef<[u8]>> Records for [P] {
    fn count(&self) -> usize {
        self.len()
    }

    fn lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.iter().map(|p| p.as_ref().len())
    }

    fn lay(&self, out: &mut [u8]) {
        let mut at = 0;
        for p in self {
            let p = p.as_ref();
            out[at..at + 4].copy_from_slice(&(p.len() as u32).to_le_bytes());
            out[at + 4..at + 4 + p.len()].copy_from_slice(p);
            at += 4 + p.len();
        }
        debug_assert_eq!(at, out.len());
    }
}

/// Records laid out already: `[len: u32 | payload]*`, `count` times, and
/// nothing after (checked when made). Written out with one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Laid<'a> {
    count: u32,
    bytes: &'a [u8],
}

impl<'a> Laid<'a> {
    /// `bytes` as `count` records, if that is exactly what they hold.
    pub(crate) fn new(count: u32, bytes: &'a [u8]) -> Option<Laid<'a>> {
        let mut rest = bytes;
        for _ in 0..count {
            let (len, after) = rest.split_first_chunk::<4>()?;
            rest = after.get(u32::from_le_bytes(*len) as usize..)?;
        }
        rest.is_empty().then_some(Laid { count, bytes })
    }

    /// Each record's payload, in order.
    pub(crate) fn payloads(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let bytes = self.bytes;
        op::records(bytes).map(move |(s, e)| &bytes[s..e])
    }
}

impl Records for Laid<'_> {
    fn count(&self) -> usize {
        self.count as usize
    }

    fn lens(&self) -> impl Iterator<Item = usize> + '_ {
        op::records(self.bytes).map(|(s, e)| e - s)
    }

    fn laid_len(&self) -> usize {
        self.bytes.len()
    }

    fn lay(&self, out: &mut [u8]) {
        out.copy_from_slice(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn laid_of(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = vec![0u8; payloads.laid_len()];
        payloads.lay(&mut out);
        out
    }

    #[test]
    fn records_laid_out_read_back_as_given() {
        let payloads: &[&[u8]] = &[b"a", b"", b"longer payload"];
        let bytes = laid_of(payloads);
        assert_eq!(bytes.len(), 3 * 4 + 1 + 14);
        let laid = Laid::new(3, &bytes).expect("three records");
        assert_eq!(laid.count(), 3);
        assert_eq!(laid.payloads().collect::<Vec<_>>(), payloads);
        assert_eq!(laid.lens().collect::<Vec<_>>(), vec![1, 0, 14]);
        assert_eq!(laid.laid_len(), bytes.len());
        let mut again = vec![0u8; laid.laid_len()];
        laid.lay(&mut again);
        assert_eq!(again, bytes);
    }

    #[test]
    fn only_exactly_count_records_are_laid_out() {
        let bytes = laid_of(&[b"ab", b"c"]);
        assert!(Laid::new(2, &bytes).is_some());
        // Too few claimed (bytes left over), too many (bytes run out).
        assert!(Laid::new(1, &bytes).is_none());
        assert!(Laid::new(3, &bytes).is_none());
        // A record cut short, a length cut short.
        assert!(Laid::new(2, &bytes[..bytes.len() - 1]).is_none());
        assert!(Laid::new(1, &bytes[..3]).is_none());
        // A length past the end, even one that overflows when added.
        let mut huge = bytes.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Laid::new(2, &huge).is_none());
        assert!(Laid::new(0, &[]).is_some());
        assert!(Laid::new(u32::MAX, &bytes).is_none());
    }
}
