//! Every command the server knows, in one table: its arity (checked while
//! a transaction queues), its flags and keys (`COMMAND`, `COMMAND INFO`),
//! its arguments and summary (`COMMAND DOCS`, which `redis-cli` reads for
//! its hints and `HELP`), and the syntax line `docs/COMMANDS.md` shows
//! (a test holds the document to this table).

use crate::protocol::Reply;

/// One command (or subcommand).
#[derive(Debug)]
pub struct CommandSpec {
    /// Upper case, as matched: `LOG.APPEND`, or `CLIENT|LIST` for a
    /// subcommand.
    pub name: &'static str,
    /// Arguments counted as Redis counts them, the name included; negative:
    /// at least that many.
    pub arity: i32,
    /// Redis' command flags (`write`, `readonly`, `fast`, …).
    pub flags: &'static [&'static str],
    /// Position of the first and last key argument and the step between
    /// keys (0, 0, 0: no key).
    pub keys: (i32, i32, i32),
    /// ACL categories, as Redis names them (`@write`, `@fast`, …).
    pub acl: &'static [&'static str],
    /// The group `redis-cli` lists it under (`HELP @log`).
    pub group: &'static str,
    /// One line on what it does.
    pub summary: &'static str,
    /// How its cost grows.
    pub complexity: &'static str,
    /// Its arguments after the name (after the subcommand's name for a
    /// subcommand).
    pub args: &'static [Arg],
    /// Its subcommands (`CLIENT LIST`, `CONFIG GET`, …).
    pub subcommands: &'static [CommandSpec],
}

/// One argument, as `COMMAND DOCS` describes it.
#[derive(Debug)]
pub struct Arg {
    /// Its name in the syntax line.
    pub name: &'static str,
    /// How it is typed.
    pub kind: ArgKind,
    /// A keyword before it (`COUNT` in `[COUNT count]`).
    pub token: Option<&'static str>,
    /// May be left out.
    pub optional: bool,
    /// May be given several times.
    pub multiple: bool,
}

/// The type of an [`Arg`] (Redis' names: `key`, `string`, `integer`,
/// `pure-token`, `oneof`, `block`).
#[derive(Debug)]
pub enum ArgKind {
    /// A stream or lease name.
    Key,
    /// Any bytes.
    String,
    /// A decimal integer.
    Integer,
    /// A glob pattern.
    Pattern,
    /// The keyword alone.
    PureToken,
    /// One of these.
    OneOf(&'static [Arg]),
    /// These together.
    Block(&'static [Arg]),
}

impl ArgKind {
    fn name(&self) -> &'static str {
        match self {
            ArgKind::Key => "key",
            ArgKind::String => "string",
            ArgKind::Integer => "integer",
            ArgKind::Pattern => "pattern",
            ArgKind::PureToken => "pure-token",
            ArgKind::OneOf(_) => "oneof",
            ArgKind::Block(_) => "block",
        }
    }
}

const fn arg(name: &'static str, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
    }
}

const fn key(name: &'static str) -> Arg {
    arg(name, ArgKind::Key)
}

const fn string(name: &'static str) -> Arg {
    arg(name, ArgKind::String)
}

const fn integer(name: &'static str) -> Arg {
    arg(name, ArgKind::Integer)
}

const fn optional(a: Arg) -> Arg {
    Arg {
        optional: true,
        ..a
    }
}

const fn multiple(a: Arg) -> Arg {
    Arg {
        multiple: true,
        ..a
    }
}

const fn token(t: &'static str, a: Arg) -> Arg {
    Arg {
        token: Some(t),
        ..a
    }
}

const fn flag(t: &'static str) -> Arg {
    Arg {
        name: t,
        kind: ArgKind::PureToken,
        token: Some(t),
        optional: true,
        multiple: false,
    }
}

const NO_KEYS: (i32, i32, i32) = (0, 0, 0);
const ONE_KEY: (i32, i32, i32) = (1, 1, 1);

// One positional field per column of the table keeps each entry a compact
// block that reads like Redis' own command table.
#[allow(clippy::too_many_arguments)]
const fn cmd(
    name: &'static str,
    arity: i32,
    flags: &'static [&'static str],
    keys: (i32, i32, i32),
    acl: &'static [&'static str],
    group: &'static str,
    summary: &'static str,
    complexity: &'static str,
    args: &'static [Arg],
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        keys,
        acl,
        group,
        summary,
        complexity,
        args,
        subcommands: &[],
    }
}

const fn with_subcommands(c: CommandSpec, subcommands: &'static [CommandSpec]) -> CommandSpec {
    CommandSpec { subcommands, ..c }
}

/// The version that introduced every command here.
pub const SINCE: &str = "0.1.0";

/// Every command, in the order `docs/COMMANDS.md` lists them.
pub static COMMANDS: &[CommandSpec] = &[
    // Streams.
    cmd(
        "LOG.APPEND",
        -4,
        &["write", "denyoom"],
        ONE_KEY,
        &["@write", "@stream"],
        "log",
        "Appends records to a stream if the token is not below its highest; answers the first record's offset",
        "O(N) in the payload bytes",
        &[key("stream"), integer("token"), multiple(string("payload"))],
    ),
    cmd(
        "LOG.APPENDAT",
        -5,
        &["write", "denyoom"],
        ONE_KEY,
        &["@write", "@stream"],
        "log",
        "Appends records only at the expected offset (an exact retry answers the original offset); answers the first offset",
        "O(N) in the payload bytes",
        &[
            key("stream"),
            integer("token"),
            integer("expected_offset"),
            multiple(string("payload")),
        ],
    ),
    cmd(
        "LOG.FENCE",
        3,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@stream", "@fast"],
        "log",
        "Raises a stream's highest token without writing a record; answers the highest token",
        "O(1)",
        &[key("stream"), integer("token")],
    ),
    cmd(
        "LOG.READ",
        -3,
        &["readonly", "blocking"],
        ONE_KEY,
        &["@read", "@stream", "@blocking"],
        "log",
        "Reads durable records from an offset on: [offset, token, payload] each",
        "O(N) in the records answered",
        &[
            key("stream"),
            integer("from"),
            optional(token("COUNT", integer("count"))),
            optional(token("BLOCK", integer("milliseconds"))),
        ],
    ),
    cmd(
        "LOG.TRIM",
        4,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@stream", "@fast"],
        "log",
        "Makes the records below an offset unreadable and their space reclaimable; answers the new start offset",
        "O(1)",
        &[key("stream"), integer("token"), integer("before")],
    ),
    cmd(
        "LOG.DELETE",
        3,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@stream", "@fast"],
        "log",
        "Removes every record of a stream; its highest token and next offset stay forever. Answers the records removed",
        "O(1)",
        &[key("stream"), integer("token")],
    ),
    cmd(
        "LOG.STAT",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@read", "@stream", "@fast"],
        "log",
        "A stream's highest token, next offset, start offset, records and bytes",
        "O(1)",
        &[key("stream")],
    ),
    cmd(
        "LOG.STREAMS",
        -1,
        &["readonly"],
        NO_KEYS,
        &["@read", "@stream", "@slow"],
        "log",
        "The names of the streams that hold records or a token, in byte order, a page at a time (at most 10000)",
        "O(log(N) + M) with M the names answered",
        &[
            optional(token("AFTER", string("name"))),
            optional(token("COUNT", integer("count"))),
        ],
    ),
    // Leases.
    cmd(
        "LEASE.ACQUIRE",
        -4,
        &["write", "blocking"],
        ONE_KEY,
        &["@write", "@blocking"],
        "lease",
        "Grants a lease with a fresh fencing token (optionally fencing the stream of the same name); answers [token, ttl_ms]",
        "O(1)",
        &[
            key("name"),
            string("owner"),
            integer("ttl_ms"),
            flag("FENCE"),
            optional(token("WAIT", integer("milliseconds"))),
        ],
    ),
    cmd(
        "LEASE.RENEW",
        5,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@fast"],
        "lease",
        "Extends a live lease held by this owner and token; answers the ttl in ms",
        "O(1)",
        &[
            key("name"),
            string("owner"),
            integer("token"),
            integer("ttl_ms"),
        ],
    ),
    cmd(
        "LEASE.RELEASE",
        4,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@fast"],
        "lease",
        "Releases a lease held by this owner and token; answers 1 if released, 0 if not held",
        "O(1)",
        &[key("name"), string("owner"), integer("token")],
    ),
    cmd(
        "LEASE.INFO",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@read", "@fast"],
        "lease",
        "The holder of a live lease: [owner, token, remaining_ms], or nil",
        "O(1)",
        &[key("name")],
    ),
    // Transactions.
    cmd(
        "MULTI",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NO_KEYS,
        &["@fast", "@transaction"],
        "transactions",
        "Starts a transaction: commands are queued until EXEC",
        "O(1)",
        &[],
    ),
    cmd(
        "EXEC",
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        NO_KEYS,
        &["@slow", "@transaction"],
        "transactions",
        "Runs the queued commands; their writes reach the log as one durable entry, all or none",
        "O(N) in the queued commands",
        &[],
    ),
    cmd(
        "DISCARD",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NO_KEYS,
        &["@fast", "@transaction"],
        "transactions",
        "Forgets the queued commands",
        "O(N) in the queued commands",
        &[],
    ),
    cmd(
        "WATCH",
        -2,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        (1, -1, 1),
        &["@fast", "@transaction"],
        "transactions",
        "Not supported: answers an error, so that no client believes it holds a watch",
        "O(1)",
        &[multiple(key("key"))],
    ),
    cmd(
        "UNWATCH",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NO_KEYS,
        &["@fast", "@transaction"],
        "transactions",
        "Answers OK: nothing is ever watched",
        "O(1)",
        &[],
    ),
    // Connection.
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
        &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
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
        &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
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
        &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
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
    // Server.
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
    with_subcommands(
        cmd(
            "CLUSTER",
            -2,
            &[],
            NO_KEYS,
            &["@slow"],
            "cluster",
            "The cluster: its slots, nodes and Raft state, and membership changes (a single node answers that cluster support is disabled)",
            "Depends on subcommand",
            &[],
        ),
        &[
            cmd(
                "CLUSTER|SLOTS",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The slot ranges and the nodes serving them (one group owns all 16384 slots; the leader first)",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|SHARDS",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The shard: every slot, and every node with its role and replication offset",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|NODES",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "Every node in Redis' line format",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|INFO",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The cluster's state, and this node's Raft state: term, leader, log, commit and applied indexes, lag per replica",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|MYID",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "This node's id (40 hex digits)",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|KEYSLOT",
                3,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The hash slot of a key",
                "O(N) where N is the number of nodes",
                &[string("key")],
            ),
            cmd(
                "CLUSTER|ADDNODE",
                5,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@admin", "@dangerous"],
                "cluster",
                "Adds a node: a learner until it has caught up, then a voter (on the leader)",
                "O(N) where N is the number of nodes",
                &[
                    integer("node_id"),
                    string("raft_addr"),
                    string("client_addr"),
                ],
            ),
            cmd(
                "CLUSTER|REMOVENODE",
                3,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@admin", "@dangerous"],
                "cluster",
                "Removes a node from the cluster (on the leader)",
                "O(N) where N is the number of nodes",
                &[integer("node_id")],
            ),
        ],
    ),
    cmd(
        "READONLY",
        1,
        &["loading", "stale", "fast"],
        NO_KEYS,
        &["@fast", "@connection"],
        "cluster",
        "Accepted for cluster clients; reads are always served by the leader",
        "O(1)",
        &[],
    ),
    cmd(
        "READWRITE",
        1,
        &["loading", "stale", "fast"],
        NO_KEYS,
        &["@fast", "@connection"],
        "cluster",
        "Accepted for cluster clients (the default)",
        "O(1)",
        &[],
    ),
    cmd(
        "ASKING",
        1,
        &["fast"],
        NO_KEYS,
        &["@fast", "@connection"],
        "cluster",
        "Accepted for cluster clients (no slot ever migrates)",
        "O(1)",
        &[],
    ),
];

/// The command (or `CMD|SUB` subcommand) named `upper_name`.
pub fn lookup(upper_name: &str) -> Option<&'static CommandSpec> {
    match upper_name.split_once('|') {
        None => COMMANDS.iter().find(|c| c.name == upper_name),
        Some((parent, _)) => COMMANDS
            .iter()
            .find(|c| c.name == parent)?
            .subcommands
            .iter()
            .find(|c| c.name == upper_name),
    }
}

impl CommandSpec {
    /// Whether `n` arguments (the name included) fit the arity.
    pub fn arity_fits(&self, n: usize) -> bool {
        if self.arity >= 0 {
            n == self.arity as usize
        } else {
            n >= self.arity.unsigned_abs() as usize
        }
    }

    /// The name as Redis answers it: lower case (`client|list`).
    pub fn lower_name(&self) -> String {
        self.name.to_ascii_lowercase()
    }

    /// The syntax line: `LOG.READ stream from [COUNT count] [BLOCK
    /// milliseconds]`, built as `redis-cli` builds its hints.
    pub fn syntax(&self) -> String {
        let name = self.name.replace('|', " ");
        let params = self
            .args
            .iter()
            .map(arg_syntax)
            .collect::<Vec<_>>()
            .join(" ");
        if params.is_empty() {
            name
        } else {
            format!("{name} {params}")
        }
    }

    /// The key arguments of a whole command (`args[0]` is its name), at
    /// the positions `keys` gives (`COMMAND GETKEYS`): `None` if `args`
    /// do not fit the arity, empty if the command has no key.
    pub fn keys_of<'a, T>(&self, args: &'a [T]) -> Option<Vec<&'a T>> {
        if !self.arity_fits(args.len()) {
            return None;
        }
        let (first, last, step) = self.keys;
        if first <= 0 || step <= 0 {
            return Some(Vec::new());
        }
        let n = i64::try_from(args.len()).unwrap_or(i64::MAX);
        let last = if last < 0 {
            n + i64::from(last)
        } else {
            i64::from(last)
        };
        let last = last.min(n - 1);
        let mut keys = Vec::new();
        let mut at = i64::from(first);
        while at <= last {
            keys.push(&args[usize::try_from(at).ok()?]);
            at += i64::from(step);
        }
        Some(keys)
    }

    /// `COMMAND INFO`'s entry: name, arity, flags, first key, last key,
    /// step, ACL categories, tips, key specs, subcommands.
    pub fn info_reply(&self) -> Reply {
        let statuses =
            |v: &[&str]| Reply::Array(v.iter().map(|s| Reply::Simple((*s).into())).collect());
        Reply::Array(vec![
            Reply::text(self.lower_name()),
            Reply::Integer(i64::from(self.arity)),
            statuses(self.flags),
            Reply::Integer(i64::from(self.keys.0)),
            Reply::Integer(i64::from(self.keys.1)),
            Reply::Integer(i64::from(self.keys.2)),
            statuses(self.acl),
            Reply::Array(Vec::new()),
            Reply::Array(Vec::new()),
            Reply::Array(
                self.subcommands
                    .iter()
                    .map(CommandSpec::info_reply)
                    .collect(),
            ),
        ])
    }

    /// `COMMAND DOCS`'s entry: summary, since, group, complexity,
    /// arguments, subcommands.
    pub fn docs_reply(&self) -> Reply {
        let mut fields = vec![
            (Reply::text("summary"), Reply::text(self.summary)),
            (Reply::text("since"), Reply::text(SINCE)),
            (Reply::text("group"), Reply::text(self.group)),
            (Reply::text("complexity"), Reply::text(self.complexity)),
        ];
        if !self.args.is_empty() {
            fields.push((
                Reply::text("arguments"),
                Reply::Array(self.args.iter().map(arg_docs).collect()),
            ));
        }
        if !self.subcommands.is_empty() {
            fields.push((
                Reply::text("subcommands"),
                Reply::Map(
                    self.subcommands
                        .iter()
                        .map(|s| (Reply::text(s.lower_name()), s.docs_reply()))
                        .collect(),
                ),
            ));
        }
        Reply::Map(fields)
    }
}

fn arg_docs(a: &Arg) -> Reply {
    let mut fields = vec![
        (
            Reply::text("name"),
            Reply::text(a.name.to_ascii_lowercase()),
        ),
        (Reply::text("type"), Reply::text(a.kind.name())),
    ];
    if let Some(t) = a.token {
        fields.push((Reply::text("token"), Reply::text(t)));
    }
    let mut flags = Vec::new();
    if a.optional {
        flags.push(Reply::Simple("optional".into()));
    }
    if a.multiple {
        flags.push(Reply::Simple("multiple".into()));
    }
    if !flags.is_empty() {
        fields.push((Reply::text("flags"), Reply::Array(flags)));
    }
    if let ArgKind::OneOf(args) | ArgKind::Block(args) = &a.kind {
        fields.push((
            Reply::text("arguments"),
            Reply::Array(args.iter().map(arg_docs).collect()),
        ));
    }
    Reply::Map(fields)
}

/// An argument's part of the syntax line, as `redis-cli` writes it.
fn arg_syntax(a: &Arg) -> String {
    let repeat = match &a.kind {
        ArgKind::PureToken => String::new(),
        ArgKind::OneOf(args) => args.iter().map(arg_syntax).collect::<Vec<_>>().join("|"),
        ArgKind::Block(args) => args.iter().map(arg_syntax).collect::<Vec<_>>().join(" "),
        _ => a.name.to_string(),
    };
    let mut token = a.token.unwrap_or("").to_string();
    if !token.is_empty() && !matches!(a.kind, ArgKind::PureToken) {
        token.push(' ');
    }
    let mut s = String::new();
    if a.optional {
        s.push('[');
    }
    s.push_str(&token);
    s.push_str(&repeat);
    if a.multiple {
        s.push_str(&format!(" [{repeat} ...]"));
    }
    if a.optional {
        s.push(']');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_lines_read_as_redis_writes_them() {
        let s = |n| lookup(n).unwrap().syntax();
        assert_eq!(
            s("LOG.APPEND"),
            "LOG.APPEND stream token payload [payload ...]"
        );
        assert_eq!(
            s("LOG.READ"),
            "LOG.READ stream from [COUNT count] [BLOCK milliseconds]"
        );
        assert_eq!(
            s("LEASE.ACQUIRE"),
            "LEASE.ACQUIRE name owner ttl_ms [FENCE] [WAIT milliseconds]"
        );
        assert_eq!(s("CONFIG|GET"), "CONFIG GET parameter [parameter ...]");
    }

    /// What `COMMAND GETKEYS` answers, and so where a cluster client
    /// that asks sends each command: the stream or lease name.
    #[test]
    fn keys_are_the_stream_or_lease_name() {
        let keys = |line: &'static str| -> Option<Vec<&'static str>> {
            let args: Vec<&'static str> = line.split(' ').collect();
            lookup(&args[0].to_ascii_uppercase())
                .unwrap()
                .keys_of(&args)
                .map(|k| k.into_iter().copied().collect())
        };
        assert_eq!(keys("LOG.APPEND jobs 7 a b c"), Some(vec!["jobs"]));
        assert_eq!(keys("LOG.APPENDAT jobs 7 0 a"), Some(vec!["jobs"]));
        assert_eq!(keys("LOG.READ jobs 0 COUNT 5"), Some(vec!["jobs"]));
        assert_eq!(keys("LEASE.ACQUIRE jobs w 1000 FENCE"), Some(vec!["jobs"]));
        assert_eq!(keys("LEASE.RELEASE jobs w 3"), Some(vec!["jobs"]));
        assert_eq!(keys("LOG.STREAMS"), Some(vec![]));
        assert_eq!(keys("LOG.APPEND jobs 7"), None, "too few arguments");
        assert_eq!(keys("LOG.STAT jobs more"), None, "too many arguments");
        // A negative last key counts from the end.
        assert_eq!(keys("WATCH a b"), Some(vec!["a", "b"]));
        // Every stream and lease command names one key, its first
        // argument: a cluster client that takes the first argument as the
        // key (the `redis` crate does, for commands it does not know)
        // routes alike.
        for c in COMMANDS
            .iter()
            .filter(|c| c.name.starts_with("LOG.") || c.name.starts_with("LEASE."))
        {
            assert!(
                c.keys == NO_KEYS || c.keys == ONE_KEY,
                "{} has keys {:?}",
                c.name,
                c.keys
            );
        }
    }

    /// docs/COMMANDS.md documents every command of this table, with the
    /// syntax line the table (and so redis-cli's hints) gives.
    #[test]
    fn the_command_reference_matches_the_table() {
        let doc = include_str!("../../docs/COMMANDS.md");
        let mut all: Vec<&CommandSpec> = Vec::new();
        for c in COMMANDS {
            if c.subcommands.is_empty() || c.name == "COMMAND" {
                all.push(c);
            }
            all.extend(c.subcommands.iter());
        }
        for c in all {
            let heading = format!("### {}\n", c.name.replace('|', " "));
            assert!(doc.contains(&heading), "no section {heading:?}");
            let syntax = format!("```text\n{}\n```", c.syntax());
            assert!(
                doc.contains(&syntax),
                "{} is not documented as {syntax}",
                c.name
            );
        }
    }

    #[test]
    fn names_fit_the_matcher_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for c in COMMANDS {
            assert!(c.name.len() <= 24, "{}", c.name);
            assert!(seen.insert(c.name), "{} twice", c.name);
            assert_eq!(c.name, c.name.to_ascii_uppercase());
            for sub in c.subcommands {
                assert!(
                    sub.name.starts_with(&format!("{}|", c.name)),
                    "{}",
                    sub.name
                );
            }
        }
    }
}
