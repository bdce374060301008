//! The cluster secret from the command line (issue 19): `serve` refuses a
//! non-loopback Raft address without `--cluster-secret-file`, and a secret
//! file that is empty or too long; members that share a secret form a
//! group, and one that joins with `--cluster-join` gets in through a
//! member with `--requirepass` (it used to retry forever, refused
//! NOAUTH); a stranger on the Raft port is logged as `peer_auth_failed`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{bin, free_ports};

/// `fencelog serve ARGS` run to its end (it must refuse): exit status and
/// stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(bin())
        .arg("serve")
        .args(args)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "serve {args:?} started: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn serve_refuses_an_open_raft_port_without_a_secret_and_a_bad_secret_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let port = free_ports("127.0.0.1", &[0]);
    let addr = format!("127.0.0.1:{port}");
    let initial = format!("1=127.0.0.1:{}/{addr}", port + 1);
    let base = [
        "--dir",
        dir.to_str().unwrap(),
        "--addr",
        &addr,
        "--cluster-node-id",
        "1",
        "--cluster-initial",
        &initial,
    ];
    // Every interface, no secret.
    let raft_any = format!("0.0.0.0:{}", port + 1);
    let err = refused(&[&base[..], &["--cluster-raft-addr", &raft_any]].concat());
    assert!(err.contains("--cluster-secret-file"), "{err}");
    assert!(err.contains("0.0.0.0"), "{err}");

    // Empty (a lone newline is empty too), too long, missing.
    let empty = tmp.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let long = tmp.path().join("long");
    std::fs::write(&long, vec![b'x'; 4097]).unwrap();
    for (file, says) in [
        (empty.to_str().unwrap(), "empty"),
        (long.to_str().unwrap(), "4097 bytes"),
        ("/nonexistent/secret", "/nonexistent/secret"),
    ] {
        let err = refused(&[&base[..], &["--cluster-secret-file", file]].concat());
        assert!(err.contains("--cluster-secret-file"), "{err}");
        assert!(err.contains(says), "{err}");
    }
    // Without cluster mode the flag means nothing: refused, not ignored.
    let err = refused(&[
        "--dir",
        dir.to_str().unwrap(),
        "--addr",
        &addr,
        "--cluster-secret-file",
        long.to_str().unwrap(),
    ]);
    assert!(err.contains("--cluster-node-id"), "{err}");
}

/// A `fencelog serve` whose stderr is collected; killed on drop.
struct Proc {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Proc {
    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(bin())
            .arg("serve")
            .args(args)
            .args(["--log-level", "info"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = l.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Proc { child, log }
    }

    fn wait_for(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log.lock().unwrap().clone();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "the log never said {needle:?} in {within:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_secret(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn members_with_the_secret_form_a_group_a_joiner_authenticates_and_strangers_are_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("secret");
    write_secret(&secret, "correct horse battery staple\n");
    let secret = secret.to_str().unwrap();
    let p1 = free_ports("127.0.0.1", &[0, 1]);
    let p2 = free_ports("127.0.0.1", &[0, 1]);
    let (c1, r1) = (format!("127.0.0.1:{p1}"), format!("127.0.0.1:{}", p1 + 1));
    let (c2, r2) = (format!("127.0.0.1:{p2}"), format!("127.0.0.1:{}", p2 + 1));
    let d1 = tmp.path().join("n1");
    let d2 = tmp.path().join("n2");
    let initial = format!("1={r1}/{c1}");
    let n1 = Proc::start(&[
        "--dir",
        d1.to_str().unwrap(),
        "--addr",
        &c1,
        "--requirepass",
        "pw",
        "--cluster-node-id",
        "1",
        "--cluster-raft-addr",
        &r1,
        "--cluster-initial",
        &initial,
        "--cluster-secret-file",
        secret,
    ]);
    n1.wait_for("cluster_formed", Duration::from_secs(30));
    let n2 = Proc::start(&[
        "--dir",
        d2.to_str().unwrap(),
        "--addr",
        &c2,
        "--requirepass",
        "pw",
        "--cluster-node-id",
        "2",
        "--cluster-raft-addr",
        &r2,
        "--cluster-join",
        &c1,
        "--cluster-secret-file",
        secret,
    ]);
    // AUTH first, then CLUSTER ADDNODE: added, and caught up over an
    // authenticated peer connection.
    n2.wait_for("cluster_joined", Duration::from_secs(60));
    let log = n2.log.lock().unwrap().clone();
    assert!(!log.contains("NOAUTH"), "{log}");

    // A stranger on node 1's Raft port: closed, and logged as such.
    let mut s = TcpStream::connect(&r1).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    let log = n1.wait_for("peer_auth_failed", Duration::from_secs(5));
    assert!(log.contains("not_a_peer"), "{log}");
    // The file's path is in CONFIG GET, never the secret: nowhere in the
    // logs either.
    assert!(!log.contains("correct horse"), "{log}");
}
