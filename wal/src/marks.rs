//! Durable marks kept beside the segments, in the file `MARKS`: a value the
//! layer above promises no acknowledged entry exceeds (the *ceiling*), and
//! a *floor* raised to that ceiling when a salvage cut drops acknowledged
//! entries.
//!
//! They live outside the segments because a salvage cut can take any
//! segment's tail with it: what was promised before the cut must survive
//! it. The engine uses them for tokens (SPEC §5: only what drops
//! acknowledged data on purpose raises a floor): every token it
//! acknowledges is at or below the ceiling, so after a salvage every
//! stream's highest token restarts at or above the floor. A torn tail (what
//! followed the last sync, never acknowledged) leaves them alone.
//!
//! ```text
//! // MARKS: [ Slot 48 B ][ Slot 48 B ]   written alternately; the valid slot with the higher generation wins
//! // Slot:  { magic: [u8; 4] = "FLMK" | version: u32 = 1 | generation: u64 | ceiling: u64 | floor: u64 | reserved: [u8; 12] | crc: u32 }
//! //   crc = CRC-32 of bytes 0..44
//! ```
//!
//! A write goes to the slot the current generation does not use, then is
//! synced: a torn write damages only that slot, and the other still holds
//! the previous marks.

use std::io;
use std::path::{Path, PathBuf};

use crate::error::WalError;
use crate::format::{u32_at, u64_at};
use crate::storage::{Storage, StorageFile};

/// The name of the marks file in a data directory.
pub const MARKS_FILE: &str = "MARKS";

const MAGIC: [u8; 4] = *b"FLMK";
const VERSION: u32 = 1;
const SLOT: usize = 48;

/// The two marks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// No acknowledged entry carries a value above this (the layer above
    /// raises it, durably, before it acknowledges one that would).
    pub ceiling: u64,
    /// Raised to the ceiling when a salvage cut drops acknowledged entries:
    /// values at or below it may have been acknowledged and lost with the
    /// cut. Never lowered.
    pub floor: u64,
}

fn encode(generation: u64, m: Marks) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    b[0..4].copy_from_slice(&MAGIC);
    b[4..8].copy_from_slice(&VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..24].copy_from_slice(&m.ceiling.to_le_bytes());
    b[24..32].copy_from_slice(&m.floor.to_le_bytes());
    let crc = crc32fast::hash(&b[..44]);
    b[44..48].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<(u64, Marks)> {
    if b.len() < SLOT || b[0..4] != MAGIC || u32_at(b, 4) != VERSION {
        return None;
    }
    if crc32fast::hash(&b[..44]) != u32_at(b, 44) {
        return None;
    }
    Some((
        u64_at(b, 8),
        Marks {
            ceiling: u64_at(b, 16),
            floor: u64_at(b, 24),
        },
    ))
}

/// The marks file of one data directory, open for the life of the log.
pub(crate) struct MarksFile {
    path: PathBuf,
    file: Box<dyn StorageFile>,
    generation: u64,
    marks: Marks,
}

impl MarksFile {
    /// Opens (or creates, durably) the marks file of `dir` and reads it.
    ///
    /// A file whose two slots are both damaged is corruption: the marks
    /// are what a cut must not lower, and guessing them would do that.
    pub(crate) fn open(storage: &dyn Storage, dir: &Path) -> Result<MarksFile, WalError> {
        let path = dir.join(MARKS_FILE);
        let file = match storage.open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Self::create(storage, dir, path);
            }
            Err(e) => return Err(WalError::io("open", &path, e)),
        };
        let mut b = [0u8; 2 * SLOT];
        let len = file.len().map_err(|e| WalError::io("stat", &path, e))?;
        let n = (len as usize).min(b.len());
        file.read_exact_at(&mut b[..n], 0)
            .map_err(|e| WalError::io("read", &path, e))?;
        let best = [decode(&b[..SLOT]), decode(&b[SLOT..])]
            .into_iter()
            .flatten()
            .max_by_key(|(generation, _)| *generation);
        let Some((generation, marks)) = best else {
            return Err(WalError::Corrupt {
                file: path,
                position: 0,
                reason: "both slots of the token marks are damaged; the token floor cannot be \
                         known (see docs/DESIGN.md, \"The token floor\")"
                    .into(),
            });
        };
        // After a killed process, what was just read may be a write no sync
        // covered (the process died between writing a slot and syncing it):
        // the page cache answers it, a later power cut may tear it, and the
        // other slot's older ceiling would come back. Make it durable before
        // anything is acknowledged on top of it.
        file.sync_data()
            .map_err(|e| WalError::io("fdatasync", &path, e))?;
        storage
            .sync_dir(dir)
            .map_err(|e| WalError::io("sync directory", dir, e))?;
        Ok(MarksFile {
            path,
            file,
            generation,
            marks,
        })
    }

    /// Creates the marks file, durably, with the first generation of
    /// zero marks: for a new log, or one written before marks existed
    /// (nothing was promised beyond what its segments hold). Made whole
    /// under another name, then renamed: a crash leaves either no marks
    /// file or a complete one.
    fn create(storage: &dyn Storage, dir: &Path, path: PathBuf) -> Result<MarksFile, WalError> {
        let tmp = dir.join(format!("{MARKS_FILE}.tmp"));
        let _ = storage.remove(&tmp);
        let f = storage
            .create_new(&tmp)
            .map_err(|e| WalError::io("create", &tmp, e))?;
        // Generation g lives in slot g % 2: the first one in slot 1.
        let mut init = Vec::with_capacity(2 * SLOT);
        init.extend_from_slice(&[0u8; SLOT]);
        init.extend_from_slice(&encode(1, Marks::default()));
        f.write_all_at(&init, 0)
            .map_err(|e| WalError::io("write", &tmp, e))?;
        f.sync_data()
            .map_err(|e| WalError::io("fdatasync", &tmp, e))?;
        drop(f);
        storage
            .rename(&tmp, &path)
            .map_err(|e| WalError::io("rename", &tmp, e))?;
        storage
            .sync_dir(dir)
            .map_err(|e| WalError::io("sync directory", dir, e))?;
        let f = storage
            .open(&path)
            .map_err(|e| WalError::io("open", &path, e))?;
        Ok(MarksFile {
            path,
            file: f,
            generation: 1,
            marks: Marks::default(),
        })
    }

    /// The marks as last written.
    pub(crate) fn get(&self) -> Marks {
        self.marks
    }

    /// Writes `marks` durably (into the slot not holding the current ones).
    pub(crate) fn set(&mut self, marks: Marks) -> io::Result<()> {
        let generation = self.generation + 1;
        let slot = (generation % 2) * SLOT as u64;
        self.file
            .write_all_at(&encode(generation, marks), slot)
            .map_err(|e| annotate(e, "write", &self.path))?;
        self.file
            .sync_data()
            .map_err(|e| annotate(e, "fdatasync", &self.path))?;
        self.generation = generation;
        self.marks = marks;
        Ok(())
    }
}

fn annotate(e: io::Error, op: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CrashMode, SimStorage};

    /// A new marks file in directory `/d` of an empty simulated disk.
    fn fresh() -> (SimStorage, &'static Path, MarksFile) {
        let sim = SimStorage::new();
        let dir = Path::new("/d");
        sim.create_dir_all(dir).unwrap();
        let m = MarksFile::open(&sim, dir).unwrap();
        (sim, dir, m)
    }

    #[test]
    fn marks_survive_reopen_and_a_torn_slot() {
        let (sim, dir, mut m) = fresh();
        assert_eq!(m.get(), Marks::default());
        m.set(Marks {
            ceiling: 10,
            floor: 0,
        })
        .unwrap();
        m.set(Marks {
            ceiling: 20,
            floor: 10,
        })
        .unwrap();
        drop(m);
        let image = sim.cut_power(CrashMode::LoseUnsynced);
        let m = MarksFile::open(&image, dir).unwrap();
        assert_eq!(
            m.get(),
            Marks {
                ceiling: 20,
                floor: 10
            }
        );
        // Damage the newer slot: the older one answers.
        let newer = (m.generation % 2) * SLOT as u64;
        drop(m);
        image
            .flip_bit(&dir.join(MARKS_FILE), newer + 17, 1)
            .unwrap();
        let m = MarksFile::open(&image, dir).unwrap();
        assert_eq!(
            m.get(),
            Marks {
                ceiling: 10,
                floor: 0
            }
        );
    }

    /// A process killed between writing a slot and syncing it leaves the
    /// new marks in the page cache only. The next open reads them and the
    /// engine acknowledges tokens up to that ceiling without writing the
    /// marks again: a later power cut must not bring the older slot back.
    /// (Found by the `engine_model` fuzzer: the floor came back at 0 after
    /// a torn cut, below token 7 acknowledged.)
    #[test]
    fn marks_a_killed_process_left_unsynced_are_durable_after_open() {
        for mode in [
            CrashMode::LoseUnsynced,
            CrashMode::LastWriteOnly,
            CrashMode::Torn { seed: 3 },
        ] {
            let (sim, dir, mut m) = fresh();
            // The slot's write lands, its sync is where the process dies.
            sim.cut_power_after(1, CrashMode::ProcessCrash);
            let raised = Marks {
                ceiling: 65_538,
                floor: 0,
            };
            assert!(m.set(raised).is_err());
            drop(m);
            let after_kill = sim.image().unwrap();
            let m = MarksFile::open(&after_kill, dir).unwrap();
            assert_eq!(m.get(), raised, "the page cache answers the new slot");
            drop(m);
            let after_cut = after_kill.cut_power(mode);
            let m = MarksFile::open(&after_cut, dir).unwrap();
            assert_eq!(m.get(), raised, "{mode:?}: the ceiling went back");
        }
    }

    /// Killed at any point of creating the file: once an open succeeds and
    /// a raise is synced, a power cut keeps it (the name included).
    #[test]
    fn a_marks_file_created_by_a_killed_process_survives_a_later_cut() {
        let dir = Path::new("/d");
        let mut points = 0;
        for n in 0..20 {
            let sim = SimStorage::new();
            sim.create_dir_all(dir).unwrap();
            sim.cut_power_after(n, CrashMode::ProcessCrash);
            let first = MarksFile::open(&sim, dir);
            let Some(after_kill) = sim.image() else {
                assert!(first.is_ok());
                break;
            };
            points += 1;
            drop(first);
            let mut m = MarksFile::open(&after_kill, dir).unwrap();
            let raised = Marks {
                ceiling: 100,
                floor: 0,
            };
            m.set(raised).unwrap();
            drop(m);
            let after_cut = after_kill.cut_power(CrashMode::LoseUnsynced);
            let m = MarksFile::open(&after_cut, dir).unwrap();
            assert_eq!(m.get(), raised, "killed at operation {n}");
        }
        assert!(points >= 4, "only {points} kill points were tried");
    }

    #[test]
    fn both_slots_damaged_is_corruption() {
        let (sim, dir, mut m) = fresh();
        m.set(Marks {
            ceiling: 5,
            floor: 0,
        })
        .unwrap();
        drop(m);
        sim.flip_bit(&dir.join(MARKS_FILE), 20, 0).unwrap();
        sim.flip_bit(&dir.join(MARKS_FILE), SLOT as u64 + 20, 0)
            .unwrap();
        assert!(
            MarksFile::open(&sim, dir)
                .err()
                .is_some_and(|e| e.is_corruption())
        );
    }
}
