//! Writes the seeds of the cluster's fuzz targets (valid encodings of
//! every cluster format) into `fuzz/seeds/<target>/`:
//!
//! ```text
//! cargo run -p fencelog-cluster --features fuzzing --example fuzz_seeds -- fuzz/seeds
//! ```

fn main() -> std::io::Result<()> {
    let root = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fuzz/seeds".into());
    fencelog_cluster::fuzzing::write_seeds(std::path::Path::new(&root))
}
