//! The Eddy dialect: splits a query string into statements and parses each one.
//!
//! Standard statements (INSERT, COPY, SELECT, SET, transactions) are parsed by sqlparser;
//! Eddy's own (CREATE STREAM/METRIC, DROP, SHOW, DESCRIBE, EXPLAIN) are recognised from
//! their leading keywords. The `WINDOW` clause of CREATE METRIC is cut out of the token
//! stream before the remaining SELECT goes to sqlparser.

use datafusion::sql::sqlparser::ast::{self, Ident, ObjectName, ObjectNamePart};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Whitespace};

use crate::access::{AccessStatement, Privilege, RoleOptions, Target};
use crate::error::{Error, Result};
use crate::types::parse_duration_us;
use crate::window::WindowSpec;

/// One parsed statement, not yet bound to a catalog.
#[derive(Debug, Clone)]
pub enum Statement {
    CreateStream {
        create: Box<ast::CreateTable>,
        sql: String,
    },
    CreateMetric(Box<MetricAst>),
    DropStream {
        name: String,
        if_exists: bool,
        cascade: bool,
    },
    DropMetric {
        name: String,
        if_exists: bool,
    },
    /// `ALTER STREAM name ADD [COLUMN] column type`.
    AlterStreamAddColumn {
        stream: String,
        column: String,
        /// The type as written.
        ty: String,
    },
    ShowStreams,
    ShowMetrics,
    Describe(String),
    /// `EXPLAIN STREAM s [(FORMAT text | dot)]`: `true` for Graphviz dot.
    ExplainStream(String, bool),
    ExplainMetric(String, bool),
    Insert(Box<ast::Insert>),
    Copy(Box<ast::Statement>),
    /// A query for DataFusion, as text.
    Query(String),
    /// `SELECT … EMIT CHANGES`: the query without `EMIT CHANGES`.
    Subscribe(String),
    /// `COPY (query) TO STDOUT` or `COPY name TO STDOUT`.
    CopyOut(CopyOut),
    /// `DECLARE name CURSOR FOR query`.
    Declare {
        name: String,
        query: String,
        subscribe: bool,
    },
    /// `FETCH [FORWARD] [n | ALL] [FROM] name [WITH (timeout = '…')]`.
    Fetch(Fetch),
    /// `CLOSE name`, or `CLOSE ALL` (`None`).
    Close(Option<String>),
    ShowSubscriptions,
    ShowStorage,
    /// `CHECKPOINT`: takes a checkpoint now (superusers).
    Checkpoint,
    /// `BACKUP TO '/dir'`: a consistent copy of the node's data (superusers).
    Backup(String),
    /// `SHOW CLUSTER`: the nodes.
    ShowCluster,
    /// `SHOW TASKS`: where each task runs.
    ShowTasks,
    /// `SHOW SHARDS`: each shard's place on the machine, tasks, events and queue.
    ShowShards,
    /// Session settings Eddy accepts and ignores (`RESET`, `DISCARD`, …).
    Set,
    /// `SET [SESSION] name = value` or `SET name TO value`.
    SetVariable {
        name: String,
        value: String,
    },
    /// `SHOW name` of a runtime parameter.
    ShowVariable(String),
    /// `RESET name`, `SET name TO DEFAULT` (`Some`), or `RESET ALL` (`None`).
    Reset(Option<String>),
    /// `ALTER SYSTEM SET name = value` (`value`: `None` for `DEFAULT`), or `ALTER SYSTEM
    /// RESET name` (`None`), or `ALTER SYSTEM RESET ALL` (name `all`).
    AlterSystem {
        name: String,
        value: Option<String>,
    },
    /// Roles and privileges: `CREATE|ALTER|DROP ROLE`, `GRANT`, `REVOKE`, `ALTER … OWNER TO`.
    Access(crate::access::AccessStatement),
    /// `PREPARE name [(type, …)] AS statement`: the types as written, the statement as
    /// text with its `$n`.
    Prepare {
        name: String,
        types: Vec<String>,
        body: String,
    },
    /// `EXECUTE name [(value, …)]`: each value as SQL text.
    Execute {
        name: String,
        args: Vec<String>,
    },
    /// `DEALLOCATE [PREPARE] name`, or `DEALLOCATE [PREPARE] ALL` (`None`).
    Deallocate(Option<String>),
    Begin,
    Commit,
    Rollback,
    Empty,
}

/// `COPY … TO STDOUT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyOut {
    pub query: String,
    /// The query ends in `EMIT CHANGES`: the COPY never ends on its own.
    pub subscribe: bool,
    pub csv: bool,
    pub header: bool,
    pub delimiter: char,
    pub null: String,
}

/// `FETCH`: how many rows (`None`: all that are ready) and how long to wait for the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub cursor: String,
    pub count: Option<u64>,
    /// With `WITH (timeout = '…')`: return what is there when it passes, even nothing.
    pub timeout_us: Option<i64>,
}

/// `CREATE METRIC name AS SELECT … FROM stream WINDOW … [WHERE …] [GROUP BY …]`.
#[derive(Debug, Clone)]
pub struct MetricAst {
    pub name: String,
    pub if_not_exists: bool,
    pub window: WindowSpec,
    pub select: Box<ast::Select>,
    /// The defining `SELECT … WINDOW …` as written, after `AS`.
    pub definition: String,
    pub sql: String,
}

/// The defining SELECT of a `CREATE METRIC … AS SELECT …` statement, as written.
pub fn metric_definition(sql: &str) -> Option<String> {
    match parse_statement(sql) {
        Ok(Statement::CreateMetric(m)) => Some(m.definition),
        _ => None,
    }
}

/// Lower-cases unquoted identifiers, as PostgreSQL does.
pub fn normalize_ident(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// A word token as an object name: unquoted words are lower-cased.
pub(crate) fn word_name(w: &datafusion::sql::sqlparser::tokenizer::Word) -> String {
    if w.quote_style.is_some() {
        w.value.clone()
    } else {
        w.value.to_lowercase()
    }
}

/// The last part of a possibly qualified name (`public.payments` → `payments`).
pub fn object_name(name: &ObjectName) -> String {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(ident)) => normalize_ident(ident),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

fn tokenize(sql: &str) -> Result<Vec<Token>> {
    Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize()
        .map_err(|e| Error::syntax(e.message.clone()))
}

fn tokens_to_sql(tokens: &[Token]) -> String {
    tokens.iter().map(token_sql).collect::<String>()
}

/// A token as SQL that reads back as the same token: sqlparser's `Display` leaves the
/// quotes inside quoted strings and identifiers as they are (`'it's'`), so they are
/// doubled (escaped in E'…') here.
fn token_sql(t: &Token) -> String {
    match t {
        Token::SingleQuotedString(s) => format!("'{}'", s.replace('\'', "''")),
        Token::NationalStringLiteral(s) => format!("N'{}'", s.replace('\'', "''")),
        Token::EscapedStringLiteral(s) => {
            format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
        }
        Token::Word(w) if w.quote_style == Some('"') => {
            format!("\"{}\"", w.value.replace('"', "\"\""))
        }
        t => t.to_string(),
    }
}

fn is_ws(t: &Token) -> bool {
    matches!(t, Token::Whitespace(_))
}

/// Splits a query string at top-level semicolons into statement texts (comments kept);
/// pieces holding only whitespace and comments are dropped.
pub fn split_statements(sql: &str) -> Result<Vec<String>> {
    // One statement with no `;` but an optional last one, no comment and no quoted `;`,
    // as drivers send most: the text itself, with no tokenizing (a 100-row INSERT spent
    // about a third of its parsing here).
    let body = sql.trim_end().strip_suffix(';').unwrap_or(sql);
    if !body.contains(';') && !body.contains("--") && !body.contains("/*") {
        return Ok(if body.trim().is_empty() {
            Vec::new()
        } else {
            vec![body.to_string()]
        });
    }
    let mut out = Vec::new();
    let mut current: Vec<Token> = Vec::new();
    for t in tokenize(sql)?
        .into_iter()
        .chain(std::iter::once(Token::SemiColon))
    {
        if t != Token::SemiColon {
            current.push(t);
            continue;
        }
        // Comments are whitespace tokens, so this keeps only pieces with a statement.
        if current.iter().any(|t| !is_ws(t)) {
            out.push(tokens_to_sql(&current));
        }
        current.clear();
    }
    Ok(out)
}

/// The non-whitespace words of a statement, upper-cased, for keyword dispatch.
fn leading_words(tokens: &[Token], n: usize) -> Vec<String> {
    tokens
        .iter()
        .filter(|t| !is_ws(t))
        .take(n)
        .map(|t| match t {
            Token::Word(w) if w.quote_style.is_none() => w.value.to_ascii_uppercase(),
            other => other.to_string(),
        })
        .collect()
}

/// Parses one statement's text (no trailing semicolon).
pub fn parse_statement(sql: &str) -> Result<Statement> {
    // An INSERT is sqlparser's alone: no tokenizing of Eddy's own first.
    let first = sql
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next();
    if first.is_some_and(|w| w.eq_ignore_ascii_case("INSERT")) {
        return parse_standard(sql);
    }
    let mut tokens = tokenize(sql)?;
    let rewritten;
    let sql = match rewrite_as_of(&tokens) {
        Some(t) => {
            rewritten = tokens_to_sql(&t);
            tokens = t;
            rewritten.as_str()
        }
        None => sql,
    };
    let words = leading_words(&tokens, 3);
    let w: Vec<&str> = words.iter().map(|s| s.as_str()).collect();
    match w.as_slice() {
        [] => Ok(Statement::Empty),
        ["CREATE", "STREAM", ..] => parse_create_stream(&tokens, sql),
        ["CREATE", "METRIC", ..] => parse_create_metric(&tokens, sql),
        ["DROP", "STREAM", ..] | ["DROP", "METRIC", ..] => parse_drop(&tokens),
        ["SHOW", "STREAMS", ..] => Ok(Statement::ShowStreams),
        ["SHOW", "METRICS", ..] => Ok(Statement::ShowMetrics),
        ["SHOW", "SUBSCRIPTIONS", ..] => Ok(Statement::ShowSubscriptions),
        ["SHOW", "STORAGE", ..] => Ok(Statement::ShowStorage),
        ["CHECKPOINT"] => Ok(Statement::Checkpoint),
        ["BACKUP", ..] => parse_backup(&tokens),
        ["SHOW", "CLUSTER", ..] => Ok(Statement::ShowCluster),
        ["SHOW", "TASKS", ..] => Ok(Statement::ShowTasks),
        ["SHOW", "SHARDS", ..] => Ok(Statement::ShowShards),
        ["DECLARE", ..] => parse_declare(&tokens),
        ["FETCH", ..] | ["MOVE", ..] => parse_fetch(&tokens),
        ["CLOSE", ..] => parse_close(&tokens),
        ["COPY", "(", ..] | ["COPY", _, "TO"] => parse_copy_out(&tokens),
        ["DESCRIBE", ..] | ["DESC", ..] => Ok(Statement::Describe(single_name(&tokens, 1)?)),
        ["EXPLAIN", "STREAM", ..] => {
            let (name, dot) = explain_target(&tokens)?;
            Ok(Statement::ExplainStream(name, dot))
        }
        ["EXPLAIN", "METRIC", ..] => {
            let (name, dot) = explain_target(&tokens)?;
            Ok(Statement::ExplainMetric(name, dot))
        }
        ["CREATE", "ROLE" | "USER", ..]
        | ["ALTER", "ROLE" | "USER", ..]
        | ["DROP", "ROLE" | "USER", ..]
        | ["GRANT", ..]
        | ["REVOKE", ..]
        | ["ALTER", "METRIC", ..] => access_statement(&tokens),
        ["ALTER", "STREAM", ..] if nth_word_is(&tokens, 3, "OWNER") => access_statement(&tokens),
        ["ALTER", "STREAM", ..] => parse_alter_stream(&tokens),
        ["ALTER", "SYSTEM", ..] => parse_alter_system(&tokens),
        ["BEGIN", ..] | ["START", "TRANSACTION", ..] => Ok(Statement::Begin),
        ["COMMIT", ..] | ["END", ..] => Ok(Statement::Commit),
        ["ROLLBACK", ..] | ["ABORT", ..] => Ok(Statement::Rollback),
        ["SET", ..] => Ok(parse_set(&tokens)),
        ["RESET", "ALL"] => Ok(Statement::Reset(None)),
        ["RESET", name] => Ok(Statement::Reset(Some(name.to_ascii_lowercase()))),
        ["RESET", ..] | ["DISCARD", ..] => Ok(Statement::Set),
        ["PREPARE", ..] => parse_prepare(&tokens),
        ["EXECUTE", ..] => parse_execute(&tokens),
        ["DEALLOCATE", ..] => parse_deallocate(&tokens),
        // PostgreSQL's spellings of three parameters, as pgjdbc and psql send them.
        ["SHOW", "TRANSACTION", "ISOLATION"] => {
            Ok(Statement::ShowVariable("transaction_isolation".into()))
        }
        ["SHOW", "TIME", "ZONE"] => Ok(Statement::ShowVariable("timezone".into())),
        ["SHOW", "SESSION", "AUTHORIZATION"] => {
            Ok(Statement::ShowVariable("session_authorization".into()))
        }
        ["SHOW", name, ..] => Ok(Statement::ShowVariable(name.to_ascii_lowercase())),
        _ => match cut_emit_changes(&tokens)? {
            Some(query) => {
                let query = tokens_to_sql(&query);
                match parse_standard(&query)? {
                    Statement::Query(_) => Ok(Statement::Subscribe(query.trim().to_string())),
                    _ => Err(Error::syntax("syntax error: EMIT CHANGES ends a SELECT")),
                }
            }
            None => parse_standard(sql),
        },
    }
}

/// `FROM metric AS OF TIMESTAMP '…'` (after FROM, JOIN or a comma) as
/// `FROM as_of('metric', TIMESTAMP '…') AS metric`, the table function DataFusion runs;
/// `None` when the statement has no such clause.
fn rewrite_as_of(tokens: &[Token]) -> Option<Vec<Token>> {
    let significant: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let mut out: Vec<Token> = Vec::new();
    let mut copied = 0;
    for k in 0..significant.len().saturating_sub(5) {
        let [before, name, as_, of, ts, lit] = [0, 1, 2, 3, 4, 5].map(|j| significant[k + j]);
        let (Token::Word(w), Token::SingleQuotedString(_)) = (&tokens[name], &tokens[lit]) else {
            continue;
        };
        let after_from = is_word(&tokens[before], "FROM")
            || is_word(&tokens[before], "JOIN")
            || tokens[before] == Token::Comma;
        if !after_from
            || !is_word(&tokens[as_], "AS")
            || !is_word(&tokens[of], "OF")
            || !is_word(&tokens[ts], "TIMESTAMP")
        {
            continue;
        }
        out.extend_from_slice(&tokens[copied..name]);
        let text = |s: &str| Token::SingleQuotedString(s.to_string());
        out.extend([
            Token::make_word("as_of", None),
            Token::LParen,
            text(&w.value),
            Token::Comma,
            tokens[ts].clone(),
            Token::Whitespace(Whitespace::Space),
            tokens[lit].clone(),
            Token::RParen,
        ]);
        // Named after the metric, unless an alias follows.
        let aliased = significant.get(k + 6).is_some_and(|&i| {
            is_word(&tokens[i], "AS")
                || matches!(&tokens[i], Token::Word(w) if w.keyword == Keyword::NoKeyword)
        });
        if !aliased {
            out.extend([
                Token::Whitespace(Whitespace::Space),
                tokens[as_].clone(),
                Token::Whitespace(Whitespace::Space),
                tokens[name].clone(),
            ]);
        }
        copied = lit + 1;
    }
    if copied == 0 {
        return None;
    }
    out.extend_from_slice(&tokens[copied..]);
    Some(out)
}

fn access_statement(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    parse_access(&words).map(Statement::Access)
}

/// Whether the `n`th significant token is the keyword `word`.
fn nth_word_is(tokens: &[Token], n: usize, word: &str) -> bool {
    tokens
        .iter()
        .filter(|t| !is_ws(t))
        .nth(n)
        .is_some_and(|t| is_word(t, word))
}

pub(crate) fn is_word(t: &Token, word: &str) -> bool {
    matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// Removes a trailing `EMIT CHANGES` (at the end of the statement or of a parenthesised
/// query) and returns the rest; `None` without one.
fn cut_emit_changes(tokens: &[Token]) -> Result<Option<Vec<Token>>> {
    let significant: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    for (n, &i) in significant.iter().enumerate() {
        if !is_word(&tokens[i], "EMIT") {
            continue;
        }
        let Some(&j) = significant.get(n + 1) else {
            break;
        };
        if !is_word(&tokens[j], "CHANGES") {
            continue;
        }
        let last = significant[n + 2..]
            .iter()
            .all(|&k| tokens[k] == Token::RParen);
        if !last {
            return Err(
                Error::syntax("syntax error: EMIT CHANGES must end the SELECT")
                    .with_hint("Write SELECT … FROM … [WHERE …] EMIT CHANGES."),
            );
        }
        let mut out = tokens[..i].to_vec();
        out.extend_from_slice(&tokens[j + 1..]);
        return Ok(Some(out));
    }
    Ok(None)
}

/// The text of a query that follows `FOR` or sits in `COPY (…)`, and whether it ends in
/// `EMIT CHANGES`.
fn inner_query(tokens: &[Token]) -> Result<(String, bool)> {
    let (tokens, subscribe) = match cut_emit_changes(tokens)? {
        Some(t) => (t, true),
        None => (tokens.to_vec(), false),
    };
    let text = tokens_to_sql(&tokens).trim().to_string();
    match parse_standard(&text)? {
        Statement::Query(_) => Ok((text, subscribe)),
        _ => Err(Error::syntax("syntax error: expected a SELECT")),
    }
}

fn parse_declare(tokens: &[Token]) -> Result<Statement> {
    let significant: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let name = match significant.get(1).map(|&i| &tokens[i]) {
        Some(Token::Word(w)) => word_name(w),
        _ => {
            return Err(Error::syntax(
                "syntax error: expected a cursor name after DECLARE",
            ))
        }
    };
    let Some(n_for) = significant.iter().position(|&i| is_word(&tokens[i], "FOR")) else {
        return Err(Error::syntax("syntax error: expected FOR in DECLARE")
            .with_hint("DECLARE name CURSOR FOR SELECT …"));
    };
    let options = &significant[2..n_for];
    let mut saw_cursor = false;
    for &i in options {
        let Token::Word(w) = &tokens[i] else {
            return Err(Error::syntax("syntax error in DECLARE"));
        };
        match w.value.to_ascii_uppercase().as_str() {
            "CURSOR" => saw_cursor = true,
            "NO" | "SCROLL" | "ASENSITIVE" | "INSENSITIVE" | "WITHOUT" | "HOLD" => {}
            "BINARY" => return Err(Error::unsupported("binary cursors are not supported")),
            "WITH" => {
                return Err(Error::unsupported("WITH HOLD cursors are not supported")
                    .with_hint("A cursor lives until the end of its transaction."))
            }
            other => {
                return Err(Error::syntax(format!(
                    "syntax error at or near \"{other}\""
                )))
            }
        }
    }
    if !saw_cursor {
        return Err(Error::syntax("syntax error: expected CURSOR in DECLARE"));
    }
    let (query, subscribe) = inner_query(&tokens[significant[n_for] + 1..])?;
    Ok(Statement::Declare {
        name,
        query,
        subscribe,
    })
}

fn parse_fetch(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    if is_word(words[0], "MOVE") {
        return Err(Error::unsupported("MOVE is not supported").with_hint("Use FETCH."));
    }
    let mut i = 1;
    let mut count = Some(1u64);
    let number = |t: &Token| match t {
        Token::Number(n, _) => n.parse::<u64>().ok(),
        _ => None,
    };
    match words.get(i) {
        Some(t) if is_word(t, "NEXT") => i += 1,
        Some(t) if is_word(t, "FORWARD") => {
            i += 1;
            if let Some(n) = words.get(i).and_then(|t| number(t)) {
                count = Some(n);
                i += 1;
            } else if words.get(i).is_some_and(|t| is_word(t, "ALL")) {
                count = None;
                i += 1;
            }
        }
        Some(t) if is_word(t, "ALL") => {
            count = None;
            i += 1;
        }
        Some(t) if number(t).is_some() => {
            count = number(t);
            i += 1;
        }
        Some(t)
            if ["PRIOR", "FIRST", "LAST", "ABSOLUTE", "RELATIVE", "BACKWARD"]
                .iter()
                .any(|w| is_word(t, w)) =>
        {
            return Err(Error::unsupported("cursors only move forward")
                .with_hint("Use FETCH [FORWARD] n or FETCH ALL."));
        }
        _ => {}
    }
    if words
        .get(i)
        .is_some_and(|t| is_word(t, "FROM") || is_word(t, "IN"))
    {
        i += 1;
    }
    let cursor = match words.get(i) {
        Some(Token::Word(w)) => word_name(w),
        _ => {
            return Err(Error::syntax(
                "syntax error: expected a cursor name in FETCH",
            ))
        }
    };
    i += 1;
    let mut timeout_us = None;
    if i < words.len() {
        // WITH ( timeout = 'interval' )
        let ok = words.len() == i + 6
            && is_word(words[i], "WITH")
            && *words[i + 1] == Token::LParen
            && is_word(words[i + 2], "TIMEOUT")
            && *words[i + 3] == Token::Eq
            && *words[i + 5] == Token::RParen;
        let text = match words.get(i + 4) {
            Some(Token::SingleQuotedString(s)) if ok => s.clone(),
            _ => {
                return Err(Error::syntax("syntax error at the end of FETCH")
                    .with_hint("FETCH n FROM cursor [WITH (timeout = '1 second')]"))
            }
        };
        let us = parse_duration_us(&text)
            .filter(|us| *us >= 0)
            .ok_or_else(|| {
                Error::new(
                    crate::error::ErrorKind::InvalidParameter,
                    format!("invalid FETCH timeout: \"{text}\""),
                )
                .with_hint("Write an interval such as '500 milliseconds' or '2 seconds'.")
            })?;
        timeout_us = Some(us);
    }
    Ok(Statement::Fetch(Fetch {
        cursor,
        count,
        timeout_us,
    }))
}

/// `SET [SESSION] name =|TO value`; any other form of SET is accepted as is.
fn parse_set(tokens: &[Token]) -> Statement {
    let mut words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).skip(1).collect();
    if words.first().is_some_and(|t| is_word(t, "SESSION")) {
        words.remove(0);
    }
    let text = |value: &Token| match value {
        Token::SingleQuotedString(s) => s.clone(),
        Token::Word(w) => w.value.clone(),
        other => other.to_string(),
    };
    match words.as_slice() {
        // SET TIME ZONE 'Europe/Paris' is SET TimeZone = 'Europe/Paris'.
        [t, z, value] if is_word(t, "TIME") && is_word(z, "ZONE") => Statement::SetVariable {
            name: "timezone".to_string(),
            value: text(value),
        },
        [Token::Word(name), op, value]
            if (**op == Token::Eq || is_word(op, "TO")) && is_word(value, "DEFAULT") =>
        {
            Statement::Reset(Some(name.value.to_ascii_lowercase()))
        }
        [Token::Word(name), op, value] if **op == Token::Eq || is_word(op, "TO") => {
            Statement::SetVariable {
                name: name.value.to_ascii_lowercase(),
                value: text(value),
            }
        }
        _ => Statement::Set,
    }
}

fn parse_alter_system(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).skip(2).collect();
    let value = |t: &Token| match t {
        Token::SingleQuotedString(s) => Some(s.clone()),
        Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("DEFAULT") => {
            None
        }
        Token::Word(w) => Some(w.value.clone()),
        other => Some(other.to_string()),
    };
    match words.as_slice() {
        [set, Token::Word(name), op, v]
            if is_word(set, "SET") && (**op == Token::Eq || is_word(op, "TO")) =>
        {
            Ok(Statement::AlterSystem {
                name: name.value.to_ascii_lowercase(),
                value: value(v),
            })
        }
        [reset, Token::Word(name)] if is_word(reset, "RESET") => Ok(Statement::AlterSystem {
            name: name.value.to_ascii_lowercase(),
            value: None,
        }),
        _ => Err(Error::syntax(
            "syntax error: expected ALTER SYSTEM SET name = value or ALTER SYSTEM RESET name",
        )),
    }
}

fn parse_backup(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    match words.as_slice() {
        [_, to, Token::SingleQuotedString(dir)] if is_word(to, "TO") => {
            Ok(Statement::Backup(dir.clone()))
        }
        _ => Err(Error::syntax(
            "syntax error: expected BACKUP TO '/path/of/a/new/directory'",
        )),
    }
}

fn parse_close(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    match words.as_slice() {
        [_, t] if is_word(t, "ALL") => Ok(Statement::Close(None)),
        [_, Token::Word(w)] => Ok(Statement::Close(Some(word_name(w)))),
        _ => Err(Error::syntax(
            "syntax error: expected CLOSE name or CLOSE ALL",
        )),
    }
}

fn parse_copy_out(tokens: &[Token]) -> Result<Statement> {
    let significant: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let open = significant[1];
    let (query, subscribe, rest) = if tokens[open] == Token::LParen {
        let mut depth = 0;
        let mut close = None;
        for (j, t) in tokens.iter().enumerate().skip(open) {
            match t {
                Token::LParen => depth += 1,
                Token::RParen => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close.ok_or_else(|| Error::syntax("syntax error: unbalanced parentheses"))?;
        let (query, subscribe) = inner_query(&tokens[open + 1..close])?;
        (query, subscribe, &tokens[close + 1..])
    } else {
        let Token::Word(w) = &tokens[open] else {
            return Err(Error::syntax("syntax error in COPY"));
        };
        let name = word_name(w);
        (
            format!("SELECT * FROM {}", quote_ident(&name)),
            false,
            &tokens[open + 1..],
        )
    };
    // Let sqlparser read the target and options of `COPY t TO …`.
    let text = format!("COPY t {}", tokens_to_sql(rest));
    let parsed = Parser::parse_sql(&PostgreSqlDialect {}, &text).map_err(parser_error)?;
    let Some(ast::Statement::Copy {
        to: true,
        target,
        options,
        legacy_options,
        ..
    }) = parsed.into_iter().next()
    else {
        return Err(Error::syntax(
            "syntax error: expected COPY (query) TO STDOUT",
        ));
    };
    if !matches!(target, ast::CopyTarget::Stdout) {
        return Err(
            Error::unsupported("COPY TO a file or program is not supported")
                .with_hint("Use COPY … TO STDOUT; psql's \\copy writes to a local file."),
        );
    }
    let mut out = CopyOut {
        query,
        subscribe,
        csv: false,
        header: false,
        delimiter: '\t',
        null: "\\N".to_string(),
    };
    let mut delimiter = None;
    let mut null = None;
    for o in options {
        match o {
            ast::CopyOption::Format(f) => match f.value.to_ascii_lowercase().as_str() {
                "csv" => out.csv = true,
                "text" => out.csv = false,
                other => {
                    return Err(Error::unsupported(format!(
                        "COPY format \"{other}\" is not supported"
                    ))
                    .with_hint("Use FORMAT text or FORMAT csv."))
                }
            },
            ast::CopyOption::Header(h) => out.header = h,
            ast::CopyOption::Delimiter(c) => delimiter = Some(c),
            ast::CopyOption::Null(n) => null = Some(n),
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )))
            }
        }
    }
    for o in legacy_options {
        match o {
            ast::CopyLegacyOption::Csv(_) => out.csv = true,
            ast::CopyLegacyOption::Delimiter(c) => delimiter = Some(c),
            ast::CopyLegacyOption::Null(n) => null = Some(n),
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )))
            }
        }
    }
    if out.csv {
        out.delimiter = ',';
        out.null = String::new();
    }
    if let Some(d) = delimiter {
        out.delimiter = d;
    }
    if let Some(n) = null {
        out.null = n;
    }
    Ok(Statement::CopyOut(out))
}

/// A name quoted only when it has to be.
fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

fn parse_standard(sql: &str) -> Result<Statement> {
    let mut parsed = Parser::parse_sql(&PostgreSqlDialect {}, sql).map_err(parser_error)?;
    if parsed.len() != 1 {
        return Err(Error::syntax("expected exactly one statement"));
    }
    match parsed.remove(0) {
        ast::Statement::Insert(insert) => Ok(Statement::Insert(Box::new(insert))),
        copy @ ast::Statement::Copy { .. } => Ok(Statement::Copy(Box::new(copy))),
        ast::Statement::Query(_) | ast::Statement::Explain { .. } => {
            Ok(Statement::Query(sql.to_string()))
        }
        ast::Statement::CreateTable(_) => Err(Error::unsupported("CREATE TABLE is not supported")
            .with_hint("Eddy stores events in streams: use CREATE STREAM.")),
        ast::Statement::Update { .. }
        | ast::Statement::Delete(_)
        | ast::Statement::Truncate { .. } => {
            let verb = sql
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            Err(Error::unsupported(format!("{verb} is not supported: streams are append-only"))
                .with_hint(
                    "Events leave a stream after its retention (CREATE STREAM … WITH (retention = '30 days')), \
                     and a metric's window decides which events it counts. DROP STREAM removes a stream.",
                ))
        }
        other => Err(Error::unsupported(format!(
            "statement not supported: {}",
            other
                .to_string()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        ))),
    }
}

/// Turns a sqlparser error into a PostgreSQL-style syntax error.
pub fn parser_error(e: datafusion::sql::sqlparser::parser::ParserError) -> Error {
    let text = e.to_string();
    let text = text
        .trim_start_matches("sql parser error: ")
        .trim_start_matches("SQL parser error: ")
        .to_string();
    Error::syntax(format!("syntax error: {text}"))
}

fn parse_create_stream(tokens: &[Token], sql: &str) -> Result<Statement> {
    // CREATE STREAM … has the shape of CREATE TABLE … WITH (…): let sqlparser read it.
    let mut rewritten = tokens.to_vec();
    if let Some(t) = rewritten.iter_mut().filter(|t| !is_ws(t)).nth(1) {
        *t = Token::make_keyword("TABLE");
    }
    let text = tokens_to_sql(&rewritten);
    let mut parsed = Parser::parse_sql(&PostgreSqlDialect {}, &text).map_err(parser_error)?;
    match parsed.pop() {
        Some(ast::Statement::CreateTable(create)) if parsed.is_empty() => {
            Ok(Statement::CreateStream {
                create: Box::new(create),
                sql: sql.trim().to_string(),
            })
        }
        _ => Err(Error::syntax("syntax error in CREATE STREAM")),
    }
}

fn parse_create_metric(tokens: &[Token], sql: &str) -> Result<Statement> {
    let significant: Vec<(usize, &Token)> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !is_ws(t))
        .collect();
    let word = |i: usize| -> Option<String> {
        match significant.get(i).map(|(_, t)| *t) {
            Some(Token::Word(w)) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
            _ => None,
        }
    };
    let mut i = 2;
    let mut if_not_exists = false;
    if word(i).as_deref() == Some("IF") {
        if word(i + 1).as_deref() != Some("NOT") || word(i + 2).as_deref() != Some("EXISTS") {
            return Err(Error::syntax("syntax error: expected IF NOT EXISTS"));
        }
        if_not_exists = true;
        i += 3;
    }
    let name = match significant.get(i).map(|(_, t)| *t) {
        Some(Token::Word(w)) => word_name(w),
        _ => {
            return Err(Error::syntax(
                "syntax error: expected a metric name after CREATE METRIC",
            ))
        }
    };
    if word(i + 1).as_deref() != Some("AS") {
        return Err(
            Error::syntax("syntax error: expected AS after the metric name").with_hint(
                "CREATE METRIC name AS SELECT … FROM stream WINDOW … [WHERE …] GROUP BY …",
            ),
        );
    }
    let body_start = significant
        .get(i + 2)
        .map(|(pos, _)| *pos)
        .ok_or_else(|| Error::syntax("syntax error: expected SELECT after AS"))?;
    let body = &tokens[body_start..];
    let (window, select_tokens) = cut_window(body)?;
    let select_sql = tokens_to_sql(&select_tokens);
    let mut parsed = Parser::parse_sql(&PostgreSqlDialect {}, &select_sql).map_err(parser_error)?;
    let query = match parsed.pop() {
        Some(ast::Statement::Query(q)) if parsed.is_empty() => q,
        _ => {
            return Err(Error::syntax(
                "syntax error: a metric is defined by one SELECT",
            ))
        }
    };
    if query.order_by.is_some() || query.limit_clause.is_some() || query.with.is_some() {
        return Err(Error::unsupported(
            "ORDER BY, LIMIT and WITH are not allowed in a metric definition",
        )
        .with_hint("Apply them when you SELECT from the metric."));
    }
    let select = match *query.body {
        ast::SetExpr::Select(select) => select,
        _ => return Err(Error::unsupported("a metric is defined by a plain SELECT")),
    };
    Ok(Statement::CreateMetric(Box::new(MetricAst {
        name,
        if_not_exists,
        window,
        select,
        definition: tokens_to_sql(body).trim().to_string(),
        sql: sql.trim().to_string(),
    })))
}

/// Removes `WINDOW SLIDING (…)`, `WINDOW TUMBLING (…)` or `WINDOW INFINITE` from a
/// SELECT's tokens and parses it.
fn cut_window(tokens: &[Token]) -> Result<(WindowSpec, Vec<Token>)> {
    let mut depth = 0i32;
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Word(w) if depth == 0 && w.value.eq_ignore_ascii_case("WINDOW") => {
                let rest: Vec<(usize, &Token)> = tokens
                    .iter()
                    .enumerate()
                    .skip(i + 1)
                    .filter(|(_, t)| !is_ws(t))
                    .collect();
                let kind = match rest.first() {
                    Some((_, Token::Word(k))) => k.value.to_ascii_uppercase(),
                    _ => return Err(window_syntax()),
                };
                if kind == "INFINITE" {
                    let end = rest[0].0 + 1;
                    let mut out = tokens[..i].to_vec();
                    out.extend_from_slice(&tokens[end..]);
                    return Ok((WindowSpec::Infinite, out));
                }
                if !matches!(kind.as_str(), "SLIDING" | "TUMBLING" | "HOPPING") {
                    return Err(window_syntax());
                }
                if !matches!(rest.get(1), Some((_, Token::LParen))) {
                    return Err(window_syntax());
                }
                let open = rest[1].0;
                let mut d = 0;
                let mut close = None;
                for (j, t) in tokens.iter().enumerate().skip(open) {
                    match t {
                        Token::LParen => d += 1,
                        Token::RParen => {
                            d -= 1;
                            if d == 0 {
                                close = Some(j);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let close = close.ok_or_else(window_syntax)?;
                let spec = parse_window_args(&kind, &tokens[open + 1..close])?;
                let mut out = tokens[..i].to_vec();
                out.extend_from_slice(&tokens[close + 1..]);
                return Ok((spec, out));
            }
            _ => {}
        }
    }
    Err(Error::syntax("a metric needs a WINDOW clause").with_hint(
        "Add WINDOW SLIDING (SIZE 5 MINUTES), WINDOW TUMBLING (SIZE 1 HOUR) or WINDOW INFINITE after FROM.",
    ))
}

/// The most events a count window keeps per group (they live in the group's state).
pub const COUNT_WINDOW_MAX: i64 = 10_000;

fn window_syntax() -> Error {
    Error::syntax("syntax error in WINDOW clause").with_hint(
        "Write WINDOW SLIDING (SIZE 5 MINUTES [, DELAY 1 MINUTE]), WINDOW SLIDING (SIZE 10 EVENTS), WINDOW TUMBLING (SIZE 1 HOUR), WINDOW HOPPING (SIZE 5 MINUTES, HOP 1 MINUTE) or WINDOW INFINITE.",
    )
}

fn parse_window_args(kind: &str, tokens: &[Token]) -> Result<WindowSpec> {
    let mut size = None;
    let mut delay = 0;
    let mut hop = None;
    let mut count = None;
    for part in tokens.split(|t| *t == Token::Comma) {
        let mut sig: Vec<&Token> = part.iter().filter(|t| !is_ws(t)).collect();
        let mut key = match sig.first() {
            Some(Token::Word(w)) => w.value.to_ascii_uppercase(),
            _ => return Err(window_syntax()),
        };
        // ksqlDB's spelling of HOP.
        if key == "ADVANCE"
            && matches!(sig.get(1), Some(Token::Word(w)) if w.value.eq_ignore_ascii_case("BY"))
        {
            key = "HOP".to_string();
            sig.remove(1);
        }
        // SLIDING (SIZE n EVENTS): a count window.
        if let ("SIZE", [_, Token::Number(n, _), Token::Word(unit)]) =
            (key.as_str(), sig.as_slice())
        {
            if unit.value.eq_ignore_ascii_case("EVENTS") || unit.value.eq_ignore_ascii_case("EVENT")
            {
                if kind != "SLIDING" {
                    return Err(Error::unsupported(format!(
                        "a {} window is sized by time, not by events",
                        kind.to_lowercase()
                    ))
                    .with_hint("Count windows are WINDOW SLIDING (SIZE n EVENTS)."));
                }
                let events = n
                    .parse::<i64>()
                    .ok()
                    .filter(|n| (1..=COUNT_WINDOW_MAX).contains(n))
                    .ok_or_else(|| {
                        Error::new(
                            crate::error::ErrorKind::InvalidParameter,
                            format!("a count window holds 1 to {COUNT_WINDOW_MAX} events, not {n}"),
                        )
                    })?;
                count = Some(events);
                continue;
            }
        }
        let text = match sig.get(1) {
            Some(Token::Word(w)) if w.value.eq_ignore_ascii_case("INTERVAL") => match sig.get(2) {
                Some(Token::SingleQuotedString(s)) => s.clone(),
                _ => return Err(window_syntax()),
            },
            _ => sig[1..]
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(" "),
        };
        let us = parse_duration_us(&text).ok_or_else(|| {
            Error::syntax(format!("invalid window duration \"{text}\"")).with_hint(
                "Write a duration such as 5 MINUTES, 1 HOUR, 7 DAYS or 500 MILLISECONDS.",
            )
        })?;
        match key.as_str() {
            "SIZE" if us > 0 => size = Some(us),
            "DELAY" if kind == "SLIDING" && us >= 0 => delay = us,
            "HOP" if kind == "HOPPING" && us > 0 => hop = Some(us),
            _ => return Err(window_syntax()),
        }
    }
    if let Some(events) = count {
        if size.is_some() || delay != 0 || hop.is_some() {
            return Err(window_syntax());
        }
        return Ok(WindowSpec::Count { events });
    }
    let size_us = size.ok_or_else(window_syntax)?;
    Ok(match kind {
        "SLIDING" => WindowSpec::Sliding {
            size_us,
            delay_us: delay,
        },
        "HOPPING" => {
            let hop_us = hop.ok_or_else(window_syntax)?;
            if hop_us > size_us {
                return Err(Error::new(
                    crate::error::ErrorKind::InvalidParameter,
                    "a hopping window's HOP must not exceed its SIZE",
                )
                .with_hint("Use WINDOW TUMBLING (SIZE …) for windows that do not overlap."));
            }
            WindowSpec::Hopping { size_us, hop_us }
        }
        _ => WindowSpec::Tumbling { size_us },
    })
}

fn parse_drop(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    let kw = |t: Option<&&Token>, k: &str| matches!(t, Some(Token::Word(w)) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(k));
    let is_stream = kw(words.get(1), "STREAM");
    let mut i = 2;
    let if_exists = kw(words.get(2), "IF") && kw(words.get(3), "EXISTS");
    if if_exists {
        i += 2;
    }
    let name = match words.get(i) {
        Some(Token::Word(w)) => word_name(w),
        _ => return Err(Error::syntax("syntax error: expected a name after DROP")),
    };
    let cascade = kw(words.get(i + 1), "CASCADE");
    let extra = if cascade || kw(words.get(i + 1), "RESTRICT") {
        i + 2
    } else {
        i + 1
    };
    if words.len() > extra {
        return Err(Error::syntax(format!(
            "syntax error at or near \"{}\"",
            words[extra]
        )));
    }
    Ok(if is_stream {
        Statement::DropStream {
            name,
            if_exists,
            cascade,
        }
    } else {
        Statement::DropMetric { name, if_exists }
    })
}

/// The object name at significant-token position `at` (e.g. `DESCRIBE name`).
/// `ALTER STREAM name ADD [COLUMN] column type`: the only change a stream takes.
fn parse_alter_stream(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    let unsupported = || {
        Error::unsupported("ALTER STREAM only adds columns")
            .with_hint("Write ALTER STREAM name ADD COLUMN column type.")
    };
    let (Some(Token::Word(stream)), Some(Token::Word(add))) = (words.get(2), words.get(3)) else {
        return Err(Error::syntax("syntax error in ALTER STREAM"));
    };
    if !add.value.eq_ignore_ascii_case("ADD") {
        return Err(unsupported());
    }
    let mut at = 4;
    if matches!(words.get(at), Some(Token::Word(w)) if w.value.eq_ignore_ascii_case("COLUMN")) {
        at += 1;
    }
    let Some(Token::Word(column)) = words.get(at) else {
        return Err(Error::syntax(
            "syntax error in ALTER STREAM: expected a column name",
        ));
    };
    let ty = words[at + 1..]
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    if ty.is_empty() {
        return Err(Error::syntax(
            "syntax error in ALTER STREAM: expected a column type",
        ));
    }
    Ok(Statement::AlterStreamAddColumn {
        stream: word_name(stream),
        column: word_name(column),
        ty,
    })
}

/// `EXPLAIN STREAM|METRIC name [(FORMAT text | dot)]`: the name, and whether dot.
fn explain_target(tokens: &[Token]) -> Result<(String, bool)> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    let name = match words.get(2) {
        Some(Token::Word(w)) => word_name(w),
        _ => return Err(Error::syntax("syntax error: expected one object name")),
    };
    let format = match &words[3..] {
        [] => return Ok((name, false)),
        [Token::LParen, Token::Word(option), Token::Word(format), Token::RParen]
            if option.value.eq_ignore_ascii_case("FORMAT") =>
        {
            format.value.to_ascii_lowercase()
        }
        _ => {
            return Err(Error::syntax("syntax error at the end of EXPLAIN")
                .with_hint("EXPLAIN STREAM name [(FORMAT text | dot)]"))
        }
    };
    match format.as_str() {
        "text" => Ok((name, false)),
        "dot" => Ok((name, true)),
        _ => Err(Error::new(
            crate::error::ErrorKind::InvalidParameter,
            format!("unrecognized value for EXPLAIN option \"format\": \"{format}\""),
        )
        .with_hint("FORMAT is text (the tree) or dot (a Graphviz digraph).")),
    }
}

fn single_name(tokens: &[Token], at: usize) -> Result<String> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    match words.get(at) {
        Some(Token::Word(w)) if words.len() == at + 1 => Ok(word_name(w)),
        _ => Err(Error::syntax("syntax error: expected one object name")),
    }
}

/// `PREPARE name [(type, …)] AS statement`. The statement is parsed now, as
/// PostgreSQL checks it at PREPARE; one that belongs to the session (a cursor, a
/// continuous query, another PREPARE) is refused.
fn parse_prepare(tokens: &[Token]) -> Result<Statement> {
    let at: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let Some(Token::Word(name)) = at.get(1).map(|&i| &tokens[i]) else {
        return Err(Error::syntax("syntax error: PREPARE needs a name"));
    };
    let (types, next) = parenthesized(tokens, &at, 2)?;
    if !at.get(next).is_some_and(|&i| is_word(&tokens[i], "AS")) {
        return Err(Error::syntax(
            "syntax error: expected AS after PREPARE name",
        ));
    }
    let body = tokens_to_sql(&tokens[at[next] + 1..]).trim().to_string();
    match parse_statement(&body)? {
        Statement::Query(_)
        | Statement::Insert(_)
        | Statement::ShowVariable(_)
        | Statement::ShowStreams
        | Statement::ShowMetrics => {}
        _ => {
            return Err(Error::unsupported(
                "PREPARE takes a SELECT, an INSERT or a SHOW",
            ))
        }
    }
    Ok(Statement::Prepare {
        name: word_name(name),
        types,
        body,
    })
}

/// `EXECUTE name [(value, …)]`.
fn parse_execute(tokens: &[Token]) -> Result<Statement> {
    let at: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let Some(Token::Word(name)) = at.get(1).map(|&i| &tokens[i]) else {
        return Err(Error::syntax("syntax error: EXECUTE needs a name"));
    };
    let (args, next) = parenthesized(tokens, &at, 2)?;
    if next < at.len() {
        return Err(Error::syntax(format!(
            "syntax error at or near \"{}\"",
            tokens[at[next]]
        )));
    }
    Ok(Statement::Execute {
        name: word_name(name),
        args,
    })
}

/// `DEALLOCATE [PREPARE] {name | ALL}`.
fn parse_deallocate(tokens: &[Token]) -> Result<Statement> {
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_ws(t)).collect();
    let skip = if words.get(1).is_some_and(|t| is_word(t, "PREPARE")) {
        2
    } else {
        1
    };
    match &words[skip..] {
        [t] if is_word(t, "ALL") => Ok(Statement::Deallocate(None)),
        [Token::Word(w)] => Ok(Statement::Deallocate(Some(word_name(w)))),
        _ => Err(Error::syntax(
            "syntax error: expected DEALLOCATE name or DEALLOCATE ALL",
        )),
    }
}

/// A parenthesized list at significant token `from` (`at` indexes the significant
/// tokens): each item's SQL text, and the significant index after the list. No list
/// gives an empty one.
fn parenthesized(tokens: &[Token], at: &[usize], from: usize) -> Result<(Vec<String>, usize)> {
    if at.get(from).is_none_or(|&i| tokens[i] != Token::LParen) {
        return Ok((Vec::new(), from));
    }
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, at[from] + 1);
    for (k, &i) in at.iter().enumerate().skip(from) {
        match &tokens[i] {
            Token::LParen | Token::LBracket => depth += 1,
            Token::RParen | Token::RBracket => {
                depth -= 1;
                if depth == 0 {
                    let last = tokens_to_sql(&tokens[start..i]).trim().to_string();
                    if !last.is_empty() || !items.is_empty() {
                        items.push(last);
                    }
                    if items.iter().any(|x: &String| x.is_empty()) {
                        return Err(Error::syntax("syntax error: an empty item in a list"));
                    }
                    return Ok((items, k + 1));
                }
            }
            Token::Comma if depth == 1 => {
                items.push(tokens_to_sql(&tokens[start..i]).trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    Err(Error::syntax("syntax error: unbalanced parentheses"))
}

/// Replaces `$1`, `$2`, … by SQL literals (already quoted by the caller, or `NULL`).
pub fn substitute_params(sql: &str, literals: &[String]) -> Result<String> {
    let tokens = tokenize(sql)?;
    let mut out = String::with_capacity(sql.len());
    for t in tokens {
        match &t {
            Token::Placeholder(p) if p.starts_with('$') => {
                let idx: usize = p[1..]
                    .parse()
                    .map_err(|_| Error::syntax(format!("invalid parameter {p}")))?;
                let lit = literals.get(idx.wrapping_sub(1)).ok_or_else(|| {
                    Error::new(
                        crate::error::ErrorKind::InvalidParameter,
                        format!("there is no parameter {p}"),
                    )
                })?;
                out.push_str(lit);
            }
            other => out.push_str(&token_sql(other)),
        }
    }
    Ok(out)
}

/// The highest `$n` placeholder in a statement.
pub fn count_params(sql: &str) -> usize {
    tokenize(sql)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| match t {
                    Token::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok(),
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Quotes text as a SQL string literal.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Parses `CREATE|ALTER|DROP ROLE|USER`, `GRANT`, `REVOKE` and `ALTER STREAM|METRIC …
/// OWNER TO`, given the statement's tokens without whitespace.
/// `ALTER ROLE name SET setting {= | TO} {value | DEFAULT}`, `ALTER ROLE name RESET
/// setting` and `ALTER ROLE name RESET ALL`, after the role's name.
fn parse_role_setting(p: &mut Words, role: String) -> Result<AccessStatement> {
    let set = p.keyword()? == "SET";
    let name = match p.next() {
        Some(Token::Word(w)) => w.value.to_ascii_lowercase(),
        _ => return Err(Error::syntax("syntax error: expected a setting's name")),
    };
    let (name, value) = if set {
        match p.next() {
            Some(Token::Eq) => {}
            Some(t) if is_word(t, "TO") => {}
            _ => {
                return Err(Error::syntax(
                    "syntax error: expected = or TO after the setting's name",
                ))
            }
        }
        let value = match p.next() {
            Some(t) if is_word(t, "DEFAULT") => None,
            Some(Token::SingleQuotedString(s)) => Some(s.clone()),
            Some(Token::Word(w)) => Some(w.value.clone()),
            Some(Token::Number(n, _)) => Some(n.clone()),
            _ => return Err(Error::syntax("syntax error: expected the setting's value")),
        };
        (Some(name), value)
    } else if name == "all" {
        (None, None)
    } else {
        (Some(name), None)
    };
    p.end()?;
    Ok(AccessStatement::RoleSetting { role, name, value })
}

fn parse_access(words: &[&Token]) -> Result<AccessStatement> {
    let mut p = Words { words, at: 0 };
    let first = p.keyword()?;
    match first.as_str() {
        "CREATE" | "ALTER" => {
            let kind = p.keyword()?;
            if kind == "STREAM" || kind == "METRIC" {
                let name = p.name()?;
                p.expect("OWNER")?;
                p.expect("TO")?;
                let owner = p.name()?;
                p.end()?;
                let target = if kind == "STREAM" {
                    Target::Stream(name)
                } else {
                    Target::Metric(name)
                };
                return Ok(AccessStatement::SetOwner { target, owner });
            }
            let user = kind == "USER";
            if !user && kind != "ROLE" {
                return Err(Error::syntax(format!("syntax error at or near \"{kind}\"")));
            }
            let name = p.name()?;
            if first == "ALTER"
                && matches!(p.peek(), Some(t) if is_word(t, "SET") || is_word(t, "RESET"))
            {
                return parse_role_setting(&mut p, name);
            }
            let mut options = RoleOptions::default();
            if first == "CREATE" && user {
                options.login = Some(true);
            }
            p.skip("WITH");
            while !p.done() {
                match p.keyword()?.as_str() {
                    "LOGIN" => options.login = Some(true),
                    "NOLOGIN" => options.login = Some(false),
                    "SUPERUSER" => options.superuser = Some(true),
                    "NOSUPERUSER" => options.superuser = Some(false),
                    "ENCRYPTED" => {}
                    "PASSWORD" => {
                        options.password = Some(match p.next() {
                            Some(Token::SingleQuotedString(s)) => Some(s.clone()),
                            Some(t) if is_word(t, "NULL") => None,
                            _ => {
                                return Err(Error::syntax(
                                    "syntax error: PASSWORD takes a string or NULL",
                                ))
                            }
                        })
                    }
                    other => {
                        return Err(Error::unsupported(format!(
                            "role option {other} is not supported"
                        ))
                        .with_hint(
                            "Roles take LOGIN, NOLOGIN, SUPERUSER, NOSUPERUSER and PASSWORD.",
                        ))
                    }
                }
            }
            let name = name.clone();
            Ok(if first == "CREATE" {
                AccessStatement::CreateRole { name, options }
            } else {
                AccessStatement::AlterRole { name, options }
            })
        }
        "DROP" => {
            let kind = p.keyword()?;
            if kind != "ROLE" && kind != "USER" {
                return Err(Error::syntax(format!("syntax error at or near \"{kind}\"")));
            }
            let if_exists = p.skip("IF") && p.expect("EXISTS").is_ok();
            let names = p.names()?;
            p.end()?;
            Ok(AccessStatement::DropRole { names, if_exists })
        }
        "GRANT" | "REVOKE" => {
            let mut privileges = Vec::new();
            loop {
                match p.keyword()?.as_str() {
                    "SELECT" => privileges.push(Privilege::Select),
                    "INSERT" => privileges.push(Privilege::Insert),
                    "ALL" => {
                        p.skip("PRIVILEGES");
                        privileges.extend([Privilege::Select, Privilege::Insert]);
                    }
                    other => {
                        return Err(Error::unsupported(format!(
                            "privilege {other} is not supported"
                        ))
                        .with_hint("Grant SELECT, INSERT or ALL."))
                    }
                }
                if !matches!(p.peek(), Some(Token::Comma)) {
                    break;
                }
                p.at += 1;
            }
            p.expect("ON")?;
            let kind = p.keyword()?;
            let target = match kind.as_str() {
                "STREAM" => Target::Stream(p.name()?),
                "METRIC" => Target::Metric(p.name()?),
                "ALL" => match p.keyword()?.as_str() {
                    "STREAMS" => Target::AllStreams,
                    "METRICS" => Target::AllMetrics,
                    other => {
                        return Err(Error::syntax(format!(
                            "syntax error at or near \"{other}\""
                        )))
                    }
                },
                other => return Err(
                    Error::syntax(format!("syntax error at or near \"{other}\"")).with_hint(
                        "Write ON STREAM name, ON METRIC name, ON ALL STREAMS or ON ALL METRICS.",
                    ),
                ),
            };
            // A metric reads no events of its own: ALL means SELECT there.
            if matches!(target, Target::Metric(_) | Target::AllMetrics) && privileges.len() == 2 {
                privileges.retain(|p| *p == Privilege::Select);
            }
            p.expect(if first == "GRANT" { "TO" } else { "FROM" })?;
            let roles = p.names()?;
            p.end()?;
            Ok(if first == "GRANT" {
                AccessStatement::Grant {
                    privileges,
                    target,
                    roles,
                }
            } else {
                AccessStatement::Revoke {
                    privileges,
                    target,
                    roles,
                }
            })
        }
        _ => Err(Error::syntax(format!(
            "syntax error at or near \"{first}\""
        ))),
    }
}

/// A cursor over a statement's tokens.
struct Words<'a> {
    words: &'a [&'a Token],
    at: usize,
}

impl Words<'_> {
    fn done(&self) -> bool {
        self.at >= self.words.len()
    }

    fn peek(&self) -> Option<&Token> {
        self.words.get(self.at).copied()
    }

    fn next(&mut self) -> Option<&Token> {
        let t = self.words.get(self.at).copied();
        self.at += 1;
        t
    }

    fn keyword(&mut self) -> Result<String> {
        match self.next() {
            Some(Token::Word(w)) if w.quote_style.is_none() => Ok(w.value.to_ascii_uppercase()),
            Some(t) => Err(Error::syntax(format!("syntax error at or near \"{t}\""))),
            None => Err(Error::syntax("syntax error at end of input")),
        }
    }

    fn name(&mut self) -> Result<String> {
        match self.next() {
            Some(Token::Word(w)) => Ok(word_name(w)),
            Some(t) => Err(Error::syntax(format!("syntax error at or near \"{t}\""))),
            None => Err(Error::syntax("syntax error at end of input")),
        }
    }

    fn names(&mut self) -> Result<Vec<String>> {
        let mut out = vec![self.name()?];
        while matches!(self.peek(), Some(Token::Comma)) {
            self.at += 1;
            out.push(self.name()?);
        }
        Ok(out)
    }

    fn skip(&mut self, word: &str) -> bool {
        let found = self.peek().is_some_and(|t| is_word(t, word));
        if found {
            self.at += 1;
        }
        found
    }

    fn expect(&mut self, word: &str) -> Result<()> {
        if self.skip(word) {
            Ok(())
        } else {
            Err(Error::syntax(match self.peek() {
                Some(t) => format!("syntax error at or near \"{t}\": expected {word}"),
                None => format!("syntax error at end of input: expected {word}"),
            }))
        }
    }

    fn end(&self) -> Result<()> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(Error::syntax(format!("syntax error at or near \"{t}\""))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_execute_and_deallocate_parse_as_postgresql_writes_them() {
        let Ok(Statement::Prepare { name, types, body }) =
            parse_statement("PREPARE P (int, text) AS SELECT $1 + 1, f($2, (1, 2))")
        else {
            panic!("PREPARE");
        };
        assert_eq!(
            (name.as_str(), types),
            ("p", vec!["int".to_string(), "text".into()])
        );
        assert_eq!(body, "SELECT $1 + 1, f($2, (1, 2))");
        let Ok(Statement::Execute { name, args }) = parse_statement("EXECUTE p (f(1, 2), 'a,b')")
        else {
            panic!("EXECUTE");
        };
        assert_eq!(
            (name.as_str(), args),
            ("p", vec!["f(1, 2)".to_string(), "'a,b'".into()])
        );
        assert!(matches!(
            parse_statement("EXECUTE p"),
            Ok(Statement::Execute { args, .. }) if args.is_empty()
        ));
        assert!(matches!(
            parse_statement("DEALLOCATE PREPARE ALL"),
            Ok(Statement::Deallocate(None))
        ));
        assert!(
            matches!(parse_statement("DEALLOCATE \"Q\""), Ok(Statement::Deallocate(Some(n))) if n == "Q")
        );
        assert!(parse_statement("PREPARE p AS DECLARE c CURSOR FOR SELECT 1").is_err());
        assert!(parse_statement("EXECUTE p (1,)").is_err());
    }

    /// A string with a quote in it survives the substitution of parameters.
    #[test]
    fn substituted_parameters_keep_quoted_strings() {
        let sql = substitute_params("SELECT 'it''s', $1", &["'x'".into()]).unwrap();
        assert_eq!(sql, "SELECT 'it''s', 'x'");
    }

    #[test]
    fn split_statements_keep_quotes_inside_strings_and_names() {
        let sql =
            "INSERT INTO t VALUES ('O''Brien', E'it\\'s', N'a''b'); SELECT \"we\"\"ird\" FROM t";
        let parts = split_statements(sql).unwrap();
        assert_eq!(
            parts,
            [
                "INSERT INTO t VALUES ('O''Brien', E'it\\'s', N'a''b')",
                " SELECT \"we\"\"ird\" FROM t"
            ]
        );
        for part in parts {
            assert_eq!(split_statements(&part).unwrap(), vec![part]);
        }
        // One statement, with or without its `;`, is its own text; comments and
        // whitespace alone are no statement.
        let one = "INSERT INTO t VALUES (1, 'a') ";
        assert_eq!(split_statements(one).unwrap(), [one]);
        assert_eq!(split_statements(&format!("{one};  \n")).unwrap(), [one]);
        assert!(split_statements("  ").unwrap().is_empty());
        assert!(split_statements("-- nothing").unwrap().is_empty());
        assert!(split_statements(" /* nothing */ ;").unwrap().is_empty());
        assert_eq!(
            split_statements("SELECT 1 -- one; two").unwrap(),
            ["SELECT 1 -- one; two"]
        );
    }

    #[test]
    fn explain_takes_a_format() {
        let parsed = |sql| parse_statement(sql).unwrap();
        assert!(matches!(
            parsed("EXPLAIN STREAM p (FORMAT dot)"),
            Statement::ExplainStream(n, true) if n == "p"
        ));
        assert!(matches!(
            parsed("explain metric m (format TEXT)"),
            Statement::ExplainMetric(n, false) if n == "m"
        ));
        assert!(matches!(
            parsed("EXPLAIN STREAM p"),
            Statement::ExplainStream(n, false) if n == "p"
        ));
        let e = parse_statement("EXPLAIN STREAM p (FORMAT svg)").unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidParameter);
        assert!(parse_statement("EXPLAIN STREAM p (FORMAT)").is_err());
        assert!(parse_statement("EXPLAIN STREAM p q").is_err());
    }

    #[test]
    fn parses_continuous_queries() {
        let Statement::Subscribe(q) =
            parse_statement("SELECT * FROM m WHERE n > 1 emit changes").unwrap()
        else {
            panic!("not a subscription")
        };
        assert_eq!(q, "SELECT * FROM m WHERE n > 1");
        assert!(parse_statement("SELECT * FROM m EMIT CHANGES WHERE n > 1").is_err());
        let Statement::CopyOut(c) = parse_statement(
            "COPY (SELECT * FROM m EMIT CHANGES) TO STDOUT WITH (FORMAT csv, HEADER)",
        )
        .unwrap() else {
            panic!("not a COPY TO")
        };
        assert!(c.subscribe && c.csv && c.header && c.delimiter == ',');
        assert_eq!(c.query, "SELECT * FROM m");
        let Statement::CopyOut(c) = parse_statement("COPY payments TO STDOUT").unwrap() else {
            panic!("not a COPY TO")
        };
        assert!(!c.subscribe && !c.csv && c.null == "\\N");
        assert!(parse_statement("COPY (SELECT 1) TO '/tmp/x'").is_err());
        let Statement::Declare {
            name,
            query,
            subscribe,
        } = parse_statement("DECLARE C NO SCROLL CURSOR FOR SELECT * FROM p EMIT CHANGES").unwrap()
        else {
            panic!("not a DECLARE")
        };
        assert_eq!(
            (name.as_str(), query.as_str(), subscribe),
            ("c", "SELECT * FROM p", true)
        );
        let fetch = |sql: &str| match parse_statement(sql).unwrap() {
            Statement::Fetch(f) => (f.cursor, f.count, f.timeout_us),
            other => panic!("{other:?}"),
        };
        assert_eq!(fetch("FETCH c"), ("c".into(), Some(1), None));
        assert_eq!(fetch("FETCH 100 FROM c"), ("c".into(), Some(100), None));
        assert_eq!(fetch("FETCH FORWARD ALL IN c"), ("c".into(), None, None));
        assert_eq!(
            fetch("FETCH 10 FROM c WITH (timeout = '1 second')"),
            ("c".into(), Some(10), Some(1_000_000))
        );
        assert!(parse_statement("FETCH PRIOR FROM c").is_err());
        assert!(parse_statement("FETCH 1 FROM c WITH (timeout = 'soon')").is_err());
        assert!(matches!(
            parse_statement("CLOSE ALL").unwrap(),
            Statement::Close(None)
        ));
        assert!(matches!(
            parse_statement("SHOW SUBSCRIPTIONS").unwrap(),
            Statement::ShowSubscriptions
        ));
    }

    #[test]
    fn splits_on_top_level_semicolons() {
        let parts = split_statements("SELECT ';'; SELECT 2; -- done\n").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].trim(), "SELECT ';'");
    }

    #[test]
    fn parses_metric_with_window() {
        let sql = "CREATE METRIC m AS SELECT card, COUNT(*) AS n FROM payments \
                   WINDOW SLIDING (SIZE 5 MINUTES, DELAY 1 MINUTE) WHERE amount > 0 GROUP BY card";
        match parse_statement(sql).unwrap() {
            Statement::CreateMetric(m) => {
                assert_eq!(m.name, "m");
                assert_eq!(
                    m.window,
                    WindowSpec::Sliding {
                        size_us: 300_000_000,
                        delay_us: 60_000_000
                    }
                );
                assert_eq!(
                    m.select.selection.as_ref().unwrap().to_string(),
                    "amount > 0"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn window_interval_literal_and_infinite() {
        let sql =
            "CREATE METRIC m AS SELECT COUNT(*) FROM s WINDOW TUMBLING (SIZE INTERVAL '1 hour')";
        assert!(
            matches!(parse_statement(sql).unwrap(), Statement::CreateMetric(m) if m.window == WindowSpec::Tumbling { size_us: 3_600_000_000 })
        );
        let sql = "CREATE METRIC m AS SELECT COUNT(*) FROM s WINDOW INFINITE GROUP BY x";
        assert!(
            matches!(parse_statement(sql).unwrap(), Statement::CreateMetric(m) if m.window == WindowSpec::Infinite)
        );
        let sql = "CREATE METRIC m AS SELECT COUNT(*) FROM s GROUP BY x";
        assert!(parse_statement(sql).is_err());
    }

    #[test]
    fn parses_create_stream_and_drop() {
        let sql = "CREATE STREAM IF NOT EXISTS p (id BIGINT NOT NULL, ts TIMESTAMP) WITH (event_time = 'ts')";
        assert!(
            matches!(parse_statement(sql).unwrap(), Statement::CreateStream { create, .. } if create.if_not_exists)
        );
        assert!(matches!(
            parse_statement("DROP STREAM IF EXISTS p CASCADE").unwrap(),
            Statement::DropStream {
                if_exists: true,
                cascade: true,
                ..
            }
        ));
    }

    #[test]
    fn substitutes_parameters() {
        let sql = substitute_params(
            "SELECT * FROM m WHERE card = $1 AND x = '$2'",
            &["'c''1'".into()],
        )
        .unwrap();
        assert_eq!(sql, "SELECT * FROM m WHERE card = 'c''1' AND x = '$2'");
        assert_eq!(count_params("INSERT INTO s VALUES ($1, $2, $3)"), 3);
    }

    #[test]
    fn parses_alter_system() {
        let alter = |name: &str, value: Option<&str>| Statement::AlterSystem {
            name: name.into(),
            value: value.map(str::to_string),
        };
        for (sql, want) in [
            ("ALTER SYSTEM SET shards = 3", alter("shards", Some("3"))),
            (
                "alter system set Shards to 'auto'",
                alter("shards", Some("auto")),
            ),
            ("ALTER SYSTEM SET shards = DEFAULT", alter("shards", None)),
            ("ALTER SYSTEM RESET shards", alter("shards", None)),
            ("ALTER SYSTEM RESET ALL", alter("all", None)),
        ] {
            let got = parse_statement(sql).unwrap();
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "{sql}");
        }
        for bad in [
            "ALTER SYSTEM",
            "ALTER SYSTEM SET shards",
            "ALTER SYSTEM SET = 3",
        ] {
            assert!(parse_statement(bad).is_err(), "{bad}");
        }
    }

    fn access(sql: &str) -> AccessStatement {
        match parse_statement(sql).unwrap() {
            Statement::Access(a) => a,
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn role_and_grant_statements_parse() {
        assert_eq!(
            access("CREATE ROLE ana WITH LOGIN PASSWORD 'x'"),
            AccessStatement::CreateRole {
                name: "ana".into(),
                options: RoleOptions {
                    login: Some(true),
                    superuser: None,
                    password: Some(Some("x".into()))
                },
            }
        );
        assert!(
            matches!(access("create user \"Bo\""), AccessStatement::CreateRole { name, options } if name == "Bo" && options.login == Some(true))
        );
        assert_eq!(
            access("GRANT SELECT, INSERT ON STREAM pay TO ana, bo"),
            AccessStatement::Grant {
                privileges: vec![Privilege::Select, Privilege::Insert],
                target: Target::Stream("pay".into()),
                roles: vec!["ana".into(), "bo".into()],
            }
        );
        assert_eq!(
            access("REVOKE ALL PRIVILEGES ON ALL METRICS FROM ana"),
            AccessStatement::Revoke {
                privileges: vec![Privilege::Select],
                target: Target::AllMetrics,
                roles: vec!["ana".into()]
            }
        );
        assert_eq!(
            access("ALTER METRIC m OWNER TO ana"),
            AccessStatement::SetOwner {
                target: Target::Metric("m".into()),
                owner: "ana".into()
            }
        );
        assert_eq!(
            access("DROP ROLE IF EXISTS a, b"),
            AccessStatement::DropRole {
                names: vec!["a".into(), "b".into()],
                if_exists: true
            }
        );
        for bad in [
            "GRANT UPDATE ON STREAM s TO a",
            "GRANT SELECT ON TABLE s TO a",
            "CREATE ROLE a CREATEDB",
            "GRANT SELECT ON STREAM s a",
        ] {
            assert!(parse_statement(bad).is_err(), "{bad}");
        }
    }
}
