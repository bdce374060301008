//! `fencelog verify DIR`: checks every segment of a data directory offline
//! and reports its segments, entries, streams, tokens, leases and any
//! damage.
//!
//! The write-ahead log's verifier ([`fencelog_wal::verify`]) checks every
//! checksum, footer and trailer and visits each valid entry in log order.
//! Here every entry is also decoded ([`describe`]) and replayed the way
//! recovery replays it: the stream table of each checkpoint, then the
//! entries after it. An entry that passes its checksum but does not decode,
//! that breaks the fencing rule, or a checkpoint that disagrees with the
//! entries before it, is damage too.
//!
//! Exit codes: 0 when nothing is damaged (a torn tail is not damage), 1 on
//! damage, 2 when the directory cannot be verified at all (missing, not a
//! data directory, in use by another process, an I/O error).

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fencelog::inspect::{Append, CheckpointStream, EntryView, Op, describe};
use fencelog_wal::{EntryKind, FsStorage, VerifiedEntry, VerifyReport, WalError, format};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Exit code when the log is damaged.
pub const EXIT_DAMAGED: u8 = 1;
/// Exit code when the tool could not do its work (usage, I/O, a directory
/// in use).
pub const EXIT_ERROR: u8 = 2;

/// How many streams and segments the report lists unless asked for all.
pub const LIST_LIMIT: usize = 20;

/// What stops `verify` or `dump` before it has a report.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The directory does not exist.
    #[error("{}: no such directory", .dir.display())]
    NotFound {
        /// The directory.
        dir: PathBuf,
    },
    /// The path is not a directory.
    #[error("{}: not a directory", .dir.display())]
    NotADirectory {
        /// The path.
        dir: PathBuf,
    },
    /// The directory holds no segment file.
    #[error(
        "{}: no segment files (NNNNNNNNNNNNNNNNNNNN.wal) here; not a fencelog data directory",
        .dir.display()
    )]
    NoSegments {
        /// The directory.
        dir: PathBuf,
    },
    /// A cluster node's directory: its engine lies below it.
    #[error(
        "{}: a cluster node's directory, not an engine's; its replica engine is {} (run this \
         tool on that directory)",
        .dir.display(),
        .engine.display()
    )]
    ClusterNode {
        /// The node's directory.
        dir: PathBuf,
        /// Its replica engine's directory.
        engine: PathBuf,
    },
    /// The directory cannot be listed.
    #[error("{}: cannot read the directory: {source}", .dir.display())]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Another process (a running server, say) has the directory open.
    #[error(
        "{} is in use by another process (it holds {}): stop the server using it, then retry",
        .dir.display(),
        .dir.join("LOCK").display()
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
    },
    /// Anything else the log's verifier refused (I/O errors, an unknown
    /// format version).
    #[error("{}: {source}", .dir.display())]
    Wal {
        /// The directory.
        dir: PathBuf,
        /// The verifier's error.
        source: WalError,
    },
}

/// Checks that `dir` is a data directory before anything touches it (taking
/// the lock creates a `LOCK` file, which should not land in a mistyped
/// directory). Answers the bytes of its segment files.
pub fn check_dir(dir: &Path) -> Result<u64, ToolError> {
    let read_err = |source| ToolError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ToolError::NotFound {
                dir: dir.to_path_buf(),
            });
        }
        Err(e) => return Err(read_err(e)),
    };
    if !meta.is_dir() {
        return Err(ToolError::NotADirectory {
            dir: dir.to_path_buf(),
        });
    }
    let (mut segments, mut bytes) = (0u64, 0u64);
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let is_segment = entry
            .file_name()
            .to_str()
            .is_some_and(|n| format::parse_segment_file_name(n).is_some());
        if is_segment {
            segments += 1;
            bytes += entry.metadata().map_or(0, |m| m.len());
        }
    }
    if segments == 0 {
        if dir.join("sm").is_dir()
            && let Ok(engine) = fencelog_cluster::state_machine::replica_engine_dir(dir)
        {
            return Err(ToolError::ClusterNode {
                dir: dir.to_path_buf(),
                engine,
            });
        }
        return Err(ToolError::NoSegments {
            dir: dir.to_path_buf(),
        });
    }
    Ok(bytes)
}

/// Runs the log's verifier over `dir`, mapping its refusals to
/// [`ToolError`].
pub fn run_wal_verify(
    dir: &Path,
    on_entry: impl FnMut(&VerifiedEntry<'_>),
    on_progress: impl FnMut(u64, u64),
) -> Result<VerifyReport, ToolError> {
    fencelog_wal::verify(&FsStorage, dir, on_entry, on_progress).map_err(|e| match e {
        WalError::Locked { .. } => ToolError::Locked {
            dir: dir.to_path_buf(),
        },
        source => ToolError::Wal {
            dir: dir.to_path_buf(),
            source,
        },
    })
}

/// Damage: where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The segment file.
    pub file: PathBuf,
    /// Byte position in that file.
    pub position: u64,
    /// The LSN of the entry there, when a valid entry is there.
    pub lsn: Option<u64>,
    /// What is wrong.
    pub what: String,
}

impl Damage {
    /// An entry that passes its checksum but does not decode.
    pub fn undecodable(dir: &Path, e: &VerifiedEntry<'_>, why: &str) -> Damage {
        let what = match e.kind {
            EntryKind::Checkpoint => "a checkpoint",
            EntryKind::Record => "an entry",
            EntryKind::Link => "a link",
        };
        Damage {
            file: dir.join(format::segment_file_name(e.segment)),
            position: e.position,
            lsn: Some(e.lsn),
            what: format!("{what} that passes its checksum but does not decode: {why}"),
        }
    }
}

/// The damage the log's verifier found, one per damaged segment.
pub fn wal_damage(report: &VerifyReport) -> Vec<Damage> {
    report
        .segments
        .iter()
        .filter_map(|s| {
            s.damage.as_ref().map(|(position, what)| Damage {
                file: s.path.clone(),
                position: *position,
                lsn: None,
                what: what.clone(),
            })
        })
        .collect()
}

/// Puts damage in file order.
pub fn sort_damage(damage: &mut [Damage]) {
    damage.sort_by(|a, b| (&a.file, a.position).cmp(&(&b.file, b.position)));
}

/// The numbers the log keeps for a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Numbers {
    highest: u64,
    next: u64,
    start: u64,
}

/// A stream as the replay of the scanned log leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// The stream's name.
    pub name: Vec<u8>,
    /// Its highest accepted token.
    pub highest_token: u64,
    /// The offset its next record gets.
    pub next_offset: u64,
    /// Its first readable offset.
    pub start_offset: u64,
    /// Records appended to it in the scanned log (segments already removed
    /// are not counted).
    pub records_appended: u64,
    /// Payload bytes of those records.
    pub bytes_appended: u64,
}

/// How many record entries of each kind were seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Appends.
    pub appends: u64,
    /// Fences.
    pub fences: u64,
    /// Trims.
    pub trims: u64,
    /// Deletes.
    pub deletes: u64,
    /// Lease acquisitions.
    pub acquires: u64,
    /// Lease releases.
    pub releases: u64,
    /// Lease renewals that were logged.
    pub renewals: u64,
    /// Transactions (their ops are counted above too).
    pub transactions: u64,
}

/// Everything `fencelog verify` found.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The data directory.
    pub dir: PathBuf,
    /// The log verifier's report: segments, entries, bytes, damage, torn
    /// tails.
    pub report: VerifyReport,
    /// Checkpoint entries seen.
    pub checkpoints: u64,
    /// Record entries seen, by kind.
    pub ops: OpCounts,
    /// LSNs of the first and last valid entries.
    pub lsns: Option<(u64, u64)>,
    /// LSN ranges between two valid entries that no valid entry holds
    /// (segments removed by garbage collection, or entries lost to damage).
    pub lsn_gaps: Vec<(u64, u64)>,
    /// The checkpoint the stream state starts from: segment and LSN.
    pub state_from: Option<(u64, u64)>,
    /// Every stream, ordered by name.
    pub streams: Vec<StreamSummary>,
    /// Records appended in the scanned log.
    pub records_appended: u64,
    /// Their payload bytes.
    pub bytes_appended: u64,
    /// Lease acquisitions in the scanned log.
    pub lease_acquisitions: u64,
    /// The highest lease token issued (newest checkpoint's counter and the
    /// acquisitions after it).
    pub highest_lease_token: u64,
    /// Live leases the newest checkpoint lists.
    pub leases_at_checkpoint: u64,
    /// All damage, in file order: what the log's verifier found, and entries
    /// that pass their checksum yet do not decode or do not replay.
    pub damage: Vec<Damage>,
}

impl Summary {
    /// Whether anything is damaged (a torn tail is not damage).
    pub fn is_damaged(&self) -> bool {
        !self.damage.is_empty()
    }
}

/// The value of `name` in `map`, inserted if missing (without allocating a
/// key when it is there).
fn slot<'m, V: Default>(map: &'m mut HashMap<Vec<u8>, V>, name: &[u8]) -> &'m mut V {
    if !map.contains_key(name) {
        map.insert(name.to_vec(), V::default());
    }
    map.get_mut(name)
        .unwrap_or_else(|| unreachable!("inserted just above"))
}

/// Replays entries the way recovery does, noting what does not fit.
struct Replay<'d> {
    dir: &'d Path,
    state: HashMap<Vec<u8>, Numbers>,
    appended: HashMap<Vec<u8>, (u64, u64)>,
    last_token: u64,
    prev_lsn: Option<u64>,
    checkpoints: u64,
    ops: OpCounts,
    first_lsn: Option<u64>,
    lsn_gaps: Vec<(u64, u64)>,
    state_from: Option<(u64, u64)>,
    records_appended: u64,
    bytes_appended: u64,
    lease_acquisitions: u64,
    leases_at_checkpoint: u64,
    damage: Vec<Damage>,
}

impl<'d> Replay<'d> {
    fn new(dir: &'d Path) -> Self {
        Replay {
            dir,
            state: HashMap::new(),
            appended: HashMap::new(),
            last_token: 0,
            prev_lsn: None,
            checkpoints: 0,
            ops: OpCounts::default(),
            first_lsn: None,
            lsn_gaps: Vec::new(),
            state_from: None,
            records_appended: 0,
            bytes_appended: 0,
            lease_acquisitions: 0,
            leases_at_checkpoint: 0,
            damage: Vec::new(),
        }
    }

    fn entry(&mut self, e: &VerifiedEntry<'_>) {
        let contiguous = self.prev_lsn.and_then(|p| p.checked_add(1)) == Some(e.lsn);
        match self.prev_lsn {
            None => self.first_lsn = Some(e.lsn),
            Some(p) if e.lsn > p + 1 => self.lsn_gaps.push((p + 1, e.lsn - 1)),
            Some(_) => {}
        }
        self.prev_lsn = Some(e.lsn);
        let problems = match describe(e.kind, e.payload) {
            Ok(view) => self.apply(e, &view, contiguous),
            Err(why) => {
                self.damage.push(Damage::undecodable(self.dir, e, &why));
                return;
            }
        };
        for what in problems {
            self.damage.push(Damage {
                file: self.dir.join(format::segment_file_name(e.segment)),
                position: e.position,
                lsn: Some(e.lsn),
                what,
            });
        }
    }

    /// Applies one decoded entry; answers what does not fit the entries
    /// before it. A misfit is applied anyway, so that one bad entry is
    /// reported once rather than for every entry after it.
    fn apply(
        &mut self,
        e: &VerifiedEntry<'_>,
        view: &EntryView<'_>,
        contiguous: bool,
    ) -> Vec<String> {
        match view {
            EntryView::Checkpoint {
                streams,
                leases,
                last_token,
            } => self.checkpoint(e, streams, *leases, *last_token, contiguous),
            EntryView::Op(op) => self.apply_op(op),
            // A link, or a kind added after this tool: it decoded, so it is
            // not damage, but it changes nothing the report shows.
            _ => Vec::new(),
        }
    }

    /// Applies one op (see [`Self::apply`]).
    fn apply_op(&mut self, op: &Op<'_>) -> Vec<String> {
        let mut problems = Vec::new();
        match *op {
            Op::Append(a) => problems.extend(self.append(&a)),
            Op::Fence { stream, token } => {
                self.ops.fences += 1;
                problems.extend(self.fence(stream, token));
            }
            Op::Trim {
                stream,
                token,
                before,
            } => {
                self.ops.trims += 1;
                problems.extend(self.trim(stream, token, before, "a trim"));
            }
            Op::Delete { stream, token } => {
                self.ops.deletes += 1;
                let next = self.state.get(stream).map_or(0, |s| s.next);
                problems.extend(self.trim(stream, token, next, "a delete"));
            }
            Op::Acquire(a) => problems.extend(self.acquire(a.name, a.token, a.fence)),
            // A replica's entry: what it changed counts as on one node.
            Op::Replicated { .. } => {
                if let Some(inner) = op.replicated_op() {
                    problems.extend(self.apply_op(&inner));
                }
            }
            Op::Release { .. } => self.ops.releases += 1,
            Op::Renew { .. } => self.ops.renewals += 1,
            Op::Batch { .. } => {
                self.ops.transactions += 1;
                for inner in op.batch_ops() {
                    problems.extend(self.apply_op(&inner));
                }
            }
            // A kind added after this tool: it decoded, so it is not
            // damage, but it changes nothing the report shows.
            _ => {}
        }
        problems
    }

    /// A checkpoint: the state from here on. One right after the entries
    /// before it (no LSN gap) must hold the state they leave.
    fn checkpoint(
        &mut self,
        e: &VerifiedEntry<'_>,
        streams: &[CheckpointStream],
        leases: usize,
        last_token: u64,
        contiguous: bool,
    ) -> Vec<String> {
        self.checkpoints += 1;
        let table: HashMap<Vec<u8>, Numbers> = streams
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    Numbers {
                        highest: s.highest_token,
                        next: s.next_offset,
                        start: s.start_offset,
                    },
                )
            })
            .collect();
        let problems = if contiguous && self.state_from.is_some() {
            self.compare_checkpoint(&table, last_token)
        } else {
            Vec::new()
        };
        self.state = table;
        self.last_token = last_token;
        self.leases_at_checkpoint = leases as u64;
        self.state_from = Some((e.segment, e.lsn));
        problems
    }

    fn append(&mut self, append: &Append<'_>) -> Option<String> {
        self.ops.appends += 1;
        let &Append {
            stream,
            token,
            first_offset,
            count,
            ..
        } = append;
        let s = slot(&mut self.state, stream);
        let problem = (token < s.highest || first_offset != s.next || count == 0).then(|| {
            format!(
                "an append of {count} records at offset {first_offset} with token {token} \
                 that does not follow stream {} (next offset {}, highest token {})",
                escape(stream, None),
                s.next,
                s.highest
            )
        });
        s.highest = s.highest.max(token);
        s.next = append.end_offset();
        let bytes = append.payload_bytes();
        let a = slot(&mut self.appended, stream);
        a.0 += u64::from(count);
        a.1 += bytes;
        self.records_appended += u64::from(count);
        self.bytes_appended += bytes;
        problem
    }

    fn acquire(&mut self, name: &[u8], token: u64, fence: bool) -> Vec<String> {
        self.ops.acquires += 1;
        self.lease_acquisitions += 1;
        let mut problems = Vec::new();
        if fence {
            problems.extend(self.fence(name, token));
        }
        if token <= self.last_token {
            problems.push(format!(
                "a lease acquisition of {} that issued token {token}, not above the last \
                 issued {}",
                escape(name, None),
                self.last_token
            ));
        }
        self.last_token = self.last_token.max(token);
        problems
    }

    fn fence(&mut self, stream: &[u8], token: u64) -> Option<String> {
        let s = slot(&mut self.state, stream);
        let problem = (token < s.highest).then(|| {
            format!(
                "a fence of stream {} with token {token}, below its highest token {}",
                escape(stream, None),
                s.highest
            )
        });
        s.highest = s.highest.max(token);
        problem
    }

    fn trim(&mut self, stream: &[u8], token: u64, before: u64, what: &str) -> Option<String> {
        let s = slot(&mut self.state, stream);
        let problem = (token < s.highest || before > s.next).then(|| {
            format!(
                "{what} of stream {} before offset {before} with token {token} that does not fit \
                 it (next offset {}, highest token {})",
                escape(stream, None),
                s.next,
                s.highest
            )
        });
        s.highest = s.highest.max(token);
        s.start = s.start.max(before);
        problem
    }

    fn compare_checkpoint(
        &self,
        table: &HashMap<Vec<u8>, Numbers>,
        last_token: u64,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let mut names: Vec<&Vec<u8>> = table.keys().chain(self.state.keys()).collect();
        names.sort_unstable();
        names.dedup();
        let show = |n: Option<&Numbers>| {
            n.map_or("absent".to_string(), |n| {
                format!(
                    "highest token {}, next offset {}, start offset {}",
                    n.highest, n.next, n.start
                )
            })
        };
        for name in names {
            let (logged, replayed) = (table.get(name), self.state.get(name));
            if logged != replayed {
                problems.push(format!(
                    "a checkpoint that disagrees with the entries before it on stream {}: it holds \
                     {}, the entries leave {}",
                    escape(name, None),
                    show(logged),
                    show(replayed)
                ));
            }
        }
        if last_token < self.last_token {
            problems.push(format!(
                "a checkpoint whose last lease token {last_token} is below token {} issued before it",
                self.last_token
            ));
        }
        problems
    }

    fn finish(self, dir: &Path, report: VerifyReport) -> Summary {
        let mut damage = wal_damage(&report);
        damage.extend(self.damage);
        sort_damage(&mut damage);
        let mut streams: Vec<StreamSummary> = self
            .state
            .into_iter()
            .map(|(name, n)| {
                let (records, bytes) = self.appended.get(&name).copied().unwrap_or_default();
                StreamSummary {
                    name,
                    highest_token: n.highest,
                    next_offset: n.next,
                    start_offset: n.start,
                    records_appended: records,
                    bytes_appended: bytes,
                }
            })
            .collect();
        streams.sort_by(|a, b| a.name.cmp(&b.name));
        Summary {
            dir: dir.to_path_buf(),
            report,
            checkpoints: self.checkpoints,
            ops: self.ops,
            lsns: self.first_lsn.zip(self.prev_lsn),
            lsn_gaps: self.lsn_gaps,
            state_from: self.state_from,
            streams,
            records_appended: self.records_appended,
            bytes_appended: self.bytes_appended,
            lease_acquisitions: self.lease_acquisitions,
            highest_lease_token: self.last_token,
            leases_at_checkpoint: self.leases_at_checkpoint,
            damage,
        }
    }
}

/// Verifies the data directory `dir`: checks it, takes its lock, reads every
/// segment. `on_progress(bytes_done)` is called as the scan advances.
pub fn scan(dir: &Path, on_progress: impl Fn(u64)) -> Result<Summary, ToolError> {
    check_dir(dir)?;
    let mut replay = Replay::new(dir);
    // Bytes of the segments already scanned (shared by both callbacks).
    let base = Cell::new(0u64);
    let mut last_shown = 0u64;
    let report = run_wal_verify(
        dir,
        |e| {
            replay.entry(e);
            let done = base.get() + e.position;
            // Every 64 KiB is often enough for a progress bar.
            if done >= last_shown + (64 << 10) {
                last_shown = done;
                on_progress(done);
            }
        },
        |done, _total| {
            base.set(done);
            on_progress(done);
        },
    )?;
    Ok(replay.finish(dir, report))
}

/// Options of `fencelog verify`.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// List every segment and stream, not only the first [`LIST_LIMIT`].
    pub all: bool,
    /// Draw a progress bar on stderr (only drawn on a terminal).
    pub progress: bool,
}

/// `fencelog verify DIR`: prints the report on stdout; answers the exit code.
pub fn run(dir: &Path, opts: &VerifyOptions) -> ExitCode {
    let total = match check_dir(dir) {
        Ok(bytes) => bytes,
        Err(e) => return fail(&e),
    };
    let bar = if opts.progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "verifying {wide_bar} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let scanned = scan(dir, |done| bar.set_position(done.min(total)));
    bar.finish_and_clear();
    let summary = match scanned {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let text = render(&summary, opts.all);
    // A closed pipe (`fencelog verify DIR | head`) is no error: the exit code
    // still tells whether the log is damaged.
    if let Err(e) = write_stdout(text.as_bytes())
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        return fail_output(&e);
    }
    if summary.is_damaged() {
        ExitCode::from(EXIT_DAMAGED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints `fencelog: {e}` on stderr; answers [`EXIT_ERROR`].
pub fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    // Nothing more to do if stderr is gone too.
    let _ = writeln!(io::stderr(), "fencelog: {e}");
    ExitCode::from(EXIT_ERROR)
}

/// Reports a failed write to stdout (other than a closed pipe, which the
/// callers let pass quietly); answers [`EXIT_ERROR`].
pub fn fail_output(e: &io::Error) -> ExitCode {
    fail(&format_args!("cannot write the output: {e}"))
}

fn write_stdout(bytes: &[u8]) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

/// Quotes bytes the way Rust writes byte strings (printable ASCII as is,
/// `\n`, `\r`, `\t`, `\"`, `\\`, `\xNN` for the rest), at most `limit` of them,
/// noting how many were left out.
pub fn escape(bytes: &[u8], limit: Option<usize>) -> String {
    let shown = &bytes[..limit.map_or(bytes.len(), |l| l.min(bytes.len()))];
    let mut s = String::with_capacity(shown.len() + 2);
    s.push('"');
    for &b in shown {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(char::from(b)),
            _ => {
                let _ = write!(s, "\\x{b:02x}");
            }
        }
    }
    s.push('"');
    if shown.len() < bytes.len() {
        let _ = write!(s, "...(+{} bytes)", bytes.len() - shown.len());
    }
    s
}

/// A byte count for people: `786432 bytes (768.0 KiB)`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{n} bytes ({v:.1} {})", UNITS[unit])
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The report `fencelog verify` prints.
pub fn render(s: &Summary, all: bool) -> String {
    let mut o = String::new();
    let r = &s.report;
    // Writing to a String cannot fail.
    let _ = render_into(&mut o, s, r, all);
    o
}

fn render_into(o: &mut String, s: &Summary, r: &VerifyReport, all: bool) -> std::fmt::Result {
    writeln!(o, "fencelog verify {}", s.dir.display())?;
    writeln!(o)?;
    let limit = if all { usize::MAX } else { LIST_LIMIT };
    render_segments(o, r, limit)?;
    render_entries(o, s, r)?;
    render_streams(o, s, limit)?;
    writeln!(
        o,
        "leases    {} in the scanned log, highest lease token {}, {} live at the newest checkpoint",
        plural(s.lease_acquisitions, "acquisition", "acquisitions"),
        s.highest_lease_token,
        s.leases_at_checkpoint
    )?;

    for g in &r.segments {
        if let Some(at) = g.torn_tail_at {
            writeln!(
                o,
                "torn tail {} at byte {at}: the last write there was unfinished when the writer \
                 stopped (a crash or power loss), or its bytes were damaged since (the two cannot \
                 be told apart). It was never acknowledged to anyone; opening the log cuts it. Not \
                 damage.",
                g.path.display()
            )?;
        }
    }

    render_damage(o, s)
}

/// Each segment's state, size and LSNs (the first `limit`), and the ones
/// absent.
fn render_segments(o: &mut String, r: &VerifyReport, limit: usize) -> std::fmt::Result {
    let sealed = r.segments.iter().filter(|g| g.sealed).count() as u64;
    let unsealed = r.segments.len() as u64 - sealed;
    writeln!(
        o,
        "segments  {} ({sealed} sealed, {unsealed} not sealed), {}",
        r.segments.len(),
        human_bytes(r.bytes)
    )?;
    let last_with_entries = r.segments.iter().rposition(|g| g.entries > 0);
    for (i, g) in r.segments.iter().enumerate().take(limit) {
        let state = if g.damage.is_some() {
            "DAMAGED"
        } else if g.sealed {
            "sealed"
        } else if Some(i) == last_with_entries {
            "active"
        } else if g.entries == 0 {
            "preallocated"
        } else {
            "not sealed"
        };
        let lsns = match (g.first_lsn, g.last_lsn) {
            (Some(a), Some(b)) => format!("LSN {a}..={b}"),
            _ => "no entries".into(),
        };
        writeln!(
            o,
            "  {}  {state:<12}  {:>12} bytes  {:>9} entries  {lsns}",
            file_name(&g.path),
            g.len,
            g.entries,
        )?;
    }
    if r.segments.len() > limit {
        writeln!(
            o,
            "  ... and {} more segments (--all lists every one)",
            r.segments.len() - limit
        )?;
    }
    for w in r.segments.windows(2) {
        if w[1].seq > w[0].seq + 1 {
            writeln!(
                o,
                "  segments {}..={} are absent (removed once every record in them was trimmed)",
                w[0].seq + 1,
                w[1].seq - 1
            )?;
        }
    }
    Ok(())
}

/// The entries by kind, the LSNs and the records appended.
fn render_entries(o: &mut String, s: &Summary, r: &VerifyReport) -> std::fmt::Result {
    let ops = &s.ops;
    writeln!(
        o,
        "entries   {}: {}, {}, {}, {}, {}, {}, {}, {}, {}",
        r.entries,
        plural(s.checkpoints, "checkpoint", "checkpoints"),
        plural(ops.appends, "append", "appends"),
        plural(ops.fences, "fence", "fences"),
        plural(ops.trims, "trim", "trims"),
        plural(ops.deletes, "delete", "deletes"),
        plural(ops.acquires, "lease acquisition", "lease acquisitions"),
        plural(ops.releases, "release", "releases"),
        plural(ops.renewals, "logged renewal", "logged renewals"),
        plural(ops.transactions, "transaction", "transactions"),
    )?;
    match s.lsns {
        Some((first, last)) => {
            write!(o, "LSNs      {first}..={last}")?;
            if first > 1 {
                write!(
                    o,
                    " (the log starts at LSN {first}: older segments were removed once every \
                     record in them was trimmed)"
                )?;
            }
            writeln!(o)?;
            let why = if s.damage.is_empty() {
                "segments removed by garbage collection"
            } else {
                "segments removed by garbage collection, or entries lost to the damage below"
            };
            for (a, b) in &s.lsn_gaps {
                writeln!(o, "  LSNs {a}..={b} absent ({why})")?;
            }
        }
        None => writeln!(o, "LSNs      none: no valid entry")?,
    }
    writeln!(
        o,
        "records   {} appended in the scanned log, {} of payload",
        s.records_appended,
        human_bytes(s.bytes_appended)
    )?;
    Ok(())
}

/// Each stream's numbers (the busiest `limit`).
fn render_streams(o: &mut String, s: &Summary, limit: usize) -> std::fmt::Result {
    write!(o, "streams   {}", s.streams.len())?;
    if let (Some((seg, lsn)), Some((_, last))) = (s.state_from, s.lsns) {
        write!(
            o,
            " (state replayed from the checkpoint at LSN {lsn} in segment {seg}, then {})",
            plural(last - lsn, "entry", "entries")
        )?;
    }
    writeln!(o)?;
    if !s.streams.is_empty() {
        let mut shown: Vec<&StreamSummary> = s.streams.iter().collect();
        if shown.len() > limit {
            // The busiest ones, then by name.
            shown.sort_by(|a, b| {
                b.records_appended
                    .cmp(&a.records_appended)
                    .then_with(|| a.name.cmp(&b.name))
            });
            shown.truncate(limit);
            writeln!(
                o,
                "  the {limit} with the most records appended in the scanned log (--all lists \
                 every one):"
            )?;
        }
        let names: Vec<String> = shown.iter().map(|st| escape(&st.name, Some(64))).collect();
        let width = names
            .iter()
            .map(|n| n.chars().count())
            .max()
            .unwrap_or(0)
            .max(6);
        writeln!(
            o,
            "  {:<width$}  {:>13}  {:>12}  {:>12}  {:>16}",
            "stream", "highest token", "next offset", "start offset", "records appended"
        )?;
        for (st, name) in shown.iter().zip(&names) {
            writeln!(
                o,
                "  {name:<width$}  {:>13}  {:>12}  {:>12}  {:>16}",
                st.highest_token, st.next_offset, st.start_offset, st.records_appended
            )?;
        }
    }
    Ok(())
}

/// The damage found, and the verdict.
fn render_damage(o: &mut String, s: &Summary) -> std::fmt::Result {
    if s.damage.is_empty() {
        writeln!(o, "damage    none")?;
        writeln!(o)?;
        writeln!(o, "OK")?;
    } else {
        writeln!(
            o,
            "damage    {}:",
            plural(s.damage.len() as u64, "place", "places")
        )?;
        for d in &s.damage {
            write!(o, "  {} at byte {}", d.file.display(), d.position)?;
            if let Some(lsn) = d.lsn {
                write!(o, " (LSN {lsn})")?;
            }
            writeln!(o, ": {}", d.what)?;
        }
        writeln!(
            o,
            "  (a damaged segment is read up to its first damage only: the numbers above leave out \
             what follows it)"
        )?;
        writeln!(o)?;
        writeln!(o, "DAMAGED")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_quotes_like_byte_strings() {
        assert_eq!(escape(b"ab", None), "\"ab\"");
        assert_eq!(escape(b"a\"\\\n\x01\xff", None), r#""a\"\\\n\x01\xff""#);
        assert_eq!(escape(b"abcdef", Some(3)), "\"abc\"...(+3 bytes)");
        assert_eq!(escape(b"abc", Some(3)), "\"abc\"");
    }

    #[test]
    fn human_bytes_reads() {
        assert_eq!(human_bytes(10), "10 bytes");
        assert_eq!(human_bytes(786432), "786432 bytes (768.0 KiB)");
    }
}
