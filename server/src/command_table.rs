//! What the server knows of each command, as data: its arity (checked
//! while a transaction queues), its flags and keys (`COMMAND`, `COMMAND
//! INFO`), its arguments and summary (`COMMAND DOCS`, which `redis-cli`
//! reads for its hints and `HELP`), and the syntax line `docs/COMMANDS.md`
//! shows. Each family of commands declares its specs in its own file
//! under `cmd/`, next to its code; `cmd::REGISTRY` collects them (and a
//! test there holds the document to them).

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

pub const fn arg(name: &'static str, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
    }
}

pub const fn key(name: &'static str) -> Arg {
    arg(name, ArgKind::Key)
}

pub const fn string(name: &'static str) -> Arg {
    arg(name, ArgKind::String)
}

pub const fn integer(name: &'static str) -> Arg {
    arg(name, ArgKind::Integer)
}

pub const fn optional(a: Arg) -> Arg {
    Arg {
        optional: true,
        ..a
    }
}

pub const fn multiple(a: Arg) -> Arg {
    Arg {
        multiple: true,
        ..a
    }
}

pub const fn token(t: &'static str, a: Arg) -> Arg {
    Arg {
        token: Some(t),
        ..a
    }
}

pub const fn flag(t: &'static str) -> Arg {
    Arg {
        name: t,
        kind: ArgKind::PureToken,
        token: Some(t),
        optional: true,
        multiple: false,
    }
}

pub const NO_KEYS: (i32, i32, i32) = (0, 0, 0);
pub const ONE_KEY: (i32, i32, i32) = (1, 1, 1);

// One positional field per column of the table keeps each entry a compact
// block that reads like Redis' own command table.
#[allow(clippy::too_many_arguments)]
pub const fn cmd(
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

pub const fn with_subcommands(c: CommandSpec, subcommands: &'static [CommandSpec]) -> CommandSpec {
    CommandSpec { subcommands, ..c }
}

/// The version that introduced every command here.
pub const SINCE: &str = "0.1.0";

/// Every command the server knows: each family's table (declared in its
/// file under `cmd/`, next to the code), in the order `docs/COMMANDS.md`
/// lists them.
pub struct Registry {
    families: &'static [&'static [CommandSpec]],
}

impl Registry {
    /// The registry of these families' tables.
    pub const fn new(families: &'static [&'static [CommandSpec]]) -> Registry {
        Registry { families }
    }

    /// Every command, in order.
    pub fn iter(&self) -> impl Iterator<Item = &'static CommandSpec> + '_ {
        self.families.iter().flat_map(|f| f.iter())
    }

    /// How many commands.
    pub fn len(&self) -> usize {
        self.families.iter().map(|f| f.len()).sum()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The command (or `CMD|SUB` subcommand) named `upper_name`.
    pub fn lookup(&self, upper_name: &str) -> Option<&'static CommandSpec> {
        // The plain name first: every request looks its name up, and
        // `split_once('|')` first was 4 % of a stale rejection's
        // instructions. No command's own name holds a `|`.
        if let Some(c) = self.iter().find(|c| c.name == upper_name) {
            return Some(c);
        }
        let (parent, _) = upper_name.split_once('|')?;
        self.iter()
            .find(|c| c.name == parent)?
            .subcommands
            .iter()
            .find(|c| c.name == upper_name)
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
