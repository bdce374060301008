//! Against a cluster, the bench loads its leader: every write goes there
//! (a follower answers `-MOVED`). The leader is the first node `CLUSTER
//! SLOTS` lists for the one slot range; a single node answers an error and
//! is loaded as it is.

use std::net::SocketAddr;
use std::time::Duration;

use fencelog_client::Value;

use super::{connect, request};

/// How long the cluster may take to answer with a leader (an election in
/// progress answers no range).
const WAIT_FOR_LEADER: Duration = Duration::from_secs(10);

/// The address to load: `addr`'s cluster leader, or `addr` itself when it
/// is a single node.
pub(super) async fn follow(addr: SocketAddr, password: Option<&str>) -> Result<SocketAddr, String> {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_LEADER;
    let mut conn = connect(addr, password, WAIT_FOR_LEADER).await?;
    loop {
        let reply = request(&mut conn, &[b"CLUSTER", b"SLOTS"], WAIT_FOR_LEADER).await?;
        match primary(&reply) {
            Some(Ok(found)) => {
                return tokio::net::lookup_host(found.as_str())
                    .await
                    .map_err(|e| format!("cannot resolve the leader {found}: {e}"))?
                    .next()
                    .ok_or_else(|| format!("the leader {found} resolves to no address"));
            }
            Some(Err(e)) => return Err(e),
            // A single node: cluster support is off.
            None if matches!(reply, Value::Error(_)) => return Ok(addr),
            None if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "{addr} is in a cluster with no leader after {} s: {reply:?}",
                    WAIT_FOR_LEADER.as_secs()
                ));
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The first node of the first slot range, as `host:port`; `None` when
/// there is no range (an error, or no leader yet).
fn primary(reply: &Value) -> Option<Result<String, String>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let Value::Array(range) = ranges.first()? else {
        return Some(Err(format!("CLUSTER SLOTS answered {reply:?}")));
    };
    let Some(Value::Array(node)) = range.get(2) else {
        return Some(Err(format!(
            "CLUSTER SLOTS answered a range without nodes: {reply:?}"
        )));
    };
    let text = |r: Option<&Value>| match r {
        Some(Value::Bulk(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(Value::Simple(s)) => Some(s.clone()),
        _ => None,
    };
    match (text(node.first()), node.get(1)) {
        (Some(host), Some(Value::Int(port))) => Some(Ok(if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        })),
        _ => Some(Err(format!(
            "CLUSTER SLOTS answered a node without host and port: {reply:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn bulk(s: &str) -> Value {
        Value::Bulk(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn the_first_node_of_the_range_is_the_leader() {
        let reply = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![bulk("127.0.0.12"), Value::Int(7380), bulk("n2")]),
            Value::Array(vec![bulk("127.0.0.11"), Value::Int(7379), bulk("n1")]),
        ])]);
        assert_eq!(primary(&reply), Some(Ok("127.0.0.12:7380".to_string())));
        let v6 = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![bulk("::1"), Value::Int(7380)]),
        ])]);
        assert_eq!(primary(&v6), Some(Ok("[::1]:7380".to_string())));
    }

    #[test]
    fn no_range_or_an_error_is_no_leader() {
        assert_eq!(primary(&Value::Array(vec![])), None);
        assert_eq!(
            primary(&Value::Error("ERR cluster support disabled".into())),
            None
        );
        assert!(matches!(
            primary(&Value::Array(vec![Value::Int(1)])),
            Some(Err(_))
        ));
    }
}
