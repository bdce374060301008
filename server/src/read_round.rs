//! A connection's pipelined reads, in a group, share one round.
//!
//! A read through a Raft group may look at the engine once a ReadIndex
//! round that started after the read arrived is done (`Store::read`). A
//! read given a future of its own to wait on costs the leader its own
//! allocations, an answer queued and polled, and a wake-up of the
//! connection per read: a fifth more CPU per read than a single node's at
//! pipeline 16. So a connection joins one round for every request whose
//! bytes it has received when its first pipelined read is taken, waits
//! for it once, and then runs those reads as a single node does, each
//! answered at once. A read whose bytes arrived after the round was
//! joined waits for the next.
//!
//! Why that is linearizable: each read so run arrived before the round
//! was joined, so the round (leadership confirmed by a quorum, the engine
//! applied up to the commit index) started after the read was sent, which
//! is what ReadIndex asks; the engine read is the one in use when the
//! round ended, or newer.

use fencelog::Log;

use crate::store::{BoxFuture, Store};

/// The most reads one connection tells a round it brings.
const MAX_EXPECTED: usize = 1024;

/// The round of a connection's reads, and what it covers.
#[derive(Default)]
pub(crate) struct ReadRounds {
    /// Bytes received on the connection so far.
    received: u64,
    /// Where in those bytes the request being run ends.
    request_end: u64,
    /// Its length.
    request_len: u64,
    round: Option<Round>,
}

struct Round {
    /// The requests that end within the first `covers` bytes arrived
    /// before the round was joined.
    covers: u64,
    outcome: Outcome,
}

enum Outcome {
    Waiting,
    /// The engine to read.
    Done(Log),
    /// Each read goes its own way and answers its own failure.
    Failed,
}

/// What a pipelined read does now.
pub(crate) enum Turn {
    /// Waits for the round; the connection queues this future, which ends
    /// it ([`ReadRounds::ended`]), behind the answers before it.
    Join(BoxFuture<'static, Option<Log>>),
    /// Waits for the round already joined.
    Wait,
    /// Runs now: on this engine (the round is done), or on its own
    /// (`None`: the round failed, or the store offers none).
    Run(Option<Log>),
}

impl ReadRounds {
    /// `n` more bytes were received.
    pub(crate) fn received(&mut self, n: usize) {
        self.received += n as u64;
    }

    /// A request was parsed, leaving `unparsed` bytes of input behind it.
    pub(crate) fn parsed(&mut self, unparsed: usize) {
        // Saturating: the input only grows by what was received, but a
        // count off by a cleared buffer must not stop the connection.
        let end = self.received.saturating_sub(unparsed as u64);
        self.request_len = end.saturating_sub(self.request_end);
        self.request_end = end;
    }

    /// The turn of the pipelined read last parsed.
    pub(crate) fn turn(&mut self, store: &dyn Store) -> Turn {
        match self.round.as_ref().filter(|r| self.request_end <= r.covers) {
            Some(Round {
                outcome: Outcome::Waiting,
                ..
            }) => Turn::Wait,
            Some(Round {
                outcome: Outcome::Done(log),
                ..
            }) => Turn::Run(Some(log.clone())),
            Some(Round {
                outcome: Outcome::Failed,
                ..
            }) => Turn::Run(None),
            // The reads the round covers, as far as can be told now: this
            // one and the input behind it, if the requests there are as
            // long as this one.
            None => match store.read_round(self.expected_reads()) {
                Some(round) => {
                    self.round = Some(Round {
                        covers: self.received,
                        outcome: Outcome::Waiting,
                    });
                    Turn::Join(round)
                }
                None => Turn::Run(None),
            },
        }
    }

    /// About how many reads a round joined now covers: this one, and as
    /// many again as requests of its length fit in the input received
    /// behind it (at most [`MAX_EXPECTED`]).
    fn expected_reads(&self) -> usize {
        let behind = self.received.saturating_sub(self.request_end) / self.request_len.max(1);
        1 + usize::try_from(behind)
            .unwrap_or(MAX_EXPECTED)
            .min(MAX_EXPECTED)
    }

    /// The round joined ended: with the engine to read, or failed.
    pub(crate) fn ended(&mut self, log: Option<Log>) {
        if let Some(round) = &mut self.round {
            round.outcome = match log {
                Some(log) => Outcome::Done(log),
                None => Outcome::Failed,
            };
        }
    }

    /// The connection waits: a round that ended is let go (an idle
    /// connection keeps no engine alive; a read received later needs a
    /// round of its own anyway, and one still in the input buffer joins
    /// another).
    pub(crate) fn idle(&mut self) {
        if let Some(Round {
            outcome: Outcome::Done(_) | Outcome::Failed,
            ..
        }) = self.round
        {
            self.round = None;
        }
    }
}
