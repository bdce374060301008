//! Random acquire / renew / release / clock / crash / reopen sequences,
//! checked for the coordinator's promises. Shared by
//! `engine/tests/leases_model.rs` (proptest) and the `engine_model` fuzz
//! target.
//!
//! - at most one holder per name at any instant of the model clock, where a
//!   holder is an owner whose last answered acquire or renew promised it the
//!   lease until a time still ahead (what a real holder believes);
//! - every token answered by a fresh acquisition is above every token
//!   answered before, across crashes;
//! - between crashes, the exact answers: HELD with the time left, LOST after
//!   expiry (never revived), the same token for the live holder.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fencelog_wal::{CrashMode, SimStorage, Storage};

use super::Input;
use crate::{AcquireOptions, Clock, Error, Log, ManualClock, Options, Token};

/// The lease names the actions touch (by index).
pub const NAMES: [&str; 2] = ["l1", "l2"];
/// The owners (by index).
pub const OWNERS: [&str; 3] = ["a", "b", "c"];

/// One step of a run.
#[derive(Debug, Clone)]
#[allow(missing_docs)] // the variants say what they are; fields: name and owner index, ttl, …
pub enum Action {
    Acquire {
        n: usize,
        o: usize,
        ttl_s: u64,
        fence: bool,
    },
    Renew {
        n: usize,
        o: usize,
        ttl_s: u64,
    },
    Release {
        n: usize,
        o: usize,
    },
    Advance {
        ms: u64,
    },
    Crash {
        mode: CrashMode,
    },
    ArmCut {
        after: u64,
    },
    Reopen,
    /// A big append elsewhere: segments rotate, so that recovery starts
    /// from checkpoints (which carry the leases and the counter).
    Filler,
}

/// What an owner believes about a lease it was granted.
#[derive(Debug, Clone, Copy)]
struct Belief {
    token: u64,
    until_ms: u64,
}

#[derive(Default)]
struct Model {
    /// (name, owner) -> the owner's belief.
    beliefs: BTreeMap<(usize, usize), Belief>,
    /// The highest token ever answered.
    max_token: u64,
    /// Every token granted to (name, owner).
    granted: BTreeMap<(usize, usize), std::collections::BTreeSet<u64>>,
    /// Names whose engine state is known exactly (no crash since the last
    /// grant): holder, token, expiry on the engine's clock.
    exact: BTreeMap<usize, Option<(usize, u64, u64)>>,
}

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 64 << 10;
    o.wal.max_entry_bytes = 32 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

fn open(sim: &SimStorage, clock: &Arc<ManualClock>) -> Log {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    Log::open_on(storage, clock.clone(), Path::new("/db"), opts()).unwrap()
}

/// Runs `actions` on a fresh log on a [`SimStorage`] with a manual clock,
/// checking the coordinator's promises after every step (see the module
/// docs); panics on any violation.
pub fn run(actions: Vec<Action>) {
    let clock = Arc::new(ManualClock::default());
    let sim = SimStorage::new();
    let log = open(&sim, &clock);
    let mut m = Model::default();
    // Every name starts known: free.
    for n in 0..NAMES.len() {
        m.exact.insert(n, None);
    }
    let mut w = World {
        clock,
        sim,
        log,
        m,
        armed: false,
    };
    for action in actions {
        let now = w.clock.now_ms();
        match action {
            Action::Acquire { n, o, ttl_s, fence } => w.acquire(n, o, ttl_s, fence, now),
            Action::Renew { n, o, ttl_s } => w.renew(n, o, ttl_s, now),
            Action::Release { n, o } => w.release(n, o, now),
            Action::Advance { ms } => w.clock.advance(Duration::from_millis(ms)),
            Action::Filler => {
                let filler = w
                    .log
                    .append("filler", Token::new(1).unwrap(), &[vec![0u8; 12 << 10]]);
                if let Err(e) = filler {
                    w.cut_or_panic(e);
                }
            }
            Action::Crash { mode } => {
                w.armed = false;
                w.crash(mode);
            }
            Action::ArmCut { after } => {
                if !w.armed {
                    w.sim.cut_power_after(after, CrashMode::LoseUnsynced);
                    w.armed = true;
                }
            }
            Action::Reopen => w.reopen(),
        }
    }
}

/// The log under test, its storage and clock, and the model.
struct World {
    clock: Arc<ManualClock>,
    sim: SimStorage,
    log: Log,
    m: Model,
    /// A power cut is armed: the next failure is it.
    armed: bool,
}

impl World {
    fn crash(&mut self, mode: CrashMode) {
        self.sim = self.sim.image().unwrap_or_else(|| self.sim.cut_power(mode));
        self.log = open(&self.sim, &self.clock);
        // The restart rule and unsynced releases make the engine's view
        // fuzzy until the next grant; beliefs stay what owners were told.
        self.m.exact.clear();
    }

    /// A failure is the armed power cut (the log restarts from what was
    /// durable), or a bug.
    fn cut_or_panic(&mut self, e: Error) {
        match e {
            Error::Failed { .. } | Error::Io(_) if self.armed => {
                self.armed = false;
                self.crash(CrashMode::LoseUnsynced);
            }
            e => panic!("{e}"),
        }
    }

    fn reopen(&mut self) {
        if self.armed {
            self.armed = false;
            self.crash(CrashMode::LoseUnsynced);
        } else {
            // Close before reopening: the directory's lock admits one open
            // log (a throwaway one stands in meanwhile).
            drop(std::mem::replace(
                &mut self.log,
                open(&SimStorage::new(), &self.clock),
            ));
            self.log = open(&self.sim, &self.clock);
            self.m.exact.clear();
        }
    }

    fn acquire(&mut self, n: usize, o: usize, ttl_s: u64, fence: bool, now: u64) {
        let opts = AcquireOptions { fence, wait: None };
        let m = &mut self.m;
        match self
            .log
            .acquire(NAMES[n], OWNERS[o], Duration::from_secs(ttl_s), opts)
        {
            Ok(g) => {
                let token = g.token.get();
                m.note_grant(n, o, token, now + ttl_s * 1000, now);
                if fence {
                    assert!(self.log.stat(NAMES[n]).unwrap().highest_token >= token);
                }
            }
            Err(Error::Held { remaining_ms }) => {
                if let Some(state) = m.exact.get(&n) {
                    match state {
                        Some((h, _, until)) if *until > now && *h != o => {
                            assert_eq!(remaining_ms, until - now);
                        }
                        other => panic!("HELD, but the lease is {other:?} (now {now})"),
                    }
                }
            }
            Err(Error::Stale { presented, highest }) => {
                // Only the live holder re-acquiring with fence, after the
                // stream passed its token.
                assert!(fence && highest > presented);
                assert!(
                    m.granted
                        .get(&(n, o))
                        .is_some_and(|t| t.contains(&presented))
                );
            }
            Err(e) => self.cut_or_panic(e),
        }
    }

    fn renew(&mut self, n: usize, o: usize, ttl_s: u64, now: u64) {
        let Some(b) = self.m.beliefs.get(&(n, o)).copied() else {
            return;
        };
        let token = Token::new(b.token).unwrap();
        let m = &mut self.m;
        match self
            .log
            .renew(NAMES[n], OWNERS[o], token, Duration::from_secs(ttl_s))
        {
            Ok(_) => {
                if let Some(state) = m.exact.get(&n) {
                    assert!(
                        matches!(state, Some((h, t, until)) if *h == o && *t == b.token && *until > now),
                        "renewed a lease the engine should consider lost: {state:?}"
                    );
                }
                let until = now + ttl_s * 1000;
                m.beliefs.insert(
                    (n, o),
                    Belief {
                        token: b.token,
                        until_ms: until,
                    },
                );
                if m.exact.contains_key(&n) {
                    m.exact.insert(n, Some((o, b.token, until)));
                }
            }
            Err(Error::Lost) => {
                if let Some(Some((h, t, until))) = m.exact.get(&n) {
                    assert!(
                        !(*h == o && *t == b.token && *until > now),
                        "LOST for a live lease"
                    );
                }
                m.beliefs.remove(&(n, o));
            }
            Err(e) => self.cut_or_panic(e),
        }
    }

    fn release(&mut self, n: usize, o: usize, now: u64) {
        let Some(b) = self.m.beliefs.get(&(n, o)).copied() else {
            return;
        };
        match self
            .log
            .release(NAMES[n], OWNERS[o], Token::new(b.token).unwrap())
        {
            Ok(released) => {
                if let Some(state) = self.m.exact.get(&n) {
                    let live = matches!(state, Some((h, t, until)) if *h == o && *t == b.token && *until > now);
                    assert_eq!(released, live);
                    if released {
                        self.m.exact.insert(n, None);
                    }
                }
                self.m.beliefs.remove(&(n, o));
            }
            Err(e) => {
                self.m.beliefs.remove(&(n, o));
                self.cut_or_panic(e);
            }
        }
    }
}

impl Model {
    /// `token` granted to owner `o` of name `n` until `until`: checks it
    /// against every answer before, then believes it.
    fn note_grant(&mut self, n: usize, o: usize, token: u64, until: u64, now: u64) {
        let same = match self.exact.get(&n) {
            // Known exactly: the same token iff this owner holds it.
            Some(state) => {
                let live_here = matches!(state, Some((h, _, until)) if *h == o && *until > now);
                if live_here {
                    assert_eq!(
                        Some(token),
                        state.map(|s| s.1),
                        "the live holder gets its token back"
                    );
                }
                live_here
            }
            // After a crash a lease of this owner may be held again (restart
            // rule, or a release that did not reach the disk): it comes back
            // with its token.
            None => self
                .granted
                .get(&(n, o))
                .is_some_and(|t| t.contains(&token)),
        };
        if !same {
            assert!(
                token > self.max_token,
                "token {token} not above {} answered before",
                self.max_token
            );
        }
        for (&(bn, bo), b) in &self.beliefs {
            if bn == n && bo != o {
                assert!(
                    b.until_ms <= now,
                    "{} granted to {} while {} holds it until {} (now {now})",
                    NAMES[n],
                    OWNERS[o],
                    OWNERS[bo],
                    b.until_ms
                );
            }
        }
        self.granted.entry((n, o)).or_default().insert(token);
        self.max_token = self.max_token.max(token);
        self.beliefs.insert(
            (n, o),
            Belief {
                token,
                until_ms: until,
            },
        );
        self.exact.insert(n, Some((o, token, until)));
    }
}

/// Actions decoded from fuzz input, at most `max` of them: one byte picks
/// the kind (weighted as the proptest strategy weighs them), the next bytes
/// its arguments.
pub fn actions_from_bytes(data: &[u8], max: usize) -> Vec<Action> {
    let mut r = Input::new(data);
    let mut actions = Vec::new();
    while !r.done() && actions.len() < max {
        let n = usize::from(r.u8()) % NAMES.len();
        let o = usize::from(r.u8()) % OWNERS.len();
        let ttl_s = 1 + u64::from(r.u8() % 7);
        let action = match r.u8() % 23 {
            0..6 => Action::Acquire {
                n,
                o,
                ttl_s,
                fence: r.u8() & 1 == 1,
            },
            6..10 => Action::Renew { n, o, ttl_s },
            10..12 => Action::Release { n, o },
            12..17 => Action::Advance {
                ms: u64::from(r.u16()) % 6000,
            },
            17 => Action::Crash {
                mode: match super::stream_model::mode(&mut r) {
                    // As the proptest strategy: the lease runs draw every
                    // mode but this one.
                    CrashMode::LastWriteOnly => CrashMode::LoseUnsynced,
                    m => m,
                },
            },
            18 => Action::ArmCut {
                after: u64::from(r.u8() % 6),
            },
            19 => Action::Reopen,
            _ => Action::Filler,
        };
        actions.push(action);
    }
    actions
}
