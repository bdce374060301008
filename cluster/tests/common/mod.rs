//! Helpers shared by the cluster crate's integration tests.
//!
//! A small copy of the idea of `server/tests/common`'s `free_ports`
//! (sharing that file across crates would pull the server's test harness
//! into this crate): ports are taken below the kernel's ephemeral range,
//! so a port released by a stopped node is not handed to some outgoing
//! connection meanwhile, and the node can bind it again when it restarts.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port of the kernel's ephemeral range (32768 if unknown).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A free address on 127.0.0.1 whose port is below the ephemeral range
/// (from 10000 to 20000, or below the range if it starts lower; the
/// server's tests take 20000 and up), never handed out twice in this
/// process.
pub fn free_addr() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static GIVEN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
    let top = ephemeral_low().min(20_000);
    let low = if top > 11_000 { 10_000 } else { 1_024 };
    let span = top - low;
    // Another test binary may run beside this one: start at a place of
    // this process' own.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let port = low + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok()
        {
            given.insert(port);
            return SocketAddr::from(([127, 0, 0, 1], port as u16));
        }
    }
    panic!("no free port on 127.0.0.1 from {low} to {top}");
}

/// Sockets on this machine connected to `port` on 127.0.0.1 from the
/// dialing side (any state, TIME_WAIT included), from /proc/net/tcp.
pub fn sockets_dialing(port: u16) -> usize {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return 0;
    };
    table
        .lines()
        .skip(1)
        .filter(|l| {
            l.split_whitespace()
                .nth(2)
                .and_then(|remote| remote.split(':').nth(1))
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                == Some(port)
        })
        .count()
}

/// The id of the node that leads `nodes` (the one of the newest term: a
/// restarted leader may think it leads its old term for a moment),
/// waiting for one up to 10 s.
pub async fn leader_of<'a, I>(nodes: impl Fn() -> I) -> u64
where
    I: Iterator<Item = &'a fencelog_cluster::Node>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let newest = nodes().map(|n| n.status().term).max().unwrap_or(0);
        for node in nodes() {
            let s = node.status();
            if s.state == "leader" && s.term == newest {
                return node.id();
            }
        }
        assert!(std::time::Instant::now() < deadline, "no leader in 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
