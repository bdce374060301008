//! `fencelog repair DIR`: salvage from the command line (SPEC §7).
//!
//! 1. Plan: [`fencelog_wal::plan_recovery`] in salvage mode says what
//!    opening would cut, changing nothing; the readable entries in the cut
//!    region are decoded ([`fencelog::inspect::describe`]) to name the
//!    streams and leases they touch.
//! 2. Ask: on a terminal, a yes/no question; otherwise `--yes` is needed
//!    (a script must say so; silence is no consent).
//! 3. Cut: the log is opened with [`RecoveryMode::Salvage`]. When it cuts
//!    damage to acknowledged entries, it raises the durable token floor
//!    first (to the marks' ceiling, above every token that could have been
//!    acknowledged), keeps the cut bytes in `*.damaged` files, then cuts. A
//!    torn tail (what followed the last sync, never acknowledged) is cut
//!    without raising anything.
//! 4. Check: the raise (from, to, by how much) or its absence, and the
//!    floor now in force, are reported and the log is verified.

use std::collections::BTreeSet;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fencelog::inspect::{self, Acquire, Append, EntryView, Op};
use fencelog_wal::format::{self, ALIGN, ENTRY_HEADER_LEN, HEADER_LEN, Probe};
use fencelog_wal::{Cut, CutKind, FsStorage, RecoveryMode, RecoveryReport, Storage, WalOptions};

use crate::verify::{self, VerifyOptions, escape, human_bytes};

/// Exit status: the log verifies clean afterwards (or nothing was cut).
const EXIT_CLEAN: u8 = 0;
/// Exit status: cut, but verification still finds damage.
const EXIT_DAMAGED: u8 = 1;
/// Exit status: nothing done (refused, declined, in use, unreadable).
const EXIT_NOTHING_DONE: u8 = 2;

/// `fencelog repair`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct RepairArgs {
    /// The data directory (refused while another process, such as a server,
    /// has it open).
    pub dir: PathBuf,
    /// Cut without asking. Needed when standard input is not a terminal.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Draw no progress bar while verifying.
    #[arg(long)]
    pub no_progress: bool,
}

/// What a repair would cut, read before anything changes.
#[derive(Debug, Default)]
pub struct Touched {
    /// Streams written by readable entries in the cut region.
    pub streams: BTreeSet<Vec<u8>>,
    /// Leases acquired, renewed or released there.
    pub leases: BTreeSet<Vec<u8>>,
    /// Readable entries found there.
    pub entries: u64,
    /// Files that could not be read to find them (named, with why).
    pub unreadable: Vec<String>,
}

/// Runs `fencelog repair`; answers the exit status.
pub fn run(args: &RepairArgs) -> ExitCode {
    let dir = &args.dir;
    if !dir.is_dir() {
        return nothing_done(&format!("{}: no such directory", dir.display()));
    }
    let opts = salvage_options(dir);
    let plan = match plan_locked(dir, &opts) {
        Ok(plan) => plan,
        Err(why) => return nothing_done(&why),
    };
    let Some(cut) = &plan.cut else {
        println!(
            "{}: nothing to cut: every segment up to the end of the log is readable.",
            dir.display()
        );
        return verify_now(args);
    };
    let touched = touched_by(cut);
    print!("{}", describe_plan(cut, &touched, plan.marks.ceiling));
    if !args.yes
        && let Err(why) = ask_to_cut()
    {
        return nothing_done(why);
    }
    let log = match fencelog::Log::open(dir, opts) {
        Ok(log) => log,
        Err(e) => {
            return nothing_done(&format!(
                "cannot open {} in salvage mode: {e}",
                dir.display()
            ));
        }
    };
    let report = log.recovery_report().clone();
    let floor = log.metrics().token_floor;
    drop(log);
    print_done(&report);
    println!(
        "Token floor now in force: {floor} (every stream's highest token and the lease counter \
         restart at or above it, durably)."
    );
    println!("\nVerifying:");
    verify_now(args)
}

/// Plans the salvage under the directory's lock, so no server starts
/// meanwhile; the lock is released before the log is opened (which takes
/// it again). An error says why nothing was done.
fn plan_locked(dir: &Path, opts: &fencelog::Options) -> Result<RecoveryReport, String> {
    let _lock = match FsStorage.lock_dir(dir) {
        Ok(lock) => lock,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            return Err(format!(
                "{} is in use by another process (a running server?): stop it first",
                dir.display()
            ));
        }
        Err(e) => return Err(format!("cannot lock {}: {e}", dir.display())),
    };
    fencelog_wal::plan_recovery(&FsStorage, dir, &opts.wal)
        .map_err(|e| format!("cannot read the log in {}: {e}", dir.display()))
}

/// Asks on the terminal whether to cut; an error says why not.
fn ask_to_cut() -> Result<(), &'static str> {
    if !std::io::stdin().is_terminal() {
        return Err("standard input is not a terminal: pass --yes to cut without asking");
    }
    print!("Cut the log here? [y/N] ");
    let _ = std::io::stdout().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        Ok(())
    } else {
        Err("nothing was changed")
    }
}

/// What opening in salvage mode cut, and whether it raised the floor.
fn print_done(report: &RecoveryReport) {
    match &report.cut {
        Some(done) => {
            println!(
                "\nCut {} at byte {}: {} dropped, {} readable entr{} with it.",
                done.file.display(),
                done.position,
                human_bytes(done.bytes_cut),
                done.entries_cut,
                if done.entries_cut == 1 { "y" } else { "ies" }
            );
            if done.moved_aside.is_empty() {
                println!("No bytes needed keeping (nothing was written past the cut).");
            } else {
                println!("The cut bytes are kept in:");
                for p in &done.moved_aside {
                    println!("  {}", p.display());
                }
            }
            for p in &done.removed {
                println!("Removed (held no valid entry): {}", p.display());
            }
        }
        None => println!("\nOpening cut nothing after all."),
    }
    match report.floor_raised {
        Some(raise) => println!(
            "Token floor raised from {} to {} (by {}): acknowledged entries were cut, and \
             every token they could have carried is at or below {}.",
            raise.from,
            raise.to,
            raise.to.saturating_sub(raise.from),
            raise.to
        ),
        None if report
            .cut
            .as_ref()
            .is_some_and(|c| c.kind == CutKind::TornTail) =>
        {
            println!(
                "Token floor not raised: the cut held only what followed the last sync, never \
             acknowledged."
            )
        }
        None => {}
    }
}

fn verify_now(args: &RepairArgs) -> ExitCode {
    let code = verify::run(
        &args.dir,
        &VerifyOptions {
            all: false,
            progress: !args.no_progress,
        },
    );
    if code == ExitCode::SUCCESS {
        ExitCode::from(EXIT_CLEAN)
    } else if code == ExitCode::from(EXIT_DAMAGED) {
        code
    } else {
        ExitCode::from(EXIT_NOTHING_DONE)
    }
}

fn nothing_done(why: &str) -> ExitCode {
    eprintln!("fencelog repair: {why}");
    ExitCode::from(EXIT_NOTHING_DONE)
}

/// Salvage with the log's own segment size (the largest segment file
/// there), so that the segment opening creates is like the others; entries
/// as large as a segment holds are read.
fn salvage_options(dir: &Path) -> fencelog::Options {
    let largest = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| format::parse_segment_file_name(n).is_some())
        })
        .filter_map(|e| e.metadata().ok().map(|m| m.len()))
        .max()
        .unwrap_or(0);
    let defaults = WalOptions::default();
    let segment_bytes = if largest == 0 {
        defaults.segment_bytes
    } else {
        largest.clamp(64 << 10, 1 << 30)
    };
    let max_entry = u32::try_from(segment_bytes / 2).unwrap_or(u32::MAX);
    fencelog::Options {
        max_payload_bytes: (1 << 20u32).min(max_entry.saturating_sub(4096)).max(1),
        wal: WalOptions {
            segment_bytes,
            max_entry_bytes: max_entry,
            recovery: RecoveryMode::Salvage,
            ..defaults
        },
        ..fencelog::Options::default()
    }
}

/// The plan, for people.
fn describe_plan(cut: &Cut, touched: &Touched, ceiling: u64) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let kind = match cut.kind {
        CutKind::TornTail => "a torn tail (past the last sync a later write proves)",
        CutKind::Salvaged => "damage to acknowledged entries",
    };
    let _ = writeln!(s, "The log ends early: {kind}.");
    let _ = writeln!(s, "  file:     {}", cut.file.display());
    let _ = writeln!(s, "  byte:     {}", cut.position);
    let _ = writeln!(s, "  found:    {}", cut.reason);
    let _ = writeln!(
        s,
        "  cut:      {} from that file, {} valid entr{} after it",
        human_bytes(cut.bytes_cut),
        cut.entries_cut,
        if cut.entries_cut == 1 { "y" } else { "ies" }
    );
    let names = |set: &BTreeSet<Vec<u8>>| {
        set.iter()
            .map(|n| escape(n, Some(64)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "  streams:  {}",
        if touched.streams.is_empty() {
            "none that can be read".into()
        } else {
            names(&touched.streams)
        }
    );
    if !touched.leases.is_empty() {
        let _ = writeln!(s, "  leases:   {}", names(&touched.leases));
    }
    let _ = writeln!(
        s,
        "  readable: {} entr{} in the cut region",
        touched.entries,
        if touched.entries == 1 { "y" } else { "ies" }
    );
    for u in &touched.unreadable {
        let _ = writeln!(s, "  unread:   {u}");
    }
    for p in &cut.moved_aside {
        let _ = writeln!(s, "  kept in:  {}", p.display());
    }
    for p in &cut.removed {
        let _ = writeln!(s, "  removed:  {} (no valid entry)", p.display());
    }
    let _ = match cut.kind {
        CutKind::Salvaged => writeln!(
            s,
            "  floor:    tokens restart at or above {ceiling} (no write acknowledged before can be \
             undercut)"
        ),
        CutKind::TornTail => writeln!(
            s,
            "  floor:    not raised (never acknowledged: every stream keeps the highest token its \
             surviving entries carry)"
        ),
    };
    s
}

/// Decodes what can be read of the cut region: the rest of the file the
/// log ends in, from the cut on, and every later segment moved aside.
pub fn touched_by(cut: &Cut) -> Touched {
    let mut t = Touched::default();
    let mut files = vec![(cut.file.clone(), cut.position)];
    for aside in &cut.moved_aside {
        // `X.wal.damaged` holds what `X.wal` holds now.
        let source = PathBuf::from(
            aside
                .to_string_lossy()
                .trim_end_matches(".damaged")
                .to_string(),
        );
        if source != cut.file {
            files.push((source, HEADER_LEN));
        }
    }
    for (path, from) in files {
        let seq = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(format::parse_segment_file_name);
        let Some(seq) = seq else {
            t.unreadable
                .push(format!("{}: not a segment file name", path.display()));
            continue;
        };
        match std::fs::read(&path) {
            Ok(data) => scan(&data, seq, from, &mut t),
            Err(e) => t.unreadable.push(format!("{}: {e}", path.display())),
        }
    }
    t
}

/// Every entry with a valid checksum at or after `from`, at any aligned
/// position (damage may sit between them).
fn scan(data: &[u8], seq: u64, from: u64, t: &mut Touched) {
    let mut pos = format::align_up(from.max(HEADER_LEN)) as usize;
    while pos + ENTRY_HEADER_LEN <= data.len() {
        match format::probe_entry(&data[pos..], seq, u32::MAX) {
            Probe::Entry(h) => {
                let start = pos + ENTRY_HEADER_LEN;
                if let Some(payload) = data.get(start..start + h.len as usize)
                    && let Ok(view) = inspect::describe(h.kind, payload)
                {
                    t.entries += 1;
                    if let EntryView::Op(op) = view {
                        note(&op, t);
                    }
                }
                pos += h.encoded_len() as usize;
            }
            _ => pos += ALIGN as usize,
        }
    }
}

/// Notes the streams and leases an op touches.
fn note(op: &Op<'_>, t: &mut Touched) {
    match *op {
        Op::Append(Append { stream, .. })
        | Op::Fence { stream, .. }
        | Op::Trim { stream, .. }
        | Op::Delete { stream, .. } => {
            t.streams.insert(stream.to_vec());
        }
        Op::Acquire(Acquire { name, fence, .. }) => {
            t.leases.insert(name.to_vec());
            if fence {
                t.streams.insert(name.to_vec());
            }
        }
        Op::Release { name, .. } | Op::Renew { name, .. } => {
            t.leases.insert(name.to_vec());
        }
        Op::Batch { .. } => {
            for inner in op.batch_ops() {
                note(&inner, t);
            }
        }
        // A replica's entry (cluster mode): what it decided is inside.
        Op::Replicated { .. } => {
            if let Some(inner) = op.replicated_op() {
                note(&inner, t);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streams a replica's entry touches are listed, as a single
    /// node's are (they were missed: a cut of a replica's engine listed
    /// none).
    #[test]
    fn a_replicated_entry_notes_what_its_op_touches() {
        let samples = fencelog::fuzzing::sample_encodings();
        let bytes = |name: &str| {
            samples
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| b.clone())
                .unwrap_or_else(|| panic!("no sample {name}"))
        };
        for name in ["op/batch", "op/replicated_batch"] {
            let payload = bytes(name);
            let Ok(EntryView::Op(op)) =
                inspect::describe(fencelog_wal::EntryKind::Record, &payload)
            else {
                panic!("{name} does not decode as an op");
            };
            let mut t = Touched::default();
            note(&op, &mut t);
            let streams: Vec<&[u8]> = t.streams.iter().map(Vec::as_slice).collect();
            assert_eq!(streams, [b"orders".as_slice()], "{name}");
        }
    }
}
