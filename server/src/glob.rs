//! Glob patterns as Redis reads them (`stringmatchlen`, used by `CONFIG GET`,
//! `KEYS`, `SCAN MATCH`): `*` any run of bytes, `?` one byte, `[abc]`,
//! `[a-z]` and `[^...]` classes, `\x` the byte `x` itself.
//!
//! Redis' matcher recurses at every `*` (and gives up, answering no match,
//! 1000 stars deep; a 1 KiB pattern never gets there); ours must not
//! recurse at all: a pattern comes from the network, before authentication. This one walks the pattern and
//! the name with two cursors and, on a mismatch, backtracks only to the
//! last `*` (every other token matches exactly one byte, so an earlier
//! `*` never needs to take more). Time is O(pattern × name) at worst, the
//! stack constant. A pattern with more single-byte tokens than the name has
//! bytes cannot match and is refused in one pass over the pattern.
//!
//! Where Redis' behaviour is odd it is kept, so patterns mean the same here:
//! an unterminated class runs to the end of the pattern, `[a-]` is the range
//! from `a` to `]`, a range may be given backwards (`[z-a]`), a trailing `\`
//! is a literal backslash, and with `nocase` an escaped byte in a class still
//! compares exactly. Two differences, both harmless for the names matched
//! here: bytes compare as unsigned (Redis compares C `char`s, signed on
//! x86, so its ranges over non-ASCII bytes differ), and `*` matches the
//! empty name (Redis matches nothing against an empty string; names here
//! are never empty).

/// The longest pattern `CONFIG GET` takes. Redis bounds nothing, but its
/// configuration names are under 40 bytes: 1 KiB is room for any honest
/// pattern and keeps matching cheap.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// One token of a pattern.
#[derive(Debug, Clone, Copy)]
enum Token {
    /// `*`
    Star,
    /// `?`
    Any,
    /// A byte, possibly escaped.
    Byte(u8),
    /// `[...]`: the class body is `pattern[start..end]` (after `[` and any
    /// `^`), read again for each byte it is tried against.
    Class {
        negated: bool,
        start: usize,
        end: usize,
    },
}

/// The token at `pattern[at..]` (which must not be empty) and where the next
/// one starts.
fn token(pattern: &[u8], at: usize) -> (Token, usize) {
    match pattern[at] {
        b'*' => (Token::Star, at + 1),
        b'?' => (Token::Any, at + 1),
        b'\\' if at + 1 < pattern.len() => (Token::Byte(pattern[at + 1]), at + 2),
        b'[' => {
            let mut i = at + 1;
            let negated = pattern.get(i) == Some(&b'^');
            if negated {
                i += 1;
            }
            let start = i;
            // The body's extent, as Redis' loop finds it: an escape takes
            // two bytes, a range three, `]` ends the class, the end of the
            // pattern ends it too.
            loop {
                match pattern.get(i) {
                    None => {
                        return (
                            Token::Class {
                                negated,
                                start,
                                end: i,
                            },
                            i,
                        );
                    }
                    Some(b'\\') if i + 1 < pattern.len() => i += 2,
                    Some(b']') => {
                        return (
                            Token::Class {
                                negated,
                                start,
                                end: i,
                            },
                            i + 1,
                        );
                    }
                    Some(_) if i + 2 < pattern.len() && pattern[i + 1] == b'-' => i += 3,
                    Some(_) => i += 1,
                }
            }
        }
        b => (Token::Byte(b), at + 1),
    }
}

fn fold(b: u8, nocase: bool) -> u8 {
    if nocase { b.to_ascii_lowercase() } else { b }
}

/// Whether the class body `body` (without its brackets) holds `c`.
fn class_holds(body: &[u8], c: u8, nocase: bool) -> bool {
    let mut i = 0;
    let mut hit = false;
    while i < body.len() {
        if body[i] == b'\\' && i + 1 < body.len() {
            // Exact even with nocase, as in Redis.
            hit |= body[i + 1] == c;
            i += 2;
        } else if i + 2 < body.len() && body[i + 1] == b'-' {
            let (mut lo, mut hi) = (body[i], body[i + 2]);
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            let (lo, hi, c) = (fold(lo, nocase), fold(hi, nocase), fold(c, nocase));
            hit |= lo <= c && c <= hi;
            i += 3;
        } else {
            hit |= fold(body[i], nocase) == fold(c, nocase);
            i += 1;
        }
    }
    hit
}

/// Whether a single-byte token matches `c`.
fn one(pattern: &[u8], t: Token, c: u8, nocase: bool) -> bool {
    match t {
        Token::Star => unreachable!("a star is not a single-byte token"),
        Token::Any => true,
        Token::Byte(b) => fold(b, nocase) == fold(c, nocase),
        Token::Class {
            negated,
            start,
            end,
        } => class_holds(&pattern[start..end], c, nocase) != negated,
    }
}

/// How many bytes the pattern needs at least: its tokens other than `*`.
fn min_len(pattern: &[u8]) -> usize {
    let (mut at, mut n) = (0, 0);
    while at < pattern.len() {
        let (t, next) = token(pattern, at);
        n += usize::from(!matches!(t, Token::Star));
        at = next;
    }
    n
}

/// Whether `name` matches the glob `pattern` (ASCII letters in any case
/// with `nocase`), in O(pattern × name) time and constant stack.
///
/// # Examples
///
/// ```
/// use fencelog_server::glob::matches;
/// assert!(matches(b"max*", b"maxclients", false));
/// assert!(matches(b"MAX[a-c]?", b"maxcl", true));
/// assert!(!matches(b"max\\*", b"maxclients", false));
/// ```
pub fn matches(pattern: &[u8], name: &[u8], nocase: bool) -> bool {
    if min_len(pattern) > name.len() {
        return false;
    }
    let (mut p, mut n) = (0, 0);
    // After the last `*` seen: where the pattern resumes, and the name byte
    // that star would take next if the rest fails.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() {
            let (t, next) = token(pattern, p);
            if matches!(t, Token::Star) {
                star = Some((next, n));
                p = next;
                continue;
            }
            if one(pattern, t, name[n], nocase) {
                p = next;
                n += 1;
                continue;
            }
        }
        // A mismatch, or the pattern ran out before the name: let the last
        // star take one more byte and try the rest again.
        let Some((resume, taken)) = star else {
            return false;
        };
        star = Some((resume, taken + 1));
        p = resume;
        n = taken + 1;
    }
    // The name is used up: only stars may be left.
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::*;

    /// Redis' `stringmatchlen`, recursion and all, ported as directly as the
    /// two differences in the module docs allow: the reference the linear
    /// matcher is checked against, on inputs small enough for it.
    fn reference(pattern: &[u8], name: &[u8], nocase: bool) -> bool {
        let eq = |a: u8, b: u8| fold(a, nocase) == fold(b, nocase);
        let (mut p, mut s) = (pattern, name);
        while !p.is_empty() && !s.is_empty() {
            match p[0] {
                b'*' => {
                    while p.len() > 1 && p[1] == b'*' {
                        p = &p[1..];
                    }
                    if p.len() == 1 {
                        return true;
                    }
                    return (0..s.len()).any(|i| reference(&p[1..], &s[i..], nocase));
                }
                b'?' => s = &s[1..],
                b'[' => {
                    p = &p[1..];
                    let not = p.first() == Some(&b'^');
                    if not {
                        p = &p[1..];
                    }
                    let mut hit = false;
                    loop {
                        if p.is_empty() {
                            break;
                        } else if p[0] == b'\\' && p.len() >= 2 {
                            p = &p[1..];
                            hit |= p[0] == s[0];
                        } else if p[0] == b']' {
                            break;
                        } else if p.len() >= 3 && p[1] == b'-' {
                            let (lo, hi) = (p[0].min(p[2]), p[0].max(p[2]));
                            let (lo, hi, c) =
                                (fold(lo, nocase), fold(hi, nocase), fold(s[0], nocase));
                            hit |= lo <= c && c <= hi;
                            p = &p[2..];
                        } else {
                            hit |= eq(p[0], s[0]);
                        }
                        p = &p[1..];
                    }
                    if hit == not {
                        return false;
                    }
                    s = &s[1..];
                    // Redis steps past the `]` below; an unterminated class
                    // has nothing left to step past.
                    if p.is_empty() {
                        return s.is_empty();
                    }
                }
                b'\\' if p.len() >= 2 => {
                    p = &p[1..];
                    if !eq(p[0], s[0]) {
                        return false;
                    }
                    s = &s[1..];
                }
                c => {
                    if !eq(c, s[0]) {
                        return false;
                    }
                    s = &s[1..];
                }
            }
            p = &p[1..];
        }
        while p.first() == Some(&b'*') {
            p = &p[1..];
        }
        p.is_empty() && s.is_empty()
    }

    fn both(pattern: &[u8], name: &[u8], nocase: bool) -> bool {
        let got = matches(pattern, name, nocase);
        assert_eq!(
            got,
            reference(pattern, name, nocase),
            "pattern {:?} name {:?} nocase {nocase}",
            String::from_utf8_lossy(pattern),
            String::from_utf8_lossy(name)
        );
        got
    }

    #[test]
    fn the_syntax_of_redis() {
        assert!(both(b"*", b"save", false));
        assert!(both(b"append*", b"appendonly", false));
        assert!(both(b"sav?", b"save", false));
        assert!(!both(b"save", b"saves", false));
        assert!(!both(b"x*", b"save", false));
        assert!(both(b"*a*e", b"save", false));
        assert!(both(b"[st]ave", b"save", false));
        assert!(!both(b"[^st]ave", b"save", false));
        assert!(both(b"[^a-r]ave", b"save", false));
        assert!(both(b"[a-z]ave", b"save", false));
        assert!(both(b"[z-a]ave", b"save", false));
        assert!(!both(b"[]save", b"save", false));
        assert!(both(b"[^]ave", b"save", false));
        assert!(both(b"s\\ave", b"save", false));
        assert!(both(b"\\*", b"*", false));
        assert!(!both(b"\\*", b"save", false));
        assert!(both(b"[\\]]", b"]", false));
        assert!(both(b"a\\", b"a\\", false));
        // An unterminated class runs to the end of the pattern.
        assert!(both(b"sav[abcde", b"save", false));
        // `[a-]` is a range up to `]`, and the class is then unterminated.
        assert!(both(b"[a-]", b"^", false));
        assert!(!both(b"[a-]", b"b", false));
    }

    #[test]
    fn nocase_folds_ascii_letters() {
        assert!(both(b"APPEND*", b"appendonly", true));
        assert!(!both(b"APPEND*", b"appendonly", false));
        assert!(both(b"[A-Z]ave", b"save", true));
        assert!(both(b"[S]AVE", b"save", true));
        // An escaped byte in a class compares exactly, as in Redis.
        assert!(!both(b"[\\S]ave", b"save", true));
    }

    /// The pattern that overflowed the stack of the recursive matcher
    /// (one frame per byte) and aborted the whole server.
    #[test]
    fn a_hundred_thousand_stars_neither_recurse_nor_take_long() {
        let pattern = vec![b'*'; 100_000];
        let started = Instant::now();
        assert!(matches(&pattern, b"client-query-buffer-limit", true));
        let mut z = pattern.clone();
        z.push(b'z');
        assert!(!matches(&z, b"client-query-buffer-limit", true));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// 14 stars then `z`: the recursive matcher backtracked through every
    /// way of splitting the name among the stars (over a minute).
    #[test]
    fn stars_then_a_missing_byte_do_not_backtrack_exponentially() {
        let mut pattern = vec![b'*'; 14];
        pattern.push(b'z');
        let name = vec![b'a'; 4096];
        let started = Instant::now();
        assert!(!matches(&pattern, &name, true));
        assert!(!matches(b"*a*a*a*a*a*a*a*a*a*a*a*a*a*a*z", &name, true));
        assert!(!matches(
            &[b"*a".repeat(500), b"*z".to_vec()].concat(),
            &name,
            true
        ));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    fn small_pattern() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(b"ab".to_vec()),
                3 => Just(b'*'),
                1 => Just(b'?'),
                1 => Just(b'['),
                1 => Just(b']'),
                1 => Just(b'^'),
                1 => Just(b'-'),
                1 => Just(b'\\'),
                1 => prop::sample::select(b"AB]^-".to_vec()),
            ],
            0..12,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]

        #[test]
        fn matches_like_redis_on_small_inputs(
            pattern in small_pattern(),
            name in prop::collection::vec(prop::sample::select(b"abAB-]^*".to_vec()), 1..10),
            nocase in any::<bool>(),
        ) {
            both(&pattern, &name, nocase);
        }

        #[test]
        fn matches_like_redis_on_any_bytes(
            pattern in prop::collection::vec(any::<u8>(), 0..10),
            name in prop::collection::vec(any::<u8>(), 1..8),
            nocase in any::<bool>(),
        ) {
            both(&pattern, &name, nocase);
        }
    }
}
