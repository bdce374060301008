//! `--driver threads`: one OS thread per connection on a blocking std
//! socket, the way many single-connection client processes load a server.
//! The same plan, pacing, counting and requests as the event-loop driver;
//! only how a batch is written and its replies read differs. The load
//! generator's threads then compete with the server's for the cores, which
//! the event-loop driver's one runtime does not show.

use std::net::SocketAddr;
use std::sync::Arc;

use fencelog_client::Request;
use fencelog_client::blocking::Pipeline;

use super::{Client, ClientStats, Dialect, Plan, Window, client_config, requests_of};

/// Connects `plan.clients` blocking pipelines (before the clock runs), off
/// the runtime's threads.
pub(super) async fn connect_all(
    addr: SocketAddr,
    password: &Option<String>,
    plan: &Plan,
) -> Result<Vec<Pipeline>, String> {
    let config = client_config(addr, password.as_deref(), plan.timeout);
    let clients = plan.clients;
    let has_password = password.is_some();
    tokio::task::spawn_blocking(move || {
        (0..clients)
            .map(|_| {
                Pipeline::connect(&addr.to_string(), &config).map_err(|e| match e {
                    fencelog_client::Error::Io(_) => format!("cannot connect to {addr}: {e}"),
                    e if has_password => format!("AUTH failed: {e}"),
                    e => format!("cannot connect to {addr}: {e}"),
                })
            })
            .collect()
    })
    .await
    .map_err(|e| format!("the connecting thread failed: {e}"))?
}

/// Runs one thread per connection to the end of the window and adds up
/// their counts.
pub(super) async fn run(
    conns: Vec<Pipeline>,
    plan: &Arc<Plan>,
    dialect: Dialect,
    window: Window,
) -> ClientStats {
    let mut stats = ClientStats::default();
    let mut handles = Vec::with_capacity(conns.len());
    for (i, conn) in (0..plan.clients).zip(conns) {
        let client = Client::new(plan, i, window);
        let (valid, stale) = requests_of(plan, dialect, i);
        let pipeline = plan.pipeline as usize;
        let spawned = std::thread::Builder::new()
            .name(format!("bench-client-{i}"))
            .spawn(move || client_thread(conn, client, pipeline, dialect, valid, stale));
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => stats.unexpected(format!("cannot start a client thread: {e}")),
        }
    }
    // Joining blocks: off the runtime's threads, which the monitor uses.
    let joined = tokio::task::spawn_blocking(move || {
        let mut all = ClientStats::default();
        for h in handles {
            match h.join() {
                Ok(s) => all.merge(s),
                Err(_) => all.unexpected("a client thread panicked"),
            }
        }
        all
    })
    .await;
    match joined {
        Ok(s) => stats.merge(s),
        Err(e) => stats.unexpected(format!("joining the client threads failed: {e}")),
    }
    stats
}

/// One client: sends a batch, waits for its answers, until the window
/// ends. A read or write that waits past `--timeout` fails the client.
fn client_thread(
    mut conn: Pipeline,
    mut c: Client,
    pipeline: usize,
    dialect: Dialect,
    valid: Request,
    stale: Request,
) -> ClientStats {
    let mut kinds = Vec::with_capacity(pipeline);
    while let Some(batch) = c.next_batch() {
        let batch = c.start_batch(batch, &mut kinds, |meant_stale| {
            conn.queue_request(if meant_stale { &stale } else { &valid });
        });
        if let Err(e) = conn.exchange(c.judge(&batch, &kinds, dialect)) {
            c.stats.unexpected(format!("connection: {e}"));
            break;
        }
    }
    c.stats
}
