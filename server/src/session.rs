//! What a connection knows about its client, and the transaction it is
//! queuing.

use std::net::SocketAddr;

use bytes::Bytes;
use fencelog::TxOp;

use crate::context::ClientTag;
use crate::protocol::{ARG_OVERHEAD_BYTES, Request};

/// What a connection knows about its client.
pub struct Session {
    /// The connection's id (`CLIENT ID`).
    pub id: u64,
    /// The client's address, for log events.
    pub peer: SocketAddr,
    /// RESP version: 2, or 3 after `HELLO 3`.
    pub proto: u8,
    /// Whether the client may run commands (always, without a password).
    pub authenticated: bool,
    /// `CLIENT SETNAME`.
    pub name: Option<Bytes>,
    /// The transaction being queued, between `MULTI` and `EXEC`.
    pub multi: Option<Multi>,
    /// This connection in the list of clients (`CLIENT LIST`); `None` for
    /// a session that is not a connection.
    pub registration: Option<crate::clients::Registered>,
    /// Whether `BLOCK` and `WAIT` wait. `false` while `EXEC` runs its
    /// commands (they answer at once), and for a harness that never sleeps.
    pub waits: bool,
    /// The registry's entry for the last command name looked up: a
    /// client mostly sends one command over and over, and comparing its
    /// name with this one costs a third of a lookup.
    pub(crate) last_spec: Option<&'static crate::command_table::CommandSpec>,
    /// For the read about to run: the engine a round done since it
    /// arrived lets it read now (in a group; see `read_round.rs`). Taken
    /// by the read.
    pub(crate) round: Option<fencelog::Log>,
    /// For the request about to run: a write it takes goes with the
    /// pipelined writes next to it (a group's store proposes them as one;
    /// see `Store::write_together`) instead of on its own.
    pub(crate) together: bool,
}

impl Session {
    /// A session for a client at `peer`, in RESP2.
    pub fn new(id: u64, peer: SocketAddr, authenticated: bool) -> Session {
        Session {
            id,
            peer,
            proto: 2,
            authenticated,
            name: None,
            multi: None,
            registration: None,
            waits: true,
            last_spec: None,
            round: None,
            together: false,
        }
    }

    /// Who this is, for log events.
    pub fn tag(&self) -> ClientTag {
        ClientTag {
            id: self.id,
            addr: self.peer,
            name: self.name.clone(),
        }
    }
}

/// A transaction being queued.
#[derive(Default)]
pub struct Multi {
    queued: Vec<Queued>,
    /// A command was refused while queuing: `EXEC` discards everything.
    dirty: bool,
    /// Bytes the queued commands hold (they count against the query
    /// buffer, as in Redis).
    bytes: usize,
}

/// One queued command.
pub enum Queued {
    /// A write, parsed: one op of the entry.
    Write(TxOp),
    /// Anything else, parsed and run at `EXEC`.
    Other(Request),
}

impl Multi {
    /// Bytes the queued commands hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Commands queued.
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Whether a command was refused while queuing.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Queues a command (nothing once the transaction is discarded).
    pub fn push(&mut self, queued: Queued) {
        if self.dirty {
            return;
        }
        self.bytes += match &queued {
            Queued::Write(op) => op_bytes(op),
            Queued::Other(request) => request.memory_bytes(),
        };
        self.queued.push(queued);
    }

    /// A command was refused: `EXEC` will discard the transaction, and
    /// nothing queued will run, so its memory goes back now.
    pub fn refuse(&mut self) {
        self.dirty = true;
        self.queued = Vec::new();
        self.bytes = 0;
    }

    /// The queued commands, in order.
    pub fn into_queued(self) -> Vec<Queued> {
        debug_assert!(!self.dirty || self.queued.is_empty());
        self.queued
    }
}

/// What `args` hold in memory.
pub fn request_bytes(args: &[Bytes]) -> usize {
    args.iter().map(|a| a.len() + ARG_OVERHEAD_BYTES).sum()
}

/// What one queued op holds.
fn op_bytes(op: &TxOp) -> usize {
    // Name and token arguments too: as many as the command had.
    request_bytes(op.payloads()) + op.stream().len() + 3 * ARG_OVERHEAD_BYTES
}
