//! `fencelog dump DIR`: prints every entry of a data directory's log, one
//! per line, in log order:
//!
//! ```text
//! segment=1 pos=64 lsn=1 checkpoint streams=0 leases=0 last_lease_token=0 table=[]
//! segment=1 pos=128 lsn=2 append stream="jobs" token=7 offsets=0..1 records=1 bytes=11 sizes=[11]
//! segment=1 pos=200 lsn=3 append stream="jobs" token=7 offsets=1..3 records=2 bytes=22 sizes=[11,11]
//! segment=1 pos=280 lsn=4 fence stream="jobs" token=8
//! segment=1 pos=320 lsn=5 acquire lease="jobs" owner="worker-b" token=9 ttl_ms=10000 fence=true
//! ```
//!
//! Offsets are half-open (`0..2` is records 0 and 1). Names and payloads
//! are escaped like Rust byte strings. The scan goes through the log's
//! verifier, so it takes the directory's lock (a directory in use is
//! refused) and only valid entries are printed; damage and torn tails are
//! reported on stderr at the end (exit 1 on damage, as `verify`).

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use fencelog::inspect::{CheckpointStream, EntryView, Op, describe};
use fencelog_wal::{EntryKind, VerifiedEntry, VerifyReport};

use crate::verify::{
    Damage, EXIT_DAMAGED, ToolError, check_dir, escape, fail, fail_output, run_wal_verify,
    sort_damage, wal_damage,
};

/// Bytes of a payload shown unless asked for more.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 64;

/// Record sizes and checkpoint streams shown on one line unless asked for
/// all.
pub const ITEM_LIMIT: usize = 16;

/// Options of `fencelog dump`.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    /// Only entries concerning this stream (or the lease of this name).
    pub stream: Option<Vec<u8>>,
    /// Print each record's payload.
    pub payloads: bool,
    /// Bytes of each payload shown.
    pub payload_limit: usize,
    /// Cut nothing: whole payloads, every size, every checkpoint stream.
    pub full: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            stream: None,
            payloads: false,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            full: false,
        }
    }
}

/// Formats one entry as its line (without the newline) into `line`;
/// answers false, writing nothing, when `opts.stream` filters it out. An
/// entry that does not decode is always shown.
pub fn format_entry(
    line: &mut String,
    e: &VerifiedEntry<'_>,
    view: &Result<EntryView<'_>, String>,
    opts: &DumpOptions,
) -> bool {
    // Writing to a String cannot fail.
    let _ = try_format_entry(line, e, view, opts);
    !line.is_empty()
}

fn try_format_entry(
    o: &mut String,
    e: &VerifiedEntry<'_>,
    view: &Result<EntryView<'_>, String>,
    opts: &DumpOptions,
) -> std::fmt::Result {
    let view = match view {
        Ok(v) => v,
        Err(why) => {
            prefix(o, e)?;
            let kind = match e.kind {
                EntryKind::Checkpoint => "checkpoint",
                EntryKind::Record => "record",
                EntryKind::Link => "link",
            };
            return write!(o, " {kind} UNDECODABLE ({} bytes): {why}", e.payload.len());
        }
    };
    if let Some(want) = &opts.stream
        && !matches!(view, EntryView::Checkpoint { .. })
        && !view.concerns(want)
    {
        return Ok(());
    }
    match view {
        EntryView::Op(op) => format_op(o, e, op, opts),
        EntryView::Checkpoint {
            streams,
            leases,
            last_token,
        } => {
            let mut rows: Vec<_> = streams
                .iter()
                .filter(|s| opts.stream.as_ref().is_none_or(|w| *w == s.name))
                .collect();
            if opts.stream.is_some() && rows.is_empty() {
                return Ok(());
            }
            rows.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            prefix(o, e)?;
            write!(
                o,
                " checkpoint streams={} leases={leases} last_lease_token={last_token} table=[",
                streams.len()
            )?;
            format_checkpoint_rows(o, &rows, opts)
        }
        // A link, or a kind added after this tool.
        other => {
            prefix(o, e)?;
            write!(o, " {other:?}")
        }
    }
}

/// An op's line: the prefix, then the op.
fn format_op(
    o: &mut String,
    e: &VerifiedEntry<'_>,
    op: &Op<'_>,
    opts: &DumpOptions,
) -> std::fmt::Result {
    prefix(o, e)?;
    format_op_body(o, op, opts)
}

/// An op's line after the prefix, starting with a space.
fn format_op_body(o: &mut String, op: &Op<'_>, opts: &DumpOptions) -> std::fmt::Result {
    match *op {
        Op::Batch { .. } => format_transaction(o, op, opts),
        Op::Append(a) => {
            write!(
                o,
                " append stream={} token={} offsets={}..{} records={} bytes={} sizes=[",
                escape(a.stream, None),
                a.token,
                a.first_offset,
                a.end_offset(),
                a.count,
                a.payload_bytes(),
            )?;
            format_payloads(o, &a.payloads().collect::<Vec<_>>(), opts)
        }
        _ => format_small_op(o, op),
    }
}

/// The start of every line: where the entry is.
fn prefix(o: &mut String, e: &VerifiedEntry<'_>) -> std::fmt::Result {
    write!(o, "segment={} pos={} lsn={}", e.segment, e.position, e.lsn)
}

/// How many items a line shows: `n`, or all with `--full`.
fn shown(n: usize, opts: &DumpOptions) -> usize {
    if opts.full { usize::MAX } else { n }
}

/// A transaction: its ops on one line, each as its own entry would show
/// it, without the prefix.
fn format_transaction(o: &mut String, batch: &Op<'_>, opts: &DumpOptions) -> std::fmt::Result {
    write!(o, " transaction ops={}:", batch.batch_ops().count())?;
    for (i, op) in batch.batch_ops().enumerate() {
        o.push_str(if i == 0 { " " } else { " | " });
        let at = o.len();
        format_op_body(o, &op, opts)?;
        // The space that follows the prefix on the op's own line.
        if o[at..].starts_with(' ') {
            o.remove(at);
        }
    }
    Ok(())
}

/// A checkpoint's table: each stream's tokens and offsets, the first
/// [`ITEM_LIMIT`] unless `--full`.
fn format_checkpoint_rows(
    o: &mut String,
    rows: &[&CheckpointStream],
    opts: &DumpOptions,
) -> std::fmt::Result {
    let shown = shown(ITEM_LIMIT, opts);
    for (i, s) in rows.iter().take(shown).enumerate() {
        if i > 0 {
            o.push_str(", ");
        }
        write!(
            o,
            "{} highest={} next={} start={}",
            escape(&s.name, None),
            s.highest_token,
            s.next_offset,
            s.start_offset
        )?;
    }
    if rows.len() > shown {
        write!(o, ", ...(+{} more)", rows.len() - shown)?;
    }
    o.push(']');
    Ok(())
}

/// An append's record sizes, and with `--payloads` the payloads.
fn format_payloads(o: &mut String, payloads: &[&[u8]], opts: &DumpOptions) -> std::fmt::Result {
    let shown = shown(ITEM_LIMIT, opts);
    for (i, p) in payloads.iter().take(shown).enumerate() {
        if i > 0 {
            o.push(',');
        }
        write!(o, "{}", p.len())?;
    }
    if payloads.len() > shown {
        write!(o, ",...(+{} more)", payloads.len() - shown)?;
    }
    o.push(']');
    if opts.payloads {
        let limit = (!opts.full).then_some(opts.payload_limit);
        o.push_str(" payloads=[");
        for (i, p) in payloads.iter().enumerate() {
            if i > 0 {
                o.push_str(", ");
            }
            write!(o, "b{}", escape(p, limit))?;
        }
        o.push(']');
    }
    Ok(())
}

/// The entries of one line each without lists: fences, trims, deletes
/// and the lease entries.
fn format_small_op(o: &mut String, op: &Op<'_>) -> std::fmt::Result {
    match op {
        Op::Fence { stream, token } => {
            write!(o, " fence stream={} token={token}", escape(stream, None))
        }
        Op::Trim {
            stream,
            token,
            before,
        } => write!(
            o,
            " trim stream={} token={token} before={before}",
            escape(stream, None)
        ),
        Op::Delete { stream, token } => {
            write!(o, " delete stream={} token={token}", escape(stream, None))
        }
        Op::Acquire(a) => write!(
            o,
            " acquire lease={} owner={} token={} ttl_ms={} fence={}",
            escape(a.name, None),
            escape(a.owner, None),
            a.token,
            a.ttl_ms,
            a.fence
        ),
        Op::Release { name, owner, token } => write!(
            o,
            " release lease={} owner={} token={token}",
            escape(name, None),
            escape(owner, None)
        ),
        Op::Renew {
            name,
            owner,
            token,
            ttl_ms,
        } => write!(
            o,
            " renew lease={} owner={} token={token} ttl_ms={ttl_ms}",
            escape(name, None),
            escape(owner, None)
        ),
        // A replica's entries, and kinds added after this tool: the op's
        // debug form (kept as it was; see `Op`'s `Debug`).
        other => write!(o, " {other:?}"),
    }
}

/// What printing the entries left to report.
struct Printed {
    /// Entries that do not decode.
    undecodable: Vec<Damage>,
    /// Lines printed.
    lines: u64,
    /// Why stdout stopped taking lines, if it did.
    write_error: Option<io::Error>,
}

/// `fencelog dump DIR`: prints the entries on stdout, damage and torn
/// tails on stderr; answers the exit code.
pub fn run(dir: &Path, opts: &DumpOptions) -> ExitCode {
    if let Err(e) = check_dir(dir) {
        return fail(&e);
    }
    let (scanned, printed) = print_entries(dir, opts);
    let report = match scanned {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let mut damage = wal_damage(&report);
    damage.extend(printed.undecodable);
    sort_damage(&mut damage);
    // Nothing more to do if stderr is gone too: its errors are ignored.
    let mut err = io::stderr().lock();
    if let Some(name) = &opts.stream
        && printed.lines == 0
    {
        let _ = writeln!(
            err,
            "fencelog: note: no entry concerns stream or lease {}",
            escape(name, None)
        );
    }
    let _ = write_notes(&mut err, &report, &damage);
    // A closed pipe (`fencelog dump DIR | head`) is no error.
    if let Some(e) = printed.write_error
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        return fail_output(&e);
    }
    if damage.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DAMAGED)
    }
}

/// Prints every entry the verifier passes on stdout; answers the
/// verifier's report and what printing found.
fn print_entries(dir: &Path, opts: &DumpOptions) -> (Result<VerifyReport, ToolError>, Printed) {
    let mut out = BufWriter::with_capacity(64 << 10, io::stdout().lock());
    let mut printed = Printed {
        undecodable: Vec::new(),
        lines: 0,
        write_error: None,
    };
    let mut line = String::new();
    let scanned = run_wal_verify(
        dir,
        |e| {
            let view = describe(e.kind, e.payload);
            if let Err(why) = &view {
                printed.undecodable.push(Damage::undecodable(dir, e, why));
            }
            // Once stdout is gone (`fencelog dump | head`), only the damage
            // check goes on.
            if printed.write_error.is_some() {
                return;
            }
            line.clear();
            if format_entry(&mut line, e, &view, opts) {
                line.push('\n');
                printed.lines += 1;
                if let Err(err) = out.write_all(line.as_bytes()) {
                    printed.write_error = Some(err);
                }
            }
        },
        |_, _| {},
    );
    if printed.write_error.is_none()
        && let Err(err) = out.flush()
    {
        printed.write_error = Some(err);
    }
    // Drop the buffer without another attempt to flush into a closed pipe.
    let (_, _) = out.into_parts();
    (scanned, printed)
}

/// The torn tails (not damage) and the damage, one line each.
fn write_notes(err: &mut impl Write, report: &VerifyReport, damage: &[Damage]) -> io::Result<()> {
    for s in &report.segments {
        if let Some(at) = s.torn_tail_at {
            writeln!(
                err,
                "fencelog: note: {}: a torn tail at byte {at} (an unfinished last write, never \
                 acknowledged; opening the log cuts it): not damage",
                s.path.display()
            )?;
        }
    }
    for d in damage {
        writeln!(
            err,
            "fencelog: damage: {} at byte {}: {}",
            d.file.display(),
            d.position,
            d.what
        )?;
    }
    Ok(())
}
