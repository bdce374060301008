//! Writes the seeds of the `engine_decode` fuzz target, made with the
//! engine's real encoders, into the directory given (by default
//! `fuzz/seeds/engine_decode`): run it after a format change.
//!
//! ```sh
//! cargo run -p fencelog --features fuzzing --example engine_fuzz_seeds
//! ```

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("fuzz/seeds/engine_decode"));
    std::fs::create_dir_all(&dir)?;
    let seeds = fencelog::fuzzing::engine_decode_seeds();
    for (name, bytes) in &seeds {
        std::fs::write(dir.join(name), bytes)?;
    }
    println!("{} seeds in {}", seeds.len(), dir.display());
    Ok(())
}
