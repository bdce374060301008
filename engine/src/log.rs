//! [`Log`]: the engine's public face.
//!
//! Every write is decided by one function (`decide_*`), inside the log's
//! serialized section, and answered by one function (`finish_*`) once what
//! it cites is durable. Each operation's blocking, `_async` and `_deferred`
//! forms are thin wrappers that differ only in how they wait: a rule is
//! changed in one place.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use event_listener::{Event, EventListener, Listener};
use fencelog_wal::{
    Appended, FsStorage, RecoveryReport, SegmentReader, Storage, Ticket, Wal, Writer,
};

use crate::core::{Core, ceiling_for};
use crate::error::{Error, Result};
use crate::gc::{self, Gc};
use crate::lease::{Clock, MonotonicClock};
use crate::locate::Locator;
use crate::metrics::{Counters, Metrics};
use crate::op::{self, Op};
use crate::options::Options;
use crate::records::Records;
use crate::replicated::write_op;
use crate::token::{Offset, Token, check_stream_name};
use crate::tx::Payloads;
use crate::view::{Effect, Key, StreamView, Views};

/// One record read back: its offset, the token its append carried, and its
/// payload (a slice of the buffer its entry was read into: no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record's offset in its stream.
    pub offset: Offset,
    /// The token of the append that wrote it.
    pub token: Token,
    /// The record's bytes.
    pub payload: Bytes,
}

/// The answer to a write already decided (see [`Log::append_deferred`]):
/// resolves once the write, or what its rejection cites, is durable.
/// Dropping it does not undo the write.
#[must_use = "the write is decided; its answer comes when this resolves"]
pub struct Deferred<T> {
    inner: DeferredInner<T>,
}

enum DeferredInner<T> {
    /// Any answer to come.
    Boxed(std::pin::Pin<Box<dyn std::future::Future<Output = Result<T>> + Send>>),
    /// A decided append waiting for its sync: the most frequent answer,
    /// kept without an allocation of its own (a box and its free were a
    /// tenth of a single node's instructions per append, with the
    /// server's). A rejection's error is boxed: rare, and it keeps this
    /// small enough to travel in a server's answers.
    Append {
        /// `None` once answered.
        log: Option<Log>,
        ticket: Ticket,
        then: std::result::Result<u64, Box<Error>>,
        size: AppendSize,
        /// An append answers an offset: `T` is `u64` wherever this is
        /// made and this the identity (a function, so that the enum needs
        /// no bound on `T`).
        to_t: fn(u64) -> T,
    },
}

impl<T> Deferred<T> {
    pub(crate) fn new(f: impl std::future::Future<Output = Result<T>> + Send + 'static) -> Self {
        Deferred {
            inner: DeferredInner::Boxed(Box::pin(f)),
        }
    }
}

impl Deferred<u64> {
    /// The answer of an append decided as `decision`, counted once durable.
    fn append(log: Log, decision: Decision, size: AppendSize) -> Self {
        let then = match decision.then {
            Decided::Value(offset) => Ok(offset),
            Decided::Error(e) => Err(Box::new(e)),
            Decided::Retry { .. } => Err(Box::new(internal(
                "a retry decision for a plain append".into(),
            ))),
        };
        Deferred {
            inner: DeferredInner::Append {
                log: Some(log),
                ticket: decision.ticket,
                then,
                size,
                to_t: |offset| offset,
            },
        }
    }
}

impl<T> std::future::Future for Deferred<T> {
    type Output = Result<T>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        // Nothing in it is pinned: the box pins its own future, and a
        // ticket is `Unpin`.
        match &mut self.get_mut().inner {
            DeferredInner::Boxed(f) => f.as_mut().poll(cx),
            DeferredInner::Append {
                log,
                ticket,
                then,
                size,
                to_t,
            } => {
                // A ticket answers again once done: a second poll after
                // the answer finds the log taken.
                let synced = std::task::ready!(std::pin::Pin::new(ticket).poll(cx));
                let Some(log) = log.take() else {
                    return Poll::Ready(Err(internal("an answer polled again".into())));
                };
                let then = std::mem::replace(then, Ok(0));
                let result = synced
                    .map_err(Error::from)
                    .and_then(|()| then.map_err(|e| *e));
                Poll::Ready(log.finish_append(result, *size).map(*to_t))
            }
        }
    }
}

/// A stream's durable state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamStat {
    /// The highest token accepted on the stream (0: none yet): the highest
    /// its surviving entries carry. After a salvage cut, at least the token
    /// floor.
    pub highest_token: u64,
    /// The offset the next record gets.
    pub next_offset: Offset,
    /// The first readable offset (records below were trimmed or deleted).
    pub start_offset: Offset,
    /// Readable records: `next_offset - start_offset`.
    pub records: u64,
    /// Payload bytes of the readable records.
    pub bytes: u64,
}

/// How much one read answers, and how long it waits for a first record
/// (see [`Log::read_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    /// Most records answered (also capped by
    /// [`Options::max_read_records`]). Default 100. Zero answers none,
    /// at once (it does not wait).
    pub max_records: u32,
    /// Most payload bytes answered; one record is answered whatever its
    /// size. Default: no limit.
    pub max_bytes: u64,
    /// How long to wait when there is no record at `from` yet:
    /// `Duration::ZERO` (the default) does not wait, `Duration::MAX` waits
    /// without a limit.
    pub wait: Duration,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions::records(100)
    }
}

impl ReadOptions {
    /// At most `max_records` records, no byte limit, no waiting.
    pub fn records(max_records: u32) -> ReadOptions {
        ReadOptions {
            max_records,
            max_bytes: u64::MAX,
            wait: Duration::ZERO,
        }
    }
}

/// The payload bytes a read may still answer.
struct Budget {
    bytes_left: u64,
    /// A record did not fit: the read ends here.
    full: bool,
}

impl Budget {
    fn unlimited() -> Budget {
        Budget {
            bytes_left: u64::MAX,
            full: false,
        }
    }
}

/// A fenced append-only log: many named streams in one durable,
/// group-committed write-ahead log.
///
/// Cloning a `Log` is cheap and shares it; the log closes when the last
/// clone is dropped (after syncing what was submitted), or with
/// [`Log::close`].
///
/// # Examples
///
/// ```
/// use fencelog::{Error, Log, Options, Token};
///
/// let dir = tempfile::tempdir().unwrap();
/// let log = Log::open(dir.path(), Options::default()).unwrap();
/// let t41 = Token::new(41).unwrap();
/// let t42 = Token::new(42).unwrap();
///
/// // The new owner fences the stream before doing any work…
/// log.fence("orders", t42).unwrap();
/// // …so the old owner's late write is rejected, durably.
/// match log.append("orders", t41, &[b"late"]) {
///     Err(Error::Stale { presented: 41, highest: 42 }) => {}
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(log.append("orders", t42, &["first", "second"]).unwrap(), 0);
/// let records = log.read("orders", 0, 10).unwrap();
/// assert_eq!(&records[1].payload[..], b"second");
/// ```
#[derive(Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    // The collector is stopped first (it holds the log too).
    gc: Gc,
    pub(crate) wal: Arc<Wal<Core>>,
    pub(crate) views: Arc<Views>,
    pub(crate) locator: Arc<Locator>,
    pub(crate) opts: Options,
    pub(crate) counters: Counters,
    report: RecoveryReport,
    /// Notified when a lease is released, for waiting acquirers.
    pub(crate) lease_freed: Event,
}

/// What the serialized section decided; the answer waits for `ticket`:
/// the entry written, or, for a rejection or a no-op, what the answer cites.
pub(crate) struct Decision {
    then: Decided,
    ticket: Ticket,
}

impl Decision {
    pub(crate) fn accepted(value: u64, ticket: Ticket) -> Self {
        Decision {
            then: Decided::Value(value),
            ticket,
        }
    }

    pub(crate) fn rejected(error: Error, ticket: Ticket) -> Self {
        Decision {
            then: Decided::Error(error),
            ticket,
        }
    }

    pub(crate) fn wait(self) -> Result<Decided> {
        self.ticket.wait()?;
        Ok(self.then)
    }

    pub(crate) async fn wait_async(self) -> Result<Decided> {
        self.ticket.await?;
        Ok(self.then)
    }
}

pub(crate) enum Decided {
    Value(u64),
    Error(Error),
    /// A conditional append whose expected offset is behind the stream:
    /// perhaps the retry of one that succeeded. The decision's ticket resolves when the
    /// stream's newest entry (hence the records at `expected..`, and the
    /// highest token) is durable.
    Retry {
        expected: u64,
        next: u64,
        highest: u64,
    },
}

impl Decided {
    pub(crate) fn value(self) -> Result<u64> {
        match self {
            Decided::Value(v) => Ok(v),
            Decided::Error(e) => Err(e),
            Decided::Retry { .. } => Err(internal("an unexpected retry decision".into())),
        }
    }
}

pub(crate) fn check_payloads<P: AsRef<[u8]>>(opts: &Options, payloads: &[P]) -> Result<()> {
    check_payloads_within(
        opts.max_records_per_append,
        opts.max_payload_bytes,
        payloads,
    )
}

/// As [`check_payloads`], with the limits given (a replica's are the
/// group's).
pub(crate) fn check_payloads_within<R: Records + ?Sized>(
    max_records_per_append: u32,
    max_payload_bytes: u32,
    payloads: &R,
) -> Result<()> {
    let count = payloads.count();
    if count == 0 {
        return Err(Error::invalid(
            "payloads",
            "an append needs at least one record",
        ));
    }
    if count > max_records_per_append as usize {
        return Err(Error::TooLarge {
            what: "records per append",
            len: count as u64,
            max: u64::from(max_records_per_append),
        });
    }
    for len in payloads.lens() {
        if len > max_payload_bytes as usize {
            return Err(Error::TooLarge {
                what: "payload bytes",
                len: len as u64,
                max: u64::from(max_payload_bytes),
            });
        }
    }
    Ok(())
}

/// What the serialized section knows of a stream: (highest, its LSN, next,
/// start, the stream's newest LSN). A stream never seen has only the floor.
pub(crate) fn stream_state(w: &mut Writer<'_, Core>, key: Key<'_>) -> (u64, u64, u64, u64, u64) {
    let core = w.state();
    let floor = core.floor;
    match core.stream(key) {
        Some(s) if s.highest >= floor => (
            s.highest,
            s.highest_lsn,
            s.next_offset,
            s.start_offset,
            s.last_lsn,
        ),
        // The floor is durable (in the marks file): nothing to wait for.
        Some(s) => (floor, 0, s.next_offset, s.start_offset, s.last_lsn),
        None => (floor, 0, 0, 0, 0),
    }
}

pub(crate) fn stale(
    w: &Writer<'_, Core>,
    presented: u64,
    highest: u64,
    highest_lsn: u64,
) -> Decision {
    // The rejection cites `highest`: it is answered once that is durable.
    Decision::rejected(
        Error::Stale { presented, highest },
        w.ticket_for(highest_lsn),
    )
}

/// A new stream may be created: the table is not full.
pub(crate) fn room_for(w: &mut Writer<'_, Core>, key: Key<'_>) -> Result<()> {
    w.state().room_for(key).map_err(|max| Error::TooLarge {
        what: "streams",
        len: max.saturating_add(1),
        max,
    })
}

/// Internal: an `apply_*` refusing what the decision just accepted would be
/// a bug; it is reported, never a panic.
pub(crate) fn internal(why: String) -> Error {
    Error::invalid("internal state", why)
}

/// Every token an entry carries is covered by the token marks' ceiling
/// before the entry is acknowledged, so that a later cut can never lower
/// what was promised (see `fencelog_wal::marks`).
fn reserve(w: &mut Writer<'_, Core>) {
    let t = w.state().max_token;
    w.reserve(t, ceiling_for(t));
}

/// Runs the decision `f`, then [`reserve`]s the ceiling for what it took.
pub(crate) fn reserving<R>(
    w: &mut Writer<'_, Core>,
    f: impl FnOnce(&mut Writer<'_, Core>) -> R,
) -> R {
    let r = f(w);
    reserve(w);
    r
}

pub(crate) fn decide_append<R: Records + ?Sized>(
    w: &mut Writer<'_, Core>,
    key: Key<'_>,
    token: u64,
    payloads: &R,
    expected: Option<u64>,
) -> Result<Decision> {
    let (highest, highest_lsn, next, _, last_lsn) = stream_state(w, key);
    if let Some(expected) = expected
        && expected != next
    {
        if expected < next {
            return Ok(Decision {
                then: Decided::Retry {
                    expected,
                    next,
                    highest,
                },
                ticket: w.ticket_for(last_lsn),
            });
        }
        if token < highest {
            return Ok(stale(w, token, highest, highest_lsn));
        }
        return Ok(Decision::rejected(
            Error::OffsetMismatch { expected, next },
            w.ticket_for(last_lsn),
        ));
    }
    if token < highest {
        return Ok(stale(w, token, highest, highest_lsn));
    }
    if next == 0 && last_lsn == 0 {
        // Perhaps a new stream: is there room for one more?
        room_for(w, key)?;
    }
    let len = op::append_len(key.name, payloads);
    let at = write_op(w, len, |buf| {
        op::encode_append(buf, key.name, token, next, payloads)
    })?;
    let bytes = payloads.lens().map(|len| len as u64).sum();
    let effect = w
        .state()
        .apply_append(key, token, next, payloads.count() as u32, bytes, at)
        .map_err(internal)?;
    w.on_durable(effect);
    Ok(Decision::accepted(next, w.ticket()))
}

pub(crate) fn decide_fence(
    w: &mut Writer<'_, Core>,
    stream: &[u8],
    token: u64,
) -> Result<Decision> {
    let key = w.state().key(stream);
    let (highest, highest_lsn, ..) = stream_state(w, key);
    if token < highest {
        return Ok(stale(w, token, highest, highest_lsn));
    }
    if token == highest {
        // Nothing to write: answer once the highest token is durable.
        return Ok(Decision::accepted(highest, w.ticket_for(highest_lsn)));
    }
    write_fence(w, key, token)?;
    Ok(Decision::accepted(token, w.ticket()))
}

/// Writes a fence of the stream at `token` and applies it.
pub(crate) fn write_fence(w: &mut Writer<'_, Core>, key: Key<'_>, token: u64) -> Result<()> {
    room_for(w, key)?;
    let stream = key.name;
    write_applied(w, &Op::Fence { stream, token }, |core, at| {
        core.apply_fence(key, token, at.lsn)
    })
}

/// Writes `op`'s entry and applies it to the state with `apply`, which
/// learns where the entry landed; the effect runs once it is durable.
fn write_applied(
    w: &mut Writer<'_, Core>,
    op: &Op<'_>,
    apply: impl FnOnce(&mut Core, Appended) -> std::result::Result<Effect, String>,
) -> Result<()> {
    let entry = op::encode(op);
    let at = write_op(w, entry.len(), |buf| buf.copy_from_slice(&entry))?;
    let effect = apply(w.state(), at).map_err(internal)?;
    w.on_durable(effect);
    Ok(())
}

pub(crate) fn decide_trim(
    w: &mut Writer<'_, Core>,
    stream: &[u8],
    token: u64,
    before: u64,
    delete: bool,
) -> Result<Decision> {
    let key = w.state().key(stream);
    let (highest, highest_lsn, next, start, last_lsn) = stream_state(w, key);
    if token < highest {
        return Ok(stale(w, token, highest, highest_lsn));
    }
    let before = if delete { next } else { before };
    if before > next {
        return Ok(Decision::rejected(
            Error::TrimBeyondEnd { before, next },
            w.ticket_for(last_lsn),
        ));
    }
    let answer = if delete {
        next - start
    } else {
        before.max(start)
    };
    if before <= start && token == highest {
        // Nothing changes at all.
        return Ok(Decision::accepted(
            if delete { 0 } else { start },
            w.ticket_for(last_lsn.max(highest_lsn)),
        ));
    }
    room_for(w, key)?;
    let op = if delete {
        Op::Delete { stream, token }
    } else {
        Op::Trim {
            stream,
            token,
            before,
        }
    };
    write_applied(w, &op, |core, at| {
        core.apply_trim(key, token, before, at.lsn)
    })?;
    Ok(Decision::accepted(answer, w.ticket()))
}

/// What a read finds without waiting.
enum ReadNow {
    /// Records to answer (none when the read may not wait).
    Records(Vec<Record>),
    /// Nothing yet: wakes when records may have come.
    Wait(EventListener),
}

/// What an accepted append counts.
#[derive(Clone, Copy)]
struct AppendSize {
    records: u64,
    bytes: u64,
}

impl AppendSize {
    fn of<P: AsRef<[u8]>>(payloads: &[P]) -> AppendSize {
        AppendSize {
            records: payloads.len() as u64,
            bytes: payloads.iter().map(|p| p.as_ref().len() as u64).sum(),
        }
    }
}

impl Log {
    /// Opens (or creates) the log in `dir` on real files.
    ///
    /// Fails if another process has the directory open, if acknowledged data
    /// is damaged (see [`fencelog_wal::RecoveryMode`]), or on I/O errors.
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Log> {
        Log::open_on(
            Arc::new(FsStorage),
            Arc::new(MonotonicClock::default()),
            dir.as_ref(),
            opts,
        )
    }

    /// Opens the log on any storage backend (say the crash-simulating
    /// [`fencelog_wal::SimStorage`]) with any lease clock.
    pub fn open_on(
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
        dir: &Path,
        opts: Options,
    ) -> Result<Log> {
        opts.validate()?;
        let views = Arc::new(Views::default());
        let (gc_handle, gc_inbox) = gc::channel_for_gc();
        let core = Core::for_options(Arc::clone(&views), gc_handle.clone(), clock, &opts);
        let (wal, report) = Wal::open(storage, dir, opts.wal.clone(), |replay| {
            core.recover(replay)
        })?;
        let wal = Arc::new(wal);
        // Every token the replayed log holds is covered by the ceiling
        // before anything is answered (a STALE may cite one of them).
        let max_token = wal.with_state(|c| c.max_token);
        if !opts.replicated && max_token > wal.marks().ceiling {
            wal.raise_marks(fencelog_wal::Marks {
                ceiling: ceiling_for(max_token),
                floor: 0,
            })?;
        }
        let locator = Arc::new(Locator::new(opts.index_cache_bytes));
        // Segments older than what recovery replayed are counted by the
        // collector from their footers, in the background.
        let replayed_from = wal.with_state(|c| c.replayed_from);
        let uncounted: Vec<u64> = wal
            .segments()
            .into_iter()
            .filter(|&s| s < replayed_from)
            .collect();
        let starts = wal.with_state(|c| c.starts());
        let gc = Gc::start(
            gc_handle,
            gc_inbox,
            Arc::clone(&wal),
            Arc::clone(&locator),
            starts,
            uncounted,
        )
        .map_err(|e| fencelog_wal::WalError::Io {
            op: "spawn the garbage collector for",
            path: dir.to_path_buf(),
            source: e,
        })?;
        Ok(Log {
            inner: Arc::new(Inner {
                gc,
                wal,
                views,
                locator,
                opts,
                counters: Counters::default(),
                report,
                lease_freed: Event::new(),
            }),
        })
    }

    /// Closes the log: stops its garbage collector, syncs what was
    /// submitted and stops its threads, answering any I/O failure. Fails
    /// (closing nothing) while other clones of this `Log` are alive.
    pub fn close(self) -> Result<()> {
        let inner = Arc::try_unwrap(self.inner).map_err(|inner| {
            Error::invalid(
                "close",
                format!(
                    "{} other handles of the log are still in use",
                    Arc::strong_count(&inner) - 1
                ),
            )
        })?;
        let Inner { mut gc, wal, .. } = inner;
        gc.stop();
        drop(gc);
        match Arc::try_unwrap(wal) {
            Ok(wal) => Ok(wal.close()?),
            // The collector is stopped: nobody else holds the log.
            Err(_) => Err(internal("the log is still shared after close".into())),
        }
    }

    /// What recovery found and did when this log was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.report
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.inner.wal.dir()
    }

    /// The options the log was opened with.
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// Whether an I/O failure stopped the log (reads go on; writes fail
    /// until it is reopened).
    pub fn has_failed(&self) -> bool {
        self.inner.wal.has_failed()
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// Runs a decision inside the serialized section, waiting (blocking)
    /// for room in the batch; reserves the tokens it accepted.
    pub(crate) fn decide<R>(
        &self,
        f: impl FnOnce(&mut Writer<'_, Core>) -> Result<R>,
    ) -> Result<R> {
        self.standalone()?;
        self.inner.wal.submit(|w| reserving(w, f))?
    }

    /// As [`Log::decide`], waiting for room asynchronously.
    pub(crate) async fn decide_async<R>(
        &self,
        f: impl FnOnce(&mut Writer<'_, Core>) -> Result<R>,
    ) -> Result<R> {
        self.standalone()?;
        self.inner.wal.submit_async(|w| reserving(w, f)).await?
    }

    /// As [`Log::decide`] when the log has room now; `Ok(None)` (without
    /// running `f`) when the pending batch is full.
    fn try_decide<R>(
        &self,
        f: impl FnOnce(&mut Writer<'_, Core>) -> Result<R>,
    ) -> Result<Option<R>> {
        self.standalone()?;
        self.inner.wal.try_submit(|w| reserving(w, f))?.transpose()
    }

    /// Writes on a single node only: a replica's writes come through the
    /// replicated log (`apply_replicated`), in its order.
    fn standalone(&self) -> Result<()> {
        if self.inner.opts.replicated {
            return Err(Error::invalid(
                "mode",
                "this log is a replica's state machine: writes go through the replicated log",
            ));
        }
        Ok(())
    }

    /// The fast path: a token below the stream's durable highest token is
    /// rejected without the write lock, the disk or an allocation.
    fn fast_stale(&self, key: Key<'_>, token: Token) -> Result<()> {
        let highest = self.inner.views.durable_highest(key);
        if token.get() < highest {
            self.inner.counters.stale.add(1);
            return Err(Error::Stale {
                presented: token.get(),
                highest,
            });
        }
        Ok(())
    }

    fn count(&self, result: &Result<u64>) {
        match result {
            Err(Error::Stale { .. }) => self.inner.counters.stale.add(1),
            Err(Error::OffsetMismatch { .. }) => self.inner.counters.mismatches.add(1),
            _ => {}
        }
    }

    // ----- append ---------------------------------------------------------

    /// Appends `payloads` as consecutive records of `stream` with `token`,
    /// in one atomic, durable entry; answers the offset of the first.
    ///
    /// Rejected with [`Error::Stale`] if `token` is below the stream's
    /// highest accepted token.
    pub fn append<P: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: Token,
        payloads: &[P],
    ) -> Result<Offset> {
        let stream = stream.as_ref();
        let (size, key) = self.precheck_append(stream, Some(token), payloads)?;
        let d = self.decide(|w| decide_append(w, key, token.get(), payloads, None))?;
        self.finish_append(d.wait().and_then(Decided::value), size)
    }

    /// The async form of [`Log::append`].
    pub async fn append_async<P: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: Token,
        payloads: &[P],
    ) -> Result<Offset> {
        let stream = stream.as_ref();
        let (size, key) = self.precheck_append(stream, Some(token), payloads)?;
        let d = self
            .decide_async(|w| decide_append(w, key, token.get(), payloads, None))
            .await?;
        self.finish_append(d.wait_async().await.and_then(Decided::value), size)
    }

    /// Decides an append now, in queue order with every other write, and
    /// answers a future that resolves to its answer once the entry (or what
    /// a rejection cites) is durable.
    ///
    /// This is how a connection pipelines: decide each command in the order
    /// it arrived, then await the answers, so that consecutive appends share
    /// one group commit instead of waiting one sync each.
    ///
    /// # Examples
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use bytes::Bytes;
    /// use fencelog::{Log, Options, Token};
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = Log::open(dir.path(), Options::default()).unwrap();
    /// let t = Token::new(1).unwrap();
    /// let first = log.append_deferred(b"s", t, vec![Bytes::from("a")]).await.unwrap();
    /// let second = log.append_deferred(b"s", t, vec![Bytes::from("b")]).await.unwrap();
    /// // Both are decided (offsets 0 and 1); their syncs overlap.
    /// assert_eq!((first.await.unwrap(), second.await.unwrap()), (0, 1));
    /// # });
    /// ```
    pub async fn append_deferred(
        &self,
        stream: &[u8],
        token: Token,
        payloads: impl Into<Payloads>,
    ) -> Result<Deferred<Offset>> {
        self.append_deferred_after(true, stream, token, payloads.into())
            .await
    }

    /// [`Log::append_deferred`], its fast path taken only if `fast`.
    pub(crate) async fn append_deferred_after(
        &self,
        fast: bool,
        stream: &[u8],
        token: Token,
        payloads: Payloads,
    ) -> Result<Deferred<Offset>> {
        let (size, key) = self.precheck_append(stream, fast.then_some(token), &payloads)?;
        let d = self
            .decide_async(|w| decide_append(w, key, token.get(), payloads.as_slice(), None))
            .await?;
        Ok(Deferred::append(self.clone(), d, size))
    }

    /// Decides an append now if the log has room for it, without waiting
    /// and without taking the payloads: `Ok(None)` when the pending batch
    /// is full (then [`Log::append_deferred`] waits for room). A stale
    /// token is refused as [`Log::check_append`] refuses it, before the
    /// log's lock. What a server does with an append still in its
    /// request's arguments: no op built, no payload copied but into the
    /// log.
    ///
    /// # Examples
    ///
    /// ```
    /// use fencelog::{Log, Options, Token};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = Log::open(dir.path(), Options::default()).unwrap();
    /// let t = Token::new(3).unwrap();
    /// let answer = log.append_now(b"s", t, &[b"x"]).unwrap().expect("room");
    /// assert_eq!(answer.await.unwrap(), 0);
    /// assert!(log.append_now(b"s", Token::new(2).unwrap(), &[b"late"]).is_err());
    /// # });
    /// ```
    pub fn append_now<P: AsRef<[u8]>>(
        &self,
        stream: &[u8],
        token: Token,
        payloads: &[P],
    ) -> Result<Option<Deferred<Offset>>> {
        let (size, key) = self.precheck_append(stream, Some(token), payloads)?;
        let decided = self.try_decide(|w| decide_append(w, key, token.get(), payloads, None))?;
        Ok(decided.map(|d| Deferred::append(self.clone(), d, size)))
    }

    /// The checks an [`append`](Log::append) meets before it is decided:
    /// the stream name, the payloads against the limits, and the token
    /// against the stream's durable highest. `Err` is the answer the append
    /// would get (a stale token is counted as a rejection); `Ok` says only
    /// that the append may go on, not that it will be accepted (a write
    /// decided meanwhile may still fence it out).
    ///
    /// It takes no lock a writer waits for and allocates nothing (but the
    /// error), so that a server can refuse a stale write before it builds
    /// the request into an operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use fencelog::{Error, Log, Options, Token};
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = Log::open(dir.path(), Options::default()).unwrap();
    /// log.fence(b"s", Token::new(5).unwrap()).unwrap();
    /// let stale = log.check_append(b"s", Token::new(4).unwrap(), &[b"late"]);
    /// assert!(matches!(stale, Err(Error::Stale { presented: 4, highest: 5 })));
    /// assert!(log.check_append(b"s", Token::new(5).unwrap(), &[b"on time"]).is_ok());
    /// ```
    pub fn check_append<P: AsRef<[u8]>>(
        &self,
        stream: &[u8],
        token: Token,
        payloads: &[P],
    ) -> Result<()> {
        self.precheck_append(stream, Some(token), payloads)
            .map(|_| ())
    }

    /// The checks before the write lock: arguments, limits, and (for a
    /// plain append) the fast path.
    ///
    /// The stream's key comes back for the decision, which so hashes the
    /// name once.
    fn precheck_append<'a, P: AsRef<[u8]>>(
        &self,
        stream: &'a [u8],
        fast: Option<Token>,
        payloads: &[P],
    ) -> Result<(AppendSize, Key<'a>)> {
        check_stream_name(stream)?;
        check_payloads(&self.inner.opts, payloads)?;
        let key = self.inner.views.key(stream);
        if let Some(token) = fast {
            self.fast_stale(key, token)?;
        }
        Ok((AppendSize::of(payloads), key))
    }

    fn finish_append(&self, result: Result<u64>, size: AppendSize) -> Result<u64> {
        if result.is_ok() {
            let c = &self.inner.counters;
            c.appends.add(1);
            c.records.add(size.records);
            c.bytes.add(size.bytes);
        }
        self.count(&result);
        result
    }

    // ----- append_at ------------------------------------------------------

    /// Appends only if `expected_offset` is the stream's next offset, else
    /// [`Error::OffsetMismatch`].
    ///
    /// A retry of an `append_at` that already succeeded (same expected
    /// offset, same token, byte-identical payloads at those offsets) answers
    /// the original offset and writes nothing, even if a newer token has been
    /// accepted since: a client whose answer was lost can retry safely.
    pub fn append_at<P: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: Token,
        expected_offset: Offset,
        payloads: &[P],
    ) -> Result<Offset> {
        let stream = stream.as_ref();
        let (size, key) = self.precheck_append(stream, None, payloads)?;
        let d =
            self.decide(|w| decide_append(w, key, token.get(), payloads, Some(expected_offset)))?;
        self.finish_append_at(d.wait(), stream, token, payloads, size)
    }

    /// The async form of [`Log::append_at`].
    pub async fn append_at_async<P: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: Token,
        expected_offset: Offset,
        payloads: &[P],
    ) -> Result<Offset> {
        let stream = stream.as_ref();
        let (size, key) = self.precheck_append(stream, None, payloads)?;
        let d = self
            .decide_async(|w| decide_append(w, key, token.get(), payloads, Some(expected_offset)))
            .await?;
        self.finish_append_at(d.wait_async().await, stream, token, payloads, size)
    }

    /// The deferred form of [`Log::append_at`] (see
    /// [`Log::append_deferred`]).
    pub async fn append_at_deferred(
        &self,
        stream: &[u8],
        token: Token,
        expected_offset: Offset,
        payloads: impl Into<Payloads>,
    ) -> Result<Deferred<Offset>> {
        let payloads = payloads.into();
        let (size, key) = self.precheck_append(stream, None, &payloads)?;
        let d = self
            .decide_async(|w| {
                decide_append(
                    w,
                    key,
                    token.get(),
                    payloads.as_slice(),
                    Some(expected_offset),
                )
            })
            .await?;
        let log = self.clone();
        let stream = stream.to_vec();
        Ok(Deferred::new(async move {
            log.finish_append_at(d.wait_async().await, &stream, token, &payloads, size)
        }))
    }

    fn finish_append_at<P: AsRef<[u8]>>(
        &self,
        decided: Result<Decided>,
        stream: &[u8],
        token: Token,
        payloads: &[P],
        size: AppendSize,
    ) -> Result<u64> {
        let result = match decided {
            Ok(Decided::Retry {
                expected,
                next,
                highest,
            }) => self.settle_retry(stream, token, expected, next, highest, payloads),
            Ok(other) => other.value(),
            Err(e) => Err(e),
        };
        self.finish_append(result, size)
    }

    /// Is this conditional append a retry of one that succeeded? The records
    /// at `expected..` are durable now; compare them.
    pub(crate) fn settle_retry<P: AsRef<[u8]>>(
        &self,
        stream: &[u8],
        token: Token,
        expected: u64,
        next: u64,
        highest: u64,
        payloads: &[P],
    ) -> Result<u64> {
        let same = expected + payloads.len() as u64 <= next
            && match self.read(stream, expected, payloads.len() as u32) {
                Ok(records) => {
                    records.len() == payloads.len()
                        && records.iter().zip(payloads).enumerate().all(|(i, (r, p))| {
                            r.offset == expected + i as u64
                                && r.token == token
                                && r.payload[..] == *p.as_ref()
                        })
                }
                // Trimmed away: nothing left to prove it was a retry.
                Err(Error::Trimmed { .. }) => false,
                // Anything else leaves the answer unknown: say so.
                Err(e) => return Err(e),
            };
        if same {
            self.inner.counters.retries.add(1);
            return Ok(expected);
        }
        if token.get() < highest {
            return Err(Error::Stale {
                presented: token.get(),
                highest,
            });
        }
        Err(Error::OffsetMismatch { expected, next })
    }

    // ----- fence ----------------------------------------------------------

    /// Raises the stream's highest token to `token` without writing a
    /// record, so that a new owner shuts out older ones before it does any
    /// work; answers the highest token.
    pub fn fence(&self, stream: impl AsRef<[u8]>, token: Token) -> Result<Token> {
        let stream = stream.as_ref();
        self.precheck(stream, token)?;
        let d = self.decide(|w| decide_fence(w, stream, token.get()))?;
        self.finish_fence(d.wait().and_then(Decided::value))
    }

    /// The async form of [`Log::fence`].
    pub async fn fence_async(&self, stream: impl AsRef<[u8]>, token: Token) -> Result<Token> {
        let stream = stream.as_ref();
        self.precheck(stream, token)?;
        let d = self
            .decide_async(|w| decide_fence(w, stream, token.get()))
            .await?;
        self.finish_fence(d.wait_async().await.and_then(Decided::value))
    }

    /// The deferred form of [`Log::fence`] (see [`Log::append_deferred`]).
    pub async fn fence_deferred(&self, stream: &[u8], token: Token) -> Result<Deferred<Token>> {
        self.fence_deferred_as(stream, token, |t| t).await
    }

    /// [`Log::fence_deferred`] answering `answer(highest)`: one boxed
    /// future whichever type the caller wants.
    pub(crate) async fn fence_deferred_as<T: Send + 'static>(
        &self,
        stream: &[u8],
        token: Token,
        answer: fn(Token) -> T,
    ) -> Result<Deferred<T>> {
        self.precheck(stream, token)?;
        let d = self
            .decide_async(|w| decide_fence(w, stream, token.get()))
            .await?;
        let log = self.clone();
        Ok(Deferred::new(async move {
            log.finish_fence(d.wait_async().await.and_then(Decided::value))
                .map(answer)
        }))
    }

    /// Name check and fast path, for writes without payloads.
    fn precheck(&self, stream: &[u8], token: Token) -> Result<()> {
        check_stream_name(stream)?;
        self.fast_stale(self.inner.views.key(stream), token)
    }

    fn finish_fence(&self, result: Result<u64>) -> Result<Token> {
        self.count(&result);
        let highest = result?;
        self.inner.counters.fences.add(1);
        Token::new(highest)
    }

    // ----- trim and delete ------------------------------------------------

    /// Makes records below `before` unreadable and their space reclaimable;
    /// answers the new start offset. `before` at or below the start offset
    /// changes nothing but the highest token; beyond the next offset it is
    /// [`Error::TrimBeyondEnd`].
    pub fn trim(&self, stream: impl AsRef<[u8]>, token: Token, before: Offset) -> Result<Offset> {
        self.trim_or_delete(stream.as_ref(), token, before, false)
    }

    /// The async form of [`Log::trim`].
    pub async fn trim_async(
        &self,
        stream: impl AsRef<[u8]>,
        token: Token,
        before: Offset,
    ) -> Result<Offset> {
        self.trim_or_delete_async(stream.as_ref(), token, before, false)
            .await
    }

    /// The deferred form of [`Log::trim`] (see [`Log::append_deferred`]).
    pub async fn trim_deferred(
        &self,
        stream: &[u8],
        token: Token,
        before: Offset,
    ) -> Result<Deferred<Offset>> {
        self.trim_or_delete_deferred(stream, token, before, false)
            .await
    }

    /// Removes every record of the stream; its highest token and next
    /// offset survive forever, so a stale owner cannot recreate it. Answers
    /// how many records were removed.
    pub fn delete(&self, stream: impl AsRef<[u8]>, token: Token) -> Result<u64> {
        self.trim_or_delete(stream.as_ref(), token, 0, true)
    }

    /// The async form of [`Log::delete`].
    pub async fn delete_async(&self, stream: impl AsRef<[u8]>, token: Token) -> Result<u64> {
        self.trim_or_delete_async(stream.as_ref(), token, 0, true)
            .await
    }

    /// The deferred form of [`Log::delete`] (see [`Log::append_deferred`]).
    pub async fn delete_deferred(&self, stream: &[u8], token: Token) -> Result<Deferred<u64>> {
        self.trim_or_delete_deferred(stream, token, 0, true).await
    }

    fn trim_or_delete(
        &self,
        stream: &[u8],
        token: Token,
        before: u64,
        delete: bool,
    ) -> Result<u64> {
        self.precheck(stream, token)?;
        let d = self.decide(|w| decide_trim(w, stream, token.get(), before, delete))?;
        self.finish_trim(d.wait().and_then(Decided::value), delete)
    }

    async fn trim_or_delete_async(
        &self,
        stream: &[u8],
        token: Token,
        before: u64,
        delete: bool,
    ) -> Result<u64> {
        self.precheck(stream, token)?;
        let d = self
            .decide_async(|w| decide_trim(w, stream, token.get(), before, delete))
            .await?;
        self.finish_trim(d.wait_async().await.and_then(Decided::value), delete)
    }

    async fn trim_or_delete_deferred(
        &self,
        stream: &[u8],
        token: Token,
        before: u64,
        delete: bool,
    ) -> Result<Deferred<u64>> {
        self.precheck(stream, token)?;
        let d = self
            .decide_async(|w| decide_trim(w, stream, token.get(), before, delete))
            .await?;
        let log = self.clone();
        Ok(Deferred::new(async move {
            log.finish_trim(d.wait_async().await.and_then(Decided::value), delete)
        }))
    }

    fn finish_trim(&self, result: Result<u64>, delete: bool) -> Result<u64> {
        self.count(&result);
        let value = result?;
        if delete {
            self.inner.counters.deletes.add(1);
        } else {
            self.inner.counters.trims.add(1);
        }
        Ok(value)
    }

    // ----- reads ----------------------------------------------------------

    /// Reads up to `max_records` durable records of `stream` from `from` on.
    /// `from` below the start offset is [`Error::Trimmed`]; at or past the
    /// end, the answer is empty.
    pub fn read(
        &self,
        stream: impl AsRef<[u8]>,
        from: Offset,
        max_records: u32,
    ) -> Result<Vec<Record>> {
        self.read_with(stream, from, &ReadOptions::records(max_records))
    }

    /// As [`Log::read`], but when there is nothing at `from` yet, waits up
    /// to `timeout` for records to arrive (`Duration::MAX`: without limit).
    pub fn read_wait(
        &self,
        stream: impl AsRef<[u8]>,
        from: Offset,
        max_records: u32,
        timeout: Duration,
    ) -> Result<Vec<Record>> {
        let opts = ReadOptions {
            wait: timeout,
            ..ReadOptions::records(max_records)
        };
        self.read_with(stream, from, &opts)
    }

    /// The async form of [`Log::read_wait`] (`Duration::ZERO`: no waiting).
    /// Waiting with a limit needs a tokio runtime with its timer enabled.
    pub async fn read_async(
        &self,
        stream: impl AsRef<[u8]>,
        from: Offset,
        max_records: u32,
        timeout: Duration,
    ) -> Result<Vec<Record>> {
        let opts = ReadOptions {
            wait: timeout,
            ..ReadOptions::records(max_records)
        };
        self.read_with_async(stream, from, &opts).await
    }

    /// Reads durable records of `stream` from `from` on, as many as `opts`
    /// allow: at most `max_records` records and `max_bytes` payload bytes,
    /// but always one record if there is one. When there is none yet, waits
    /// up to `opts.wait` for one. `from` below the start offset is
    /// [`Error::Trimmed`]. A disk that fails under the read answers
    /// [`Error::Io`] for this read; the log goes on.
    ///
    /// # Examples
    ///
    /// ```
    /// use fencelog::{Log, Options, ReadOptions, Token};
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = Log::open(dir.path(), Options::default()).unwrap();
    /// log.append("s", Token::new(1).unwrap(), &["aaaa", "bbbb", "cccc"]).unwrap();
    /// let opts = ReadOptions { max_bytes: 6, ..ReadOptions::default() };
    /// // 4 bytes fit, 8 would not: one record, and the next read goes on.
    /// assert_eq!(log.read_with("s", 0, &opts).unwrap().len(), 1);
    /// assert_eq!(log.read_with("s", 1, &opts).unwrap()[0].offset, 1);
    /// ```
    pub fn read_with(
        &self,
        stream: impl AsRef<[u8]>,
        from: Offset,
        opts: &ReadOptions,
    ) -> Result<Vec<Record>> {
        let stream = stream.as_ref();
        let deadline = Instant::now().checked_add(opts.wait);
        loop {
            let listener = match self.read_or_listen(stream, from, opts)? {
                ReadNow::Records(records) => return Ok(records),
                ReadNow::Wait(listener) => listener,
            };
            match deadline {
                None => listener.wait(),
                Some(d) => {
                    if listener.wait_deadline(d).is_none() && Instant::now() >= d {
                        return Ok(Vec::new());
                    }
                }
            }
        }
    }

    /// The async form of [`Log::read_with`]. Waiting with a limit needs a
    /// tokio runtime with its timer enabled.
    pub async fn read_with_async(
        &self,
        stream: impl AsRef<[u8]>,
        from: Offset,
        opts: &ReadOptions,
    ) -> Result<Vec<Record>> {
        let stream = stream.as_ref();
        let deadline = tokio::time::Instant::now().checked_add(opts.wait);
        loop {
            let listener = match self.read_or_listen(stream, from, opts)? {
                ReadNow::Records(records) => return Ok(records),
                ReadNow::Wait(listener) => listener,
            };
            match deadline {
                None => listener.await,
                Some(d) => {
                    if tokio::time::timeout_at(d, listener).await.is_err() {
                        return Ok(Vec::new());
                    }
                }
            }
        }
    }

    /// Reads now; when there is nothing yet and the read may wait, answers
    /// a listener that wakes when records may have come instead.
    fn read_or_listen(&self, stream: &[u8], from: Offset, opts: &ReadOptions) -> Result<ReadNow> {
        loop {
            let records = self.read_now(stream, from, opts)?;
            // A read of no records answers none at once: waiting for one
            // would find it and read none again, round and round.
            if !records.is_empty() || opts.wait.is_zero() || opts.max_records == 0 {
                return Ok(ReadNow::Records(records));
            }
            if let Some(listener) = self.listen_unless_grown(stream, from) {
                return Ok(ReadNow::Wait(listener));
            }
        }
    }

    /// One read without waiting.
    fn read_now(&self, stream: &[u8], from: Offset, opts: &ReadOptions) -> Result<Vec<Record>> {
        check_stream_name(stream)?;
        let records = match self.inner.views.get(stream) {
            Some(view) => self.read_view(&view, from, opts)?,
            None => Vec::new(),
        };
        let c = &self.inner.counters;
        c.reads.add(1);
        c.records_read.add(records.len() as u64);
        Ok(records)
    }

    /// A listener for records of `stream` at `from`, registered before
    /// looking again; `None` when they came meanwhile (or the stream did:
    /// its records are waited for on the stream itself).
    fn listen_unless_grown(&self, stream: &[u8], from: u64) -> Option<EventListener> {
        let views = &self.inner.views;
        match views.get(stream) {
            Some(view) => {
                // Listening first, then the flag: a writer that sees the
                // flag notifies a listener already registered (see
                // `StreamView::watched`). Set the other way round, a
                // notification could come between the two and be missed.
                let listener = view.grown.listen();
                view.watched.store(true, Ordering::Release);
                std::sync::atomic::fence(Ordering::SeqCst);
                (view.next.load(Ordering::Acquire) <= from).then_some(listener)
            }
            None => {
                // Created after the look above: its creation's notice may
                // have come before this listener, and its records notify
                // only its own listeners. Look again.
                let listener = views.created.listen();
                views.get(stream).is_none().then_some(listener)
            }
        }
    }

    fn read_view(&self, view: &StreamView, from: u64, opts: &ReadOptions) -> Result<Vec<Record>> {
        let start = view.start.load(Ordering::Acquire);
        if from < start {
            return Err(Error::Trimmed {
                requested: from,
                start,
            });
        }
        let next = view.next.load(Ordering::Acquire);
        let max = opts.max_records.min(self.inner.opts.max_read_records);
        if from >= next || max == 0 {
            return Ok(Vec::new());
        }
        let end = next.min(from.saturating_add(u64::from(max)));
        let mut out = Vec::with_capacity(((end - from) as usize).min(1024));
        let mut budget = Budget {
            bytes_left: opts.max_bytes,
            full: false,
        };
        match self.collect_records(view, from, end, &mut out, &mut budget) {
            Ok(()) => Ok(out),
            Err(e) => {
                // Trimmed (and collected) under our feet: say so.
                let start = view.start.load(Ordering::Acquire);
                if from < start {
                    Err(Error::Trimmed {
                        requested: from,
                        start,
                    })
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Entries of the stream's open segments that hold `[from, end)`:
    /// (segment, position, first offset), copied out under a short lock.
    fn open_entries(&self, view: &StreamView, from: u64, end: u64) -> (u64, Vec<(u64, u64, u64)>) {
        let ix = view.index.read();
        let open = &ix.open;
        // The last open entry starting at or below `from`, and on.
        let first = open
            .partition_point(|e| e.entry.first_offset <= from)
            .saturating_sub(1);
        let entries = open
            .iter()
            .skip(first)
            .take_while(|e| e.entry.first_offset < end)
            .map(|e| (e.segment, e.entry.position, e.entry.first_offset))
            .collect();
        (ix.sealed_end, entries)
    }

    /// Locates the entries holding `[from, end)` and decodes their records.
    fn collect_records(
        &self,
        view: &StreamView,
        from: u64,
        end: u64,
        out: &mut Vec<Record>,
        budget: &mut Budget,
    ) -> Result<()> {
        let (sealed_end, open) = self.open_entries(view, from, end);
        let mut cursor = from;
        let mut reading = Reading::default();
        // Sealed segments, one after another, through their footers.
        while cursor < end && cursor < sealed_end {
            let found = self.inner.locator.locate(&self.inner.wal, view, cursor)?;
            for (ix, entry_end) in found.index.entries_from(found.dir, cursor) {
                if ix.first_offset >= end {
                    break;
                }
                self.decode_entry(
                    &mut reading,
                    view,
                    found.segment,
                    ix.position,
                    ix.first_offset,
                    cursor,
                    end,
                    out,
                    budget,
                )?;
                cursor = entry_end.max(cursor);
                if cursor >= end || budget.full {
                    return Ok(());
                }
            }
            // The stream's part of this segment ended without the end.
            if cursor < found.dir.end_offset {
                return Err(self.missing(found.segment, cursor));
            }
        }
        for (segment, position, first) in open {
            if cursor >= end {
                break;
            }
            let before = out.len();
            self.decode_entry(
                &mut reading,
                view,
                segment,
                position,
                first,
                cursor,
                end,
                out,
                budget,
            )?;
            if budget.full {
                return Ok(());
            }
            if let Some(last) = out.last()
                && out.len() > before
            {
                cursor = last.offset + 1;
            }
        }
        if cursor < end && !budget.full {
            return Err(self.missing(0, cursor));
        }
        Ok(())
    }

    /// Decodes the append at `(segment, position)`, which the index says
    /// holds `view`'s records from `first`, and keeps its records in
    /// `[from, end)`.
    #[allow(clippy::too_many_arguments)]
    fn decode_entry<'w>(
        &'w self,
        reading: &mut Reading<'w>,
        view: &StreamView,
        segment: u64,
        position: u64,
        first: u64,
        from: u64,
        end: u64,
        out: &mut Vec<Record>,
        budget: &mut Budget,
    ) -> Result<()> {
        let entry = reading.entry(&self.inner.wal, segment, position)?;
        let payload = entry.payload;
        let (token, first_offset, records) =
            self.find_append(&payload, view, segment, position, first)?;
        let token = Token::new(token)?;
        let base = records.as_ptr() as usize - payload.as_ptr() as usize;
        for (i, (s, e)) in op::records(records).enumerate() {
            let offset = first_offset + i as u64;
            if offset >= end {
                break;
            }
            if offset >= from {
                let len = (e - s) as u64;
                if !out.is_empty() && len > budget.bytes_left {
                    budget.full = true;
                    break;
                }
                budget.bytes_left = budget.bytes_left.saturating_sub(len);
                out.push(Record {
                    offset,
                    token,
                    payload: payload.slice(base + s..base + e),
                });
            }
        }
        Ok(())
    }

    /// The append of `view`'s records from `first` in the entry `payload`
    /// read at `(segment, position)`: its token, first offset and records.
    /// The entry may be a replica's, or a transaction's among other ops;
    /// anything else than the index promised is damage.
    fn find_append<'p>(
        &self,
        payload: &'p [u8],
        view: &StreamView,
        segment: u64,
        position: u64,
        first: u64,
    ) -> Result<(u64, u64, &'p [u8])> {
        // A replica's entries wrap the op they applied.
        let op = op::decode_unwrapped(payload).map_err(|why| self.damaged(segment, why))?;
        // A transaction's entry holds its appends among other ops: the one
        // the index means is this stream's, at this offset.
        let op = match op {
            Op::Batch { ops, .. } => op::batch_ops(ops)
                .find(|o| {
                    matches!(o, Op::Append(a) if a.stream == &view.name[..] && a.first_offset == first)
                })
                .unwrap_or(op),
            other => other,
        };
        let Op::Append(op::Append {
            stream,
            token,
            first_offset,
            records,
            ..
        }) = op
        else {
            return Err(self.damaged(
                segment,
                "the index points at an entry that is not an append".into(),
            ));
        };
        // Checked after reading, before answering: never another stream's
        // records, nor other offsets than the index promised.
        if stream != &view.name[..] || first_offset != first {
            return Err(self.damaged(
                segment,
                format!(
                    "the index says byte {position} holds offset {first} of this stream; \
                     the entry there says otherwise"
                ),
            ));
        }
        Ok((token, first_offset, records))
    }

    fn missing(&self, segment: u64, offset: u64) -> Error {
        Error::Corrupt {
            file: self.inner.wal.dir().to_path_buf(),
            position: 0,
            reason: format!("the index has no entry for offset {offset} (segment {segment})"),
        }
    }

    fn damaged(&self, segment: u64, why: String) -> Error {
        Error::Corrupt {
            file: self
                .inner
                .wal
                .dir()
                .join(fencelog_wal::format::segment_file_name(segment)),
            position: 0,
            reason: why,
        }
    }

    /// The highest token accepted on `stream`, as far as durable (as
    /// [`Log::stat`]'s `highest_token`, without its byte counts): a write
    /// with a smaller token is rejected now and forever.
    pub fn highest_token(&self, stream: impl AsRef<[u8]>) -> Result<u64> {
        let stream = stream.as_ref();
        check_stream_name(stream)?;
        // Read in place: a group's leader asks on every write, and taking
        // the view would count it up and down, on a line its apply thread
        // writes too.
        let views = &self.inner.views;
        Ok(views.durable_highest(views.key(stream)))
    }

    /// The stream's durable state. A stream never written to is all zeros
    /// (but its highest token is the token floor, after a salvage cut).
    pub fn stat(&self, stream: impl AsRef<[u8]>) -> Result<StreamStat> {
        let stream = stream.as_ref();
        check_stream_name(stream)?;
        let floor = self.inner.views.floor.load(Ordering::Acquire);
        let Some(view) = self.inner.views.get(stream) else {
            return Ok(StreamStat {
                highest_token: floor,
                ..StreamStat::default()
            });
        };
        let start = view.start.load(Ordering::Acquire);
        let next = view.next.load(Ordering::Acquire);
        let total = view.total_bytes.load(Ordering::Acquire);
        let before_start = self.bytes_before(&view, start, next, total)?;
        Ok(StreamStat {
            highest_token: view.highest.load(Ordering::Acquire).max(floor),
            next_offset: next,
            start_offset: start,
            records: next.saturating_sub(start),
            bytes: total.saturating_sub(before_start),
        })
    }

    /// Payload bytes of the stream's records below `offset`.
    fn bytes_before(&self, view: &StreamView, offset: u64, next: u64, total: u64) -> Result<u64> {
        if offset == 0 {
            return Ok(0);
        }
        if offset >= next {
            return Ok(total);
        }
        // The cumulative count at the entry holding `offset`, plus the
        // records of that entry below it.
        let (sealed_end, open) = self.open_entries(view, offset, offset + 1);
        let (segment, entry) = if offset < sealed_end {
            let found = self.inner.locator.locate(&self.inner.wal, view, offset)?;
            let (entry, _) = found
                .index
                .entries_from(found.dir, offset)
                .next()
                .ok_or_else(|| self.missing(found.segment, offset))?;
            (found.segment, entry)
        } else {
            let Some(&(segment, position, first)) = open.first() else {
                return Ok(0);
            };
            // The cumulative count of an open entry is in the view.
            let cum = view
                .index
                .read()
                .open
                .iter()
                .find(|e| e.segment == segment && e.entry.position == position)
                .map(|e| e.entry.cum_bytes);
            let Some(cum_bytes) = cum else {
                return Ok(0);
            };
            (
                segment,
                crate::view::IndexEntry {
                    first_offset: first,
                    cum_bytes,
                    position,
                },
            )
        };
        if entry.first_offset >= offset {
            return Ok(entry.cum_bytes);
        }
        let mut records = Vec::new();
        self.decode_entry(
            &mut Reading::default(),
            view,
            segment,
            entry.position,
            entry.first_offset,
            entry.first_offset,
            offset,
            &mut records,
            &mut Budget::unlimited(),
        )?;
        Ok(entry.cum_bytes + records.iter().map(|r| r.payload.len() as u64).sum::<u64>())
    }

    /// The names of the streams that hold records or a token, in byte
    /// order. It costs every stream: a server lists them a page at a time
    /// ([`Log::streams_after`]).
    pub fn streams(&self) -> Vec<Bytes> {
        self.inner.views.names_after(None, usize::MAX)
    }

    /// Up to `count` names of [`Log::streams`], those strictly after
    /// `after` in byte order (from the first when `None`): a page of the
    /// list at the cost of the page. A page shorter than `count` is the
    /// last one.
    ///
    /// # Examples
    ///
    /// ```
    /// use fencelog::{Log, Options, Token};
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = Log::open(dir.path(), Options::default()).unwrap();
    /// for s in ["c", "a", "b"] {
    ///     log.fence(s.as_bytes(), Token::new(1).unwrap()).unwrap();
    /// }
    /// assert_eq!(log.streams_after(None, 2), vec!["a", "b"]);
    /// assert_eq!(log.streams_after(Some(b"b"), 2), vec!["c"]);
    /// ```
    pub fn streams_after(&self, after: Option<&[u8]>, count: usize) -> Vec<Bytes> {
        self.inner.views.names_after(after, count)
    }

    /// A copy of the engine's counters and the log's.
    pub fn metrics(&self) -> Metrics {
        let c = &self.inner.counters;
        // Streams counted, not listed: listing them (to sort, or to
        // filter) made INFO and each metrics scrape cost O(streams).
        let (leases_live, leases_expired, last_token, streams) =
            self.inner.wal.with_state(|core| {
                (
                    // Held now: a lease that expired unnoticed is not alive.
                    core.leases.held_now() as u64,
                    core.leases.expired,
                    core.leases.last_token(),
                    core.streams.len() as u64,
                )
            });
        let marks = self.inner.wal.marks();
        Metrics {
            transactions: c.transactions.get(),
            appends: c.appends.get(),
            records: c.records.get(),
            bytes: c.bytes.get(),
            stale_rejections: c.stale.get(),
            mismatches: c.mismatches.get(),
            idempotent_retries: c.retries.get(),
            fences: c.fences.get(),
            trims: c.trims.get(),
            deletes: c.deletes.get(),
            reads: c.reads.get(),
            records_read: c.records_read.get(),
            streams,
            leases_acquired: c.leases_acquired.get(),
            leases_renewed: c.leases_renewed.get(),
            leases_lost: c.leases_lost.get(),
            leases_released: c.leases_released.get(),
            leases_expired,
            leases_held: c.leases_held.get(),
            lease_waiting: c.lease_waiting.load(Ordering::Relaxed),
            leases_live,
            last_lease_token: last_token,
            token_floor: marks.floor,
            token_ceiling: marks.ceiling,
            segments: self.inner.wal.segment_count() as u64,
            segments_uncounted: self.inner.gc.stats.uncounted.load(Ordering::Relaxed),
            wal: self.inner.wal.stats(),
        }
    }

    /// Waits until the garbage collector has handled every trim and seal
    /// made durable so far and removed what it could (for tests and tools:
    /// collection otherwise runs on its own).
    pub fn collect_garbage(&self) {
        self.inner.gc.barrier();
    }

    /// The segments of the log, oldest first (for tests and tools).
    pub fn segments(&self) -> Vec<u64> {
        self.inner.wal.segments()
    }

    /// The segment being written: every earlier segment is sealed and its
    /// file never changes again (it may only be removed). Later ones may
    /// exist already, created ahead of need.
    pub fn active_segment(&self) -> u64 {
        self.inner.wal.active_segment()
    }

    /// Makes everything written so far durable (useful when the log is
    /// opened with `wal.sync_every_batch = false`, as a replica's is).
    pub fn sync(&self) -> Result<()> {
        Ok(self.inner.wal.sync_all()?)
    }

    /// As [`Log::sync`], and answers where the entries of the segment
    /// being written end (`None` if none does): every byte before that
    /// offset is durable and never changes again, so a snapshot can
    /// hard-link the segment instead of copying it.
    pub fn sync_to_end(&self) -> Result<Option<fencelog_wal::SegmentEnd>> {
        Ok(self.inner.wal.sync_to_end()?)
    }
}

/// The segment a read of records is in: its reader is kept while the read
/// goes on in that segment, so that its entries are read without looking
/// the segment and its file up again for each (two locks and two shared
/// reference counts per entry, which two reading threads contended on).
#[derive(Default)]
struct Reading<'w> {
    reader: Option<SegmentReader<'w, Core>>,
}

impl<'w> Reading<'w> {
    fn entry(
        &mut self,
        wal: &'w Wal<Core>,
        segment: u64,
        position: u64,
    ) -> std::result::Result<fencelog_wal::Entry, fencelog_wal::WalError> {
        let mut reader = match self.reader.take() {
            Some(r) if r.segment() == segment => r,
            _ => wal.segment_reader(segment)?,
        };
        let entry = reader.read_entry(position);
        self.reader = Some(reader);
        entry
    }
}
