//! The connection commands: `PING`, `ECHO`, `QUIT`, `AUTH`, `HELLO`,
//! `SELECT`. They answer from the session and the configuration alone.

use bytes::Bytes;

use super::parse::{err, parse_u64, upper, wrong_arity};
use crate::command_table::*;
use crate::context::Context;
use crate::logging::name_field;
use crate::outcome::{Outcome, number};
use crate::protocol::{ArgRef, Reply};
use crate::session::Session;

/// The flags of a command a client may send before it authenticates (and
/// while the server is loading or busy), as Redis flags `QUIT`, `AUTH` and
/// `HELLO`.
const PRE_AUTH_FLAGS: &[&str] = &[
    "noscript",
    "loading",
    "stale",
    "fast",
    "no_auth",
    "allow_busy",
];

/// The connection commands' specs, in the order `docs/COMMANDS.md` lists
/// them.
pub static SPECS: &[CommandSpec] = &[
    cmd(
        "PING",
        -1,
        &["fast", "stale"],
        NO_KEYS,
        &["@fast", "@connection"],
        "connection",
        "Answers PONG, or the message",
        "O(1)",
        &[optional(string("message"))],
    ),
    cmd(
        "ECHO",
        2,
        &["fast", "stale"],
        NO_KEYS,
        &["@fast", "@connection"],
        "connection",
        "Answers the message",
        "O(1)",
        &[string("message")],
    ),
    cmd(
        "QUIT",
        -1,
        PRE_AUTH_FLAGS,
        NO_KEYS,
        &["@fast", "@connection"],
        "connection",
        "Answers OK and closes the connection",
        "O(1)",
        &[],
    ),
    cmd(
        "AUTH",
        -2,
        PRE_AUTH_FLAGS,
        NO_KEYS,
        &["@fast", "@connection"],
        "connection",
        "Authenticates the connection (the user, if given, must be default)",
        "O(N) in the password's length",
        &[optional(string("username")), string("password")],
    ),
    cmd(
        "HELLO",
        -1,
        PRE_AUTH_FLAGS,
        NO_KEYS,
        &["@fast", "@connection"],
        "connection",
        "Switches the protocol (2 or 3), optionally authenticating and naming the connection; answers the server's properties",
        "O(1)",
        &[optional(Arg {
            name: "arguments",
            kind: ArgKind::Block(&[
                integer("protover"),
                optional(Arg {
                    name: "auth",
                    kind: ArgKind::Block(&[string("username"), string("password")]),
                    token: Some("AUTH"),
                    optional: false,
                    multiple: false,
                }),
                optional(token("SETNAME", string("clientname"))),
            ]),
            token: None,
            optional: false,
            multiple: false,
        })],
    ),
    cmd(
        "SELECT",
        2,
        &["loading", "stale", "fast"],
        NO_KEYS,
        &["@fast", "@connection"],
        "connection",
        "Selects database 0, the only one",
        "O(1)",
        &[integer("index")],
    ),
];

/// Commands allowed before authentication.
pub fn allowed_unauthenticated(cmd: &str) -> bool {
    matches!(cmd, "AUTH" | "HELLO" | "QUIT")
}

/// `PING [message]`
pub fn ping(a: &[ArgRef<'_>]) -> Outcome {
    match a {
        [] => Outcome::Reply(Reply::Simple("PONG".into())),
        [message] => Outcome::Reply(Reply::Bulk(message.to_bytes())),
        _ => wrong_arity("PING"),
    }
}

/// `ECHO message`
pub fn echo(a: &[ArgRef<'_>]) -> Outcome {
    match a {
        [message] => Outcome::Reply(Reply::Bulk(message.to_bytes())),
        _ => wrong_arity("ECHO"),
    }
}

/// `QUIT`: OK, then the connection closes.
pub fn quit() -> Outcome {
    Outcome::Close(Reply::ok())
}

/// `SELECT 0`: the only database.
pub fn select(a: &[ArgRef<'_>]) -> Outcome {
    match a {
        [index] if &index[..] == b"0" => Outcome::Reply(Reply::ok()),
        [_] => err("ERR DB index is out of range"),
        _ => wrong_arity("SELECT"),
    }
}

fn check_password(ctx: &Context, user: Option<&[u8]>, password: &[u8]) -> bool {
    match &ctx.config.requirepass {
        Some(pass) => {
            user.is_none_or(|u| u == b"default") && constant_time_eq(pass.as_bytes(), password)
        }
        None => false,
    }
}

/// Compares without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Logs an `auth_failed` event: who, with which user name; never the
/// password.
fn auth_failed(session: &Session, command: &str, user: Option<&[u8]>) {
    let client = session.tag();
    tracing::warn!(
        event = "auth_failed",
        command,
        user = %user.map(name_field).unwrap_or_else(|| "default".into()),
        client_addr = %client.addr,
        client_name = %client.name_field(),
        "authentication failed"
    );
}

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// `AUTH [user] password`
pub fn auth(a: &[ArgRef<'_>], ctx: &Context, session: &mut Session) -> Outcome {
    let (user, password) = match a {
        [p] => (None, p),
        [u, p] => (Some(&u[..]), p),
        _ => return wrong_arity("AUTH"),
    };
    if ctx.config.requirepass.is_none() {
        return err(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        );
    }
    if check_password(ctx, user, password) {
        session.authenticated = true;
        Outcome::Reply(Reply::ok())
    } else {
        auth_failed(session, "AUTH", user);
        err(WRONGPASS)
    }
}

/// What `HELLO` asks besides the protocol.
struct HelloOptions {
    name: Option<Bytes>,
    authed: bool,
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`
pub fn hello(a: &[ArgRef<'_>], ctx: &Context, session: &mut Session) -> Outcome {
    let mut proto = session.proto;
    let mut rest = a;
    if let [v, tail @ ..] = rest {
        match parse_u64(v) {
            Some(2) => proto = 2,
            Some(3) => proto = 3,
            Some(_) => return err("NOPROTO unsupported protocol version"),
            None => return err("ERR Protocol version is not an integer or out of range"),
        }
        rest = tail;
    }
    let options = match hello_options(rest, ctx, session) {
        Ok(options) => options,
        Err(o) => return o,
    };
    if ctx.config.requirepass.is_some() && !options.authed {
        return err(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time",
        );
    }
    session.authenticated = options.authed;
    session.proto = proto;
    if let Some(n) = options.name {
        session.name = Some(n);
    }
    debug_assert!(session.proto == 2 || session.proto == 3);
    Outcome::Reply(Reply::Map(vec![
        (Reply::text("server"), Reply::text("fencelog")),
        (
            Reply::text("version"),
            Reply::text(env!("CARGO_PKG_VERSION")),
        ),
        (Reply::text("proto"), Reply::Integer(i64::from(proto))),
        (Reply::text("id"), number(session.id)),
        (Reply::text("mode"), Reply::text("standalone")),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("modules"), Reply::Array(Vec::new())),
    ]))
}

/// `HELLO`'s `AUTH user pass` and `SETNAME name`.
fn hello_options(
    mut rest: &[ArgRef<'_>],
    ctx: &Context,
    session: &Session,
) -> Result<HelloOptions, Outcome> {
    let mut options = HelloOptions {
        name: None,
        authed: session.authenticated,
    };
    while let [opt, tail @ ..] = rest {
        match (upper(opt).as_str(), tail) {
            ("AUTH", [user, pass, tail @ ..]) => {
                // Without a password the default user needs none, as in Redis.
                let ok = match ctx.config.requirepass {
                    None => &user[..] == b"default",
                    Some(_) => check_password(ctx, Some(user), pass),
                };
                if !ok {
                    auth_failed(session, "HELLO", Some(user));
                    return Err(err(WRONGPASS));
                }
                options.authed = true;
                rest = tail;
            }
            ("SETNAME", [n, tail @ ..]) => {
                options.name = Some(n.to_bytes());
                rest = tail;
            }
            _ => return Err(err("ERR Syntax error in HELLO option")),
        }
    }
    Ok(options)
}
