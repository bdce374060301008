//! The commands that show the server: `CLIENT`, `INFO`, `DBSIZE`,
//! `COMMAND`, `CONFIG GET`.

use fencelog::Log;
use std::sync::Arc;

use super::parse::{err, parse_u64, quoted, upper, wrong_arity};
use super::streams;
use crate::command_table::*;
use crate::context::Context;
use crate::glob;
use crate::info;
use crate::outcome::{Outcome, number};
use crate::protocol::{ArgRef, Reply};
use crate::session::Session;

/// The introspection commands' specs, in the order `docs/COMMANDS.md`
/// lists them.
pub static SPECS: &[CommandSpec] = &[
    with_subcommands(
        cmd(
            "CLIENT",
            -2,
            &[],
            NO_KEYS,
            &["@slow"],
            "connection",
            "The connection and the other clients",
            "Depends on subcommand",
            &[],
        ),
        &[
            cmd(
                "CLIENT|ID",
                2,
                &["noscript", "loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "connection",
                "The connection's id",
                "O(1)",
                &[],
            ),
            cmd(
                "CLIENT|GETNAME",
                2,
                &["noscript", "loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "connection",
                "The connection's name, or nil",
                "O(1)",
                &[],
            ),
            cmd(
                "CLIENT|SETNAME",
                3,
                &["noscript", "loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "connection",
                "Names the connection (shown by CLIENT LIST and in log events)",
                "O(1)",
                &[string("connection-name")],
            ),
            cmd(
                "CLIENT|SETINFO",
                4,
                &["noscript", "loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "connection",
                "Notes the client library's name or version (shown by CLIENT LIST)",
                "O(1)",
                &[Arg {
                    name: "attr",
                    kind: ArgKind::OneOf(&[
                        token("LIB-NAME", string("libname")),
                        token("LIB-VER", string("libver")),
                    ]),
                    token: None,
                    optional: false,
                    multiple: false,
                }],
            ),
            cmd(
                "CLIENT|LIST",
                -2,
                &["admin", "noscript", "loading", "stale"],
                NO_KEYS,
                &["@admin", "@slow", "@dangerous", "@connection"],
                "connection",
                "One line per connected client: id, address, name, age, idle time, last command, memory",
                "O(N) in the clients",
                &[optional(token("ID", multiple(integer("client-id"))))],
            ),
            cmd(
                "CLIENT|KILL",
                -3,
                &["admin", "noscript", "loading", "stale"],
                NO_KEYS,
                &["@admin", "@slow", "@dangerous", "@connection"],
                "connection",
                "Closes connections by address or by filter; answers OK (old form) or how many were closed",
                "O(N) in the clients",
                &[Arg {
                    name: "filter",
                    kind: ArgKind::OneOf(&[
                        string("ip:port"),
                        Arg {
                            name: "new-format",
                            kind: ArgKind::OneOf(&[
                                token("ID", integer("client-id")),
                                token("ADDR", string("ip:port")),
                                token("LADDR", string("ip:port")),
                                token("USER", string("username")),
                                token("SKIPME", string("yes/no")),
                            ]),
                            token: None,
                            optional: false,
                            multiple: true,
                        },
                    ]),
                    token: None,
                    optional: false,
                    multiple: false,
                }],
            ),
        ],
    ),
    cmd(
        "INFO",
        -1,
        &["loading", "stale"],
        NO_KEYS,
        &["@slow", "@dangerous"],
        "server",
        "Counters and state, by section: server, clients, stats, log, persistence, leases, keyspace",
        "O(1)",
        &[optional(multiple(string("section")))],
    ),
    cmd(
        "DBSIZE",
        1,
        &["readonly", "fast"],
        NO_KEYS,
        &["@keyspace", "@read", "@fast"],
        "server",
        "The number of streams (those that hold records or a token)",
        "O(1)",
        &[],
    ),
    with_subcommands(
        cmd(
            "COMMAND",
            -1,
            &["loading", "stale"],
            NO_KEYS,
            &["@slow", "@connection"],
            "server",
            "Every command's name, arity, flags and keys",
            "O(N) in the commands",
            &[],
        ),
        &[
            cmd(
                "COMMAND|COUNT",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "server",
                "The number of commands",
                "O(1)",
                &[],
            ),
            cmd(
                "COMMAND|LIST",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "server",
                "The names of every command",
                "O(N) in the commands",
                &[],
            ),
            cmd(
                "COMMAND|INFO",
                -2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "server",
                "Name, arity, flags and keys of the named commands (every command without names)",
                "O(N) in the commands named",
                &[optional(multiple(string("command-name")))],
            ),
            cmd(
                "COMMAND|DOCS",
                -2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "server",
                "Summary, group and arguments of the named commands (every command without names); redis-cli builds its hints from it",
                "O(N) in the commands named",
                &[optional(multiple(string("command-name")))],
            ),
            cmd(
                "COMMAND|GETKEYS",
                -3,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@connection"],
                "server",
                "The key arguments of a whole command, by the table's key positions; cluster clients route by them",
                "O(N) in the arguments",
                &[string("command"), optional(multiple(string("arg")))],
            ),
        ],
    ),
    with_subcommands(
        cmd(
            "CONFIG",
            -2,
            &[],
            NO_KEYS,
            &["@slow"],
            "server",
            "The configuration the server runs with",
            "Depends on subcommand",
            &[],
        ),
        &[cmd(
            "CONFIG|GET",
            -3,
            &["admin", "noscript", "loading", "stale"],
            NO_KEYS,
            &["@admin", "@slow", "@dangerous"],
            "server",
            "Every setting whose name matches a glob pattern, with its value: each flag of fencelog serve, and the Redis settings tools ask for",
            "O(N) in the settings",
            &[multiple(arg("parameter", ArgKind::Pattern))],
        )],
    ),
];

/// `INFO [section …]`
pub fn info(ctx: &Context, a: &[ArgRef<'_>]) -> Outcome {
    let sections: Vec<String> = a.iter().map(|s| quoted(s).to_ascii_lowercase()).collect();
    Outcome::Reply(Reply::Verbatim(info::info_text(ctx, &sections)))
}

/// `DBSIZE`: the number of streams (a read like the stream reads);
/// `round`: see [`streams::after_round`].
pub async fn dbsize(ctx: &Arc<Context>, a: &[ArgRef<'_>], round: Option<Log>) -> Outcome {
    let empty = a.is_empty();
    let key = a.first().map(ArgRef::to_bytes).unwrap_or_default();
    streams::after_round(&*ctx.store, round, &key, false, move |log| {
        if empty {
            Outcome::Reply(number(log.metrics().streams))
        } else {
            wrong_arity("DBSIZE")
        }
    })
    .await
}

/// `COMMAND [COUNT | LIST | INFO name… | DOCS name… | GETKEYS command arg…]`,
/// from the registry.
pub fn command(a: &[ArgRef<'_>], registry: &Registry) -> Outcome {
    let Some(sub) = a.first() else {
        return Outcome::Reply(Reply::Array(
            registry.iter().map(CommandSpec::info_reply).collect(),
        ));
    };
    // The commands named (upper case), or every one.
    let named = |names: &[ArgRef<'_>]| -> Vec<Option<&'static CommandSpec>> {
        if names.is_empty() {
            registry.iter().map(Some).collect()
        } else {
            names
                .iter()
                .map(|n| registry.lookup(&String::from_utf8_lossy(n).to_ascii_uppercase()))
                .collect()
        }
    };
    let reply = match (upper(sub).as_str(), &a[1..]) {
        ("COUNT", []) => number(registry.len() as u64),
        ("LIST", []) => Reply::Array(
            registry
                .iter()
                .map(|c| Reply::text(c.lower_name()))
                .collect(),
        ),
        ("INFO", names) => Reply::Array(
            named(names)
                .into_iter()
                .map(|c| c.map_or(Reply::Null, CommandSpec::info_reply))
                .collect(),
        ),
        // Unknown names are left out, as Redis does.
        ("DOCS", names) => Reply::Map(
            named(names)
                .into_iter()
                .flatten()
                .map(|c| (Reply::text(c.lower_name()), c.docs_reply()))
                .collect(),
        ),
        ("GETKEYS", [name, ..]) => return getkeys(registry, name, &a[1..]),
        ("COUNT" | "LIST" | "GETKEYS", _) => {
            return err(format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'",
                quoted(sub)
            ));
        }
        _ => {
            return err(format!(
                "ERR unknown subcommand '{}'. Try COMMAND HELP.",
                quoted(sub)
            ));
        }
    };
    Outcome::Reply(reply)
}

/// `COMMAND GETKEYS command arg…`: the key arguments, by the spec's key
/// positions.
fn getkeys(registry: &Registry, name: &[u8], whole: &[ArgRef<'_>]) -> Outcome {
    let Some(spec) = registry.lookup(upper(name).as_str()) else {
        return err("ERR Invalid command specified");
    };
    match spec.keys_of(whole) {
        None => err("ERR Invalid number of arguments specified for command"),
        Some(keys) if keys.is_empty() => err("ERR The command has no key arguments"),
        Some(keys) => Outcome::Reply(Reply::Array(
            keys.into_iter()
                .map(|k| Reply::Bulk(k.to_bytes()))
                .collect(),
        )),
    }
}

/// `CLIENT ID | SETNAME name | GETNAME | SETINFO attr value | LIST [ID id…]
/// | KILL …`
pub fn client(a: &[ArgRef<'_>], ctx: &Context, session: &mut Session) -> Outcome {
    let Some(sub) = a.first() else {
        return wrong_arity("client");
    };
    match (upper(sub).as_str(), &a[1..]) {
        ("ID", []) => Outcome::Reply(number(session.id)),
        ("GETNAME", []) => Outcome::Reply(session.name.clone().map_or(Reply::Null, Reply::Bulk)),
        ("SETNAME", [name]) => {
            if name.iter().any(|b| !b.is_ascii_graphic()) {
                return err(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            session.name = (!name.is_empty()).then(|| name.to_bytes());
            Outcome::Reply(Reply::ok())
        }
        ("SETINFO", [attr, value]) => client_setinfo(attr, value, session),
        ("LIST", rest) => client_list(rest, ctx),
        ("KILL", rest) => client_kill(rest, ctx, session),
        _ => err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'",
            quoted(sub)
        )),
    }
}

/// `CLIENT SETINFO LIB-NAME name | LIB-VER version`
fn client_setinfo(attr: &[u8], value: &ArgRef<'_>, session: &Session) -> Outcome {
    if value.iter().any(|b| !b.is_ascii_graphic()) {
        return err(
            "ERR lib-name and lib-ver cannot contain spaces, newlines or special characters.",
        );
    }
    let r = session.registration.as_ref();
    match upper(attr).as_str() {
        "LIB-NAME" => r.map(|r| r.set_lib(Some(value.to_bytes()), None)),
        "LIB-VER" => r.map(|r| r.set_lib(None, Some(value.to_bytes()))),
        _ => return err(format!("ERR Unrecognized option '{}'", quoted(attr))),
    };
    Outcome::Reply(Reply::ok())
}

/// `CLIENT LIST [ID id…] [TYPE type]`
fn client_list(rest: &[ArgRef<'_>], ctx: &Context) -> Outcome {
    let ids = match rest {
        [] => None,
        [kw, ids @ ..] if upper(kw).as_str() == "ID" && !ids.is_empty() => {
            let mut parsed = Vec::new();
            for id in ids {
                match parse_u64(id) {
                    Some(n) => parsed.push(n),
                    None => return err("ERR Invalid client ID"),
                }
            }
            Some(parsed)
        }
        [kw, ..] if upper(kw).as_str() == "TYPE" => None,
        _ => return err("ERR syntax error"),
    };
    let text = ctx
        .registry
        .list(ids.as_deref(), |id| ctx.clients.client_bytes(id));
    Outcome::Reply(Reply::Verbatim(text))
}

/// Which clients a `CLIENT KILL` with filters closes.
struct KillFilter {
    id: Option<u64>,
    addr: Option<String>,
    laddr: Option<String>,
    user_ok: bool,
    skipme: bool,
}

/// `CLIENT KILL ip:port` (answers OK or an error) or `CLIENT KILL [ID id]
/// [ADDR ip:port] [LADDR ip:port] [USER name] [SKIPME yes|no]` (answers
/// how many were closed), as in Redis.
fn client_kill(rest: &[ArgRef<'_>], ctx: &Context, session: &Session) -> Outcome {
    if let [addr] = rest {
        let addr = String::from_utf8_lossy(addr).to_string();
        let n = ctx.registry.kill(|c| c.addr.to_string() == addr, None);
        return if n > 0 {
            Outcome::Reply(Reply::ok())
        } else {
            err("ERR No such client")
        };
    }
    let f = match kill_filter(rest) {
        Ok(f) => f,
        Err(o) => return o,
    };
    let n = ctx.registry.kill(
        |c| {
            f.user_ok
                && f.id.is_none_or(|id| c.id == id)
                && f.addr.as_ref().is_none_or(|a| c.addr.to_string() == *a)
                && f.laddr
                    .as_ref()
                    .is_none_or(|a| c.laddr.is_some_and(|l| l.to_string() == *a))
        },
        f.skipme.then_some(session.id),
    );
    Outcome::Reply(number(n as u64))
}

fn kill_filter(rest: &[ArgRef<'_>]) -> Result<KillFilter, Outcome> {
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err(err("ERR syntax error"));
    }
    let mut f = KillFilter {
        id: None,
        addr: None,
        laddr: None,
        user_ok: true,
        skipme: true,
    };
    for pair in rest.chunks(2) {
        let value = String::from_utf8_lossy(&pair[1]).to_string();
        match upper(&pair[0]).as_str() {
            "ID" => match parse_u64(&pair[1]) {
                Some(n) => f.id = Some(n),
                None => return Err(err("ERR client-id should be greater than 0")),
            },
            "ADDR" => f.addr = Some(value),
            "LADDR" => f.laddr = Some(value),
            // Every client is the default user.
            "USER" => f.user_ok = value == "default",
            "SKIPME" => match value.to_ascii_lowercase().as_str() {
                "yes" => f.skipme = true,
                "no" => f.skipme = false,
                _ => return Err(err("ERR syntax error")),
            },
            _ => return Err(err("ERR syntax error")),
        }
    }
    Ok(f)
}

/// `CONFIG GET pattern [pattern ...]`: the settings Redis tools ask about.
pub fn config(a: &[ArgRef<'_>], ctx: &Context) -> Outcome {
    let Some(sub) = a.first() else {
        return wrong_arity("config");
    };
    if upper(sub).as_str() != "GET" {
        return err(format!(
            "ERR CONFIG {} is not supported: fencelog is configured on its command line",
            quoted(sub)
        ));
    }
    if a.len() < 2 {
        return wrong_arity("config|get");
    }
    // Bounded before matching: a pattern comes from anyone who can connect.
    if a[1..].iter().any(|p| p.len() > glob::MAX_PATTERN_BYTES) {
        return err(format!(
            "ERR CONFIG GET pattern longer than {} bytes",
            glob::MAX_PATTERN_BYTES
        ));
    }
    let settings = settings(ctx);
    let mut pairs = Vec::new();
    for (name, value) in &settings {
        if a[1..]
            .iter()
            .any(|p| glob::matches(p, name.as_bytes(), true))
        {
            pairs.push((Reply::text(*name), Reply::text(value.clone())));
        }
    }
    Outcome::Reply(Reply::Map(pairs))
}

/// Every setting `CONFIG GET` answers, with the value in force.
fn settings(ctx: &Context) -> Vec<(&str, String)> {
    let c = &ctx.config;
    let mut settings: Vec<(&str, String)> = vec![
        ("appendonly", "yes".into()),
        ("appendfsync", "always".into()),
        ("save", String::new()),
        ("databases", "1".into()),
        ("maxclients", c.max_connections.to_string()),
        ("port", c.addr.port().to_string()),
        ("bind", c.addr.ip().to_string()),
        ("dir", c.dir.display().to_string()),
        ("timeout", "0".into()),
        ("maxmemory", "0".into()),
        ("proto-max-bulk-len", c.limits.max_bulk_bytes.to_string()),
        (
            "client-query-buffer-limit",
            c.max_query_buffer_bytes.to_string(),
        ),
        // Redis' format: class, hard limit, soft limit, soft seconds. Only
        // the hard limit applies here, to every client.
        (
            "client-output-buffer-limit",
            format!("normal {} 0 0", c.client_output_buffer_limit_bytes),
        ),
        ("maxmemory-clients", c.maxmemory_clients_bytes.to_string()),
        (
            "requirepass",
            // Never the password itself: it is not needed to operate.
            if c.requirepass.is_some() { "(set)" } else { "" }.into(),
        ),
    ];
    // Every flag of `fencelog serve`, under its own name, with the value
    // in force (one Redis also has is answered once, above).
    for (name, value) in &c.flags {
        if !settings.iter().any(|(n, _)| n == name) {
            settings.push((name.as_str(), value.clone()));
        }
    }
    settings
}
