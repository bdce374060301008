//! The Python client (`clients/python`, on redis-py) against this build's
//! `fencelog`: its pytest suite runs here, so the README's one test command
//! runs it too. `.ci/run` installs pytest and the package into
//! `<target>/ci-venv`; without them the test fails in CI and is skipped,
//! with the reason, elsewhere.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_clients_tests_pass() {
    let Some(python) = common::python_with_redis_py() else {
        return;
    };
    let ready = Command::new(&python)
        .args(["-c", "import pytest, fencelog"])
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        common::missing(
            "pytest and the fencelog Python package",
            "bash .ci/run installs them into <target>/ci-venv \
             (pip install pytest ./clients/python)",
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "clients/python/tests",
        ])
        .current_dir(&root)
        .env("FENCELOG_BIN", common::bin())
        .output()
        .expect("pytest runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // 5 is pytest's "no tests collected": as much a failure as a failed one.
    assert!(
        out.status.success(),
        "pytest clients/python/tests: {:?}\n{text}",
        out.status
    );
    assert!(text.contains(" passed"), "{text}");
    eprintln!("{}", text.lines().last().unwrap_or_default());
}
