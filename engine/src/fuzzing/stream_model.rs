//! The engine against a plain in-memory model of SPEC §2–3, through random
//! operations on a few streams, power cuts at random points (the crash-
//! simulating storage drops or tears whatever was not synced) and reopens.
//! Shared by `engine/tests/model.rs` (proptest) and the `engine_model` fuzz
//! target.
//!
//! Checked after every step: the same accepted/rejected answers with the
//! same numbers, the same records, highest tokens that never decrease,
//! offsets that are never reused, and no acknowledged write lost. An
//! operation interrupted by the power cut may or may not have happened —
//! its caller got an error, not an answer — so after recovery the model
//! takes whichever of the two outcomes the engine shows, and nothing else.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use fencelog_wal::{CrashMode, SimStorage, Storage};

use super::Input;
use crate::{Error, Log, ManualClock, Options, Record, Token};

/// The streams the actions touch (an action names one by index).
pub const STREAMS: [&str; 3] = ["a", "b", "c"];

/// One step of a run.
#[derive(Debug, Clone)]
#[allow(missing_docs)] // the variants say what they are; fields: stream index, token, …
pub enum Action {
    Append {
        s: usize,
        t: u64,
        payloads: Vec<Vec<u8>>,
    },
    AppendAt {
        s: usize,
        t: u64,
        delta: i64,
        payloads: Vec<Vec<u8>>,
    },
    /// Repeats the last conditional append exactly (a client retrying).
    Retry,
    Fence {
        s: usize,
        t: u64,
    },
    Trim {
        s: usize,
        t: u64,
        frac: f64,
    },
    Delete {
        s: usize,
        t: u64,
    },
    Read {
        s: usize,
        frac: f64,
        max: u32,
    },
    /// Cuts the power now, between operations.
    Cut {
        mode: CrashMode,
    },
    /// Arms a power cut at the n-th next file operation: it lands in the
    /// middle of some later operation (or of the background allocator).
    ArmCut {
        after: u64,
        mode: CrashMode,
    },
    Reopen,
}

/// An answer, as the model and the engine both give it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Ok(u64),
    Stale(u64, u64),
    Mismatch(u64, u64),
    Trimmed(u64, u64),
    Beyond(u64, u64),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct MStream {
    highest: u64,
    next: u64,
    start: u64,
    records: BTreeMap<u64, (u64, Vec<u8>)>,
}

#[derive(Debug, Clone, Default)]
struct Model {
    streams: BTreeMap<usize, MStream>,
    /// The token floor: after recovery cut entries, every stream's highest
    /// token is at least this (it covers every token acknowledged before).
    floor: u64,
}

impl Model {
    /// A stream as the engine shows it: its highest token at least the floor.
    fn get(&self, s: usize) -> MStream {
        let mut st = self.streams.get(&s).cloned().unwrap_or_default();
        st.highest = st.highest.max(self.floor);
        st
    }

    fn stream(&mut self, s: usize) -> &mut MStream {
        let floor = self.floor;
        let st = self.streams.entry(s).or_default();
        st.highest = st.highest.max(floor);
        st
    }

    fn append(&mut self, s: usize, t: u64, ps: &[Vec<u8>]) -> Answer {
        let st = self.stream(s);
        if t < st.highest {
            return Answer::Stale(t, st.highest);
        }
        let first = st.next;
        for p in ps {
            st.records.insert(st.next, (t, p.clone()));
            st.next += 1;
        }
        st.highest = t;
        Answer::Ok(first)
    }

    fn append_at(&mut self, s: usize, t: u64, expected: u64, ps: &[Vec<u8>]) -> Answer {
        let st = self.get(s);
        if expected != st.next {
            let retry = expected < st.next
                && expected + ps.len() as u64 <= st.next
                && ps
                    .iter()
                    .enumerate()
                    .all(|(i, p)| st.records.get(&(expected + i as u64)) == Some(&(t, p.clone())));
            if retry {
                return Answer::Ok(expected);
            }
            if t < st.highest {
                return Answer::Stale(t, st.highest);
            }
            return Answer::Mismatch(expected, st.next);
        }
        self.append(s, t, ps)
    }

    fn fence(&mut self, s: usize, t: u64) -> Answer {
        let st = self.stream(s);
        if t < st.highest {
            return Answer::Stale(t, st.highest);
        }
        st.highest = t;
        Answer::Ok(t)
    }

    fn trim(&mut self, s: usize, t: u64, before: u64) -> Answer {
        let st = self.get(s);
        if t < st.highest {
            return Answer::Stale(t, st.highest);
        }
        if before > st.next {
            return Answer::Beyond(before, st.next);
        }
        let st = self.stream(s);
        st.highest = t;
        if before > st.start {
            st.start = before;
            st.records = st.records.split_off(&before);
        }
        Answer::Ok(st.start)
    }

    fn delete(&mut self, s: usize, t: u64) -> Answer {
        let st = self.stream(s);
        if t < st.highest {
            return Answer::Stale(t, st.highest);
        }
        st.highest = t;
        let removed = st.next - st.start;
        st.start = st.next;
        st.records.clear();
        Answer::Ok(removed)
    }
}

fn answer(r: Result<u64, Error>) -> Result<Answer, Error> {
    match r {
        Ok(v) => Ok(Answer::Ok(v)),
        Err(Error::Stale { presented, highest }) => Ok(Answer::Stale(presented, highest)),
        Err(Error::OffsetMismatch { expected, next }) => Ok(Answer::Mismatch(expected, next)),
        Err(Error::Trimmed { requested, start }) => Ok(Answer::Trimmed(requested, start)),
        Err(Error::TrimBeyondEnd { before, next }) => Ok(Answer::Beyond(before, next)),
        Err(e) => Err(e),
    }
}

fn tok(t: u64) -> Token {
    Token::new(t).unwrap()
}

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 64 << 10;
    o.wal.max_entry_bytes = 48 << 10;
    o.wal.max_batch_bytes = 64 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

struct World {
    sim: SimStorage,
    log: Option<Log>,
}

impl World {
    fn open(sim: SimStorage) -> World {
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let log = Log::open_on(
            storage,
            Arc::new(ManualClock::default()),
            Path::new("/db"),
            opts(),
        )
        .unwrap_or_else(|e| panic!("recovery failed: {e}"));
        World {
            sim,
            log: Some(log),
        }
    }

    fn log(&self) -> &Log {
        self.log.as_ref().unwrap()
    }

    /// Power is gone (cut now, or an armed cut happened): recover from what
    /// the disk holds.
    fn recover(&mut self, mode: CrashMode) {
        let image = self.sim.image().unwrap_or_else(|| self.sim.cut_power(mode));
        self.log = None;
        *self = World::open(image);
    }

    fn reopen(&mut self) {
        self.log = None;
        let sim = self.sim.clone();
        *self = World::open(sim);
    }
}

/// The engine's state of stream `s`: stat plus every readable record.
fn engine_stream(log: &Log, s: usize) -> MStream {
    let name = STREAMS[s];
    let st = log.stat(name).unwrap_or_else(|e| {
        panic!(
            "stream {name}: stat failed: {e}\nsegments {:?}\nreport {:?}\nrecords from 0: {:?}",
            log.segments(),
            log.recovery_report(),
            log.read(name, 0, 5)
                .map(|r| r.iter().map(|r| r.offset).collect::<Vec<_>>())
        )
    });
    let mut records = BTreeMap::new();
    let mut from = st.start_offset;
    while from < st.next_offset {
        let got = log.read(name, from, 1000).unwrap_or_else(|e| {
            panic!(
                "stream {name}: read at {from} failed: {e}\nstat {st:?}\nsegments {:?}\nreport {:?}",
                log.segments(),
                log.recovery_report()
            )
        });
        assert!(
            !got.is_empty(),
            "stream {name}: nothing readable at {from} < {}",
            st.next_offset
        );
        for r in got {
            assert_eq!(r.offset, from);
            records.insert(r.offset, (r.token.get(), r.payload.to_vec()));
            from += 1;
        }
    }
    assert_eq!(st.records, st.next_offset - st.start_offset);
    let bytes: u64 = records.values().map(|(_, p)| p.len() as u64).sum();
    assert_eq!(st.bytes, bytes, "stream {name}: stat bytes");
    MStream {
        highest: st.highest_token,
        next: st.next_offset,
        start: st.start_offset,
        records,
    }
}

fn check_all(log: &Log, model: &Model) {
    for (s, name) in STREAMS.iter().enumerate() {
        assert_eq!(engine_stream(log, s), model.get(s), "stream {name}");
    }
}

/// An action without its payload bytes, for tracing.
fn brief(a: &Action) -> String {
    let sizes = |ps: &Vec<Vec<u8>>| ps.iter().map(Vec::len).collect::<Vec<_>>();
    match a {
        Action::Append { s, t, payloads } => format!("append {s} t{t} {:?}", sizes(payloads)),
        Action::AppendAt {
            s,
            t,
            delta,
            payloads,
        } => {
            format!("append_at {s} t{t} next{delta:+} {:?}", sizes(payloads))
        }
        other => format!("{other:?}"),
    }
}

/// With FENCELOG_MODEL_TRACE=FILE, the actions of each failing run are
/// written there: after shrinking, it holds the minimal failing case.
struct Trace(Option<std::path::PathBuf>, Vec<String>);

impl Drop for Trace {
    fn drop(&mut self) {
        if let Some(path) = &self.0
            && std::thread::panicking()
        {
            let _ = std::fs::write(path, self.1.join("\n"));
        }
    }
}

/// The last conditional append, for a retry: stream, token, expected
/// offset, payloads.
type LastAt = Option<(usize, u64, u64, Vec<Vec<u8>>)>;

/// Runs `actions` on a fresh log on a [`SimStorage`], checking the engine
/// against the model after every step (see the module docs); panics on any
/// difference.
pub fn run(actions: Vec<Action>) {
    let mut world = World::open(SimStorage::new());
    let mut model = Model::default();
    let mut last_at: LastAt = None;
    let mut armed: Option<CrashMode> = None;
    let mut highest_seen = [0u64; STREAMS.len()];
    let mut trace = Trace(
        std::env::var_os("FENCELOG_MODEL_TRACE").map(Into::into),
        Vec::new(),
    );
    for action in actions {
        trace.1.push(brief(&action));
        // Each write: what the engine answered, and the model's other
        // possible world in case the operation was cut short.
        let Some((before, result, expect)) = write(&world, &mut model, &action, &mut last_at)
        else {
            other(&mut world, &mut model, &action, &mut armed);
            continue;
        };
        match result {
            Ok(got) => assert_eq!(got, expect, "{}", brief(&action)),
            Err(Error::Failed { .. } | Error::Io(_))
                if armed.is_some() && world.sim.image().is_some() =>
            {
                // The power went during this operation: it may or may not
                // have happened. Recover and see which; nothing else is
                // allowed.
                let mode = armed.take().unwrap();
                world.recover(mode);
                model = settle_cut_short(&world, model, before, &action, &last_at);
            }
            Err(e) => panic!("{}: unexpected error {e}", brief(&action)),
        }
        for (s, seen) in highest_seen.iter_mut().enumerate() {
            let h = model.get(s).highest;
            assert!(h >= *seen, "the highest token of {} went down", STREAMS[s]);
            *seen = h;
        }
    }
    world.recover(armed.take().unwrap_or(CrashMode::LoseUnsynced));
    sync_floor(&world, &mut model, None);
    check_all(world.log(), &model);
}

/// Runs a write action on the engine and the model: the model before it,
/// the engine's answer, the model's. `None` for an action that writes
/// nothing (or a retry with nothing to retry).
fn write(
    world: &World,
    model: &mut Model,
    action: &Action,
    last_at: &mut LastAt,
) -> Option<(Model, Result<Answer, Error>, Answer)> {
    // Tokens are relative to the floor: after a cut raised it, the actions
    // go on with tokens above it.
    let base = model.floor;
    let before = model.clone();
    let log = world.log();
    Some(match action {
        Action::Append { s, t, payloads } => {
            let t = base + *t;
            let r = log.append(STREAMS[*s], tok(t), payloads);
            (before, answer(r), model.append(*s, t, payloads))
        }
        Action::AppendAt {
            s,
            t,
            delta,
            payloads,
        } => {
            let t = base + *t;
            let next = model.get(*s).next;
            let expected = (next as i64 + delta).max(0) as u64;
            *last_at = Some((*s, t, expected, payloads.clone()));
            let r = log.append_at(STREAMS[*s], tok(t), expected, payloads);
            let expect = model.append_at(*s, t, expected, payloads);
            (before, answer(r), expect)
        }
        Action::Retry => {
            let (s, t, expected, payloads) = last_at.clone()?;
            let r = log.append_at(STREAMS[s], tok(t), expected, &payloads);
            let expect = model.append_at(s, t, expected, &payloads);
            (before, answer(r), expect)
        }
        Action::Fence { s, t } => {
            let t = base + *t;
            let r = log.fence(STREAMS[*s], tok(t)).map(|t| t.get());
            (before, answer(r), model.fence(*s, t))
        }
        Action::Trim { s, t, frac } => {
            let before_off = (model.get(*s).next as f64 * frac) as u64;
            let t = base + *t;
            let r = log.trim(STREAMS[*s], tok(t), before_off);
            (before, answer(r), model.trim(*s, t, before_off))
        }
        Action::Delete { s, t } => {
            let t = base + *t;
            let r = log.delete(STREAMS[*s], tok(t));
            (before, answer(r), model.delete(*s, t))
        }
        Action::Read { .. } | Action::Cut { .. } | Action::ArmCut { .. } | Action::Reopen => {
            return None;
        }
    })
}

/// Runs an action that writes nothing: a read, checked against the
/// model, or a cut, an armed cut or a reopen, after which the engine must
/// hold what the model does.
fn other(world: &mut World, model: &mut Model, action: &Action, armed: &mut Option<CrashMode>) {
    match action {
        Action::Read { s, frac, max } => {
            let m = model.get(*s);
            let from = (m.next as f64 * frac) as u64;
            let got = world.log().read(STREAMS[*s], from, *max);
            if matches!(got, Err(Error::Io(_))) && world.sim.image().is_some() {
                // An armed cut already took the machine down (in the
                // background, between operations): recover.
                let mode = armed.take().unwrap();
                world.recover(mode);
            } else {
                check_read(&m, from, *max, got);
                return;
            }
        }
        Action::Cut { mode } => world.recover(armed.take().unwrap_or(*mode)),
        Action::ArmCut { after, mode } => {
            if armed.is_none() {
                world.sim.cut_power_after(*after, *mode);
                *armed = Some(*mode);
            }
            return;
        }
        Action::Reopen => match armed.take() {
            Some(mode) => world.recover(mode),
            None => world.reopen(),
        },
        _ => return,
    }
    sync_floor(world, model, None);
    check_all(world.log(), model);
}

/// A read from `from` answers what the model holds there.
fn check_read(m: &MStream, from: u64, max: u32, got: Result<Vec<Record>, Error>) {
    if from < m.start {
        assert!(
            matches!(got, Err(Error::Trimmed { requested, start }) if requested == from && start == m.start)
        );
    } else {
        let got = got.unwrap();
        let want: Vec<_> = m.records.range(from..).take(max as usize).collect();
        assert_eq!(got.len(), want.len());
        for (r, (o, (t, p))) in got.iter().zip(want) {
            assert_eq!((r.offset, r.token.get(), &r.payload[..]), (*o, *t, &p[..]));
        }
    }
}

/// After a power cut during `action`: the engine holds either the model
/// with the action (`happened`) or without it (`before`), nothing else;
/// answers the one it holds.
fn settle_cut_short(
    world: &World,
    mut happened: Model,
    mut before: Model,
    action: &Action,
    last_at: &LastAt,
) -> Model {
    // What was acknowledged is what `before` holds.
    sync_floor(world, &mut happened, Some(&before));
    before.floor = happened.floor;
    let s = match action {
        Action::Append { s, .. }
        | Action::AppendAt { s, .. }
        | Action::Fence { s, .. }
        | Action::Trim { s, .. }
        | Action::Delete { s, .. } => *s,
        Action::Retry => last_at.as_ref().unwrap().0,
        _ => unreachable!(),
    };
    let shown = engine_stream(world.log(), s);
    let model = if shown == happened.get(s) {
        happened
    } else {
        assert_eq!(
            shown,
            before.get(s),
            "neither outcome of the cut-short {}",
            brief(action)
        );
        before
    };
    check_all(world.log(), &model);
    model
}

/// After a recovery: takes the engine's token floor into the model. It
/// never goes down, and only a salvage cut raises it (the model never
/// salvages): a torn tail was never acknowledged, and cutting it raises
/// nothing, so the floor stays where it was and each stream's highest token
/// is what the model (the acknowledged writes, plus perhaps the one cut
/// short) says, which `check_all` holds the engine to. When a salvage does
/// raise it, it covers every token acknowledged before (`acked`, or the
/// model itself).
fn sync_floor(world: &World, model: &mut Model, acked: Option<&Model>) {
    let floor = world.log().metrics().token_floor;
    assert!(floor >= model.floor, "the token floor went down");
    match world.log().recovery_report().floor_raised {
        None => assert_eq!(
            floor, model.floor,
            "the token floor rose without a salvage cut"
        ),
        Some(raise) => {
            assert_eq!(raise.to, floor);
            let acked = acked.unwrap_or(model);
            for (s, name) in STREAMS.iter().enumerate() {
                let h = acked.get(s).highest;
                assert!(
                    floor >= h,
                    "a salvage left the floor at {floor}, below token {h} acknowledged on {name}"
                );
            }
        }
    }
    model.floor = floor;
}

/// Actions decoded from fuzz input, at most `max` of them: one byte picks
/// the kind (weighted as the proptest strategy weighs them), the next bytes
/// its arguments.
pub fn actions_from_bytes(data: &[u8], max: usize) -> Vec<Action> {
    let mut r = Input::new(data);
    let mut actions = Vec::new();
    while !r.done() && actions.len() < max {
        let s = usize::from(r.u8()) % STREAMS.len();
        let t = 1 + u64::from(r.u8() % 9);
        let action = match r.u8() % 72 {
            0..30 => Action::Append {
                s,
                t,
                payloads: payloads(&mut r),
            },
            30..40 => Action::AppendAt {
                s,
                t,
                delta: i64::from(r.u8() % 4) - 2,
                payloads: payloads(&mut r),
            },
            40..43 => Action::Retry,
            43..49 => Action::Fence { s, t },
            49..54 => Action::Trim {
                s,
                t,
                frac: f64::from(r.u8()) / 212.0,
            },
            54..56 => Action::Delete { s, t },
            56..66 => Action::Read {
                s,
                frac: f64::from(r.u8()) / 232.0,
                max: 1 + u32::from(r.u8() % 50),
            },
            66..68 => Action::Cut { mode: mode(&mut r) },
            68..70 => Action::ArmCut {
                after: u64::from(r.u8() % 40),
                mode: mode(&mut r),
            },
            _ => Action::Reopen,
        };
        actions.push(action);
    }
    actions
}

/// A crash mode from the input.
pub(crate) fn mode(r: &mut Input<'_>) -> CrashMode {
    match r.u8() % 4 {
        0 => CrashMode::LoseUnsynced,
        1 => CrashMode::LastWriteOnly,
        2 => CrashMode::ProcessCrash,
        _ => CrashMode::Torn { seed: r.u64() },
    }
}

/// One to three payloads: mostly small, some over 2000 bytes (so segments
/// rotate), the bytes a pattern from the input (cheap to make, and the
/// fuzzer need not spell out kilobytes).
fn payloads(r: &mut Input<'_>) -> Vec<Vec<u8>> {
    let n = 1 + usize::from(r.u8() % 3);
    (0..n)
        .map(|_| {
            let len = match r.u8() {
                0..192 => usize::from(r.u8() % 40),
                _ => 2000 + usize::from(r.u16()) % 10_000,
            };
            let seed = r.u8();
            (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
        })
        .collect()
}
