//! Roles, ownership and grants: who may do what, in PostgreSQL's words.
//!
//! - `eddy` is the built-in superuser; `CREATE ROLE … SUPERUSER` makes more.
//! - A superuser may do anything. Any role may create a stream, and owns it; the owner
//!   of a stream may create metrics on it, and owns them. Dropping or altering an
//!   object, and granting on it, take its owner or a superuser.
//! - `SELECT` on a stream or metric covers SELECT, `EMIT CHANGES` and COPY TO;
//!   `INSERT` on a stream covers INSERT (with RETURNING of its metrics) and COPY FROM.
//!   `ON ALL STREAMS` and `ON ALL METRICS` cover the objects of that kind now and later.
//! - A denied statement fails with 42501 and changes nothing.
//!
//! Passwords are kept only as SCRAM-SHA-256 verifiers (`SCRAM-SHA-256$iterations:salt$
//! stored-key:server-key`); the server turns a password into one before the statement
//! reaches the catalog. The access rules are part of the catalog, and so persist and
//! reach every node as its statements do (`Access::statements`).

use std::collections::{BTreeMap, BTreeSet};

use datafusion::sql::sqlparser::tokenizer::Token;

use crate::catalog::Catalog;
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{is_word, word_name};

/// The built-in superuser.
pub const SUPERUSER: &str = "eddy";

/// What a role may do, besides what its grants give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Role {
    pub name: String,
    pub login: bool,
    pub superuser: bool,
    /// The SCRAM-SHA-256 verifier of its password (`None`: it cannot log in with one).
    pub verifier: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Privilege {
    Select,
    Insert,
}

/// What a grant is on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Stream(String),
    Metric(String),
    AllStreams,
    AllMetrics,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    pub role: String,
    pub privilege: Privilege,
    pub target: Target,
}

/// Role attributes as a statement gives them (`None`: not given).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RoleOptions {
    pub login: Option<bool>,
    pub superuser: Option<bool>,
    /// `PASSWORD 'text'` (a password, or a SCRAM verifier) or `PASSWORD NULL`.
    pub password: Option<Option<String>>,
}

impl std::fmt::Debug for RoleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleOptions")
            .field("login", &self.login)
            .field("superuser", &self.superuser)
            .field(
                "password",
                &self.password.as_ref().map(|p| p.as_ref().map(|_| "…")),
            )
            .finish()
    }
}

/// A statement about roles and privileges.
#[derive(Clone, Debug, PartialEq)]
pub enum AccessStatement {
    CreateRole {
        name: String,
        options: RoleOptions,
    },
    AlterRole {
        name: String,
        options: RoleOptions,
    },
    DropRole {
        names: Vec<String>,
        if_exists: bool,
    },
    Grant {
        privileges: Vec<Privilege>,
        target: Target,
        roles: Vec<String>,
    },
    Revoke {
        privileges: Vec<Privilege>,
        target: Target,
        roles: Vec<String>,
    },
    /// `ALTER STREAM|METRIC name OWNER TO role`.
    SetOwner {
        target: Target,
        owner: String,
    },
}

impl AccessStatement {
    pub fn tag(&self) -> &'static str {
        match self {
            AccessStatement::CreateRole { .. } => "CREATE ROLE",
            AccessStatement::AlterRole { .. } => "ALTER ROLE",
            AccessStatement::DropRole { .. } => "DROP ROLE",
            AccessStatement::Grant { .. } => "GRANT",
            AccessStatement::Revoke { .. } => "REVOKE",
            AccessStatement::SetOwner {
                target: Target::Metric(_),
                ..
            } => "ALTER METRIC",
            AccessStatement::SetOwner { .. } => "ALTER STREAM",
        }
    }

    /// The password the statement sets, to be made a verifier before it applies.
    pub fn password_mut(&mut self) -> Option<&mut String> {
        match self {
            AccessStatement::CreateRole { options, .. }
            | AccessStatement::AlterRole { options, .. } => options.password.as_mut()?.as_mut(),
            _ => None,
        }
    }
}

/// What one statement needs of its role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    Select(String),
    Insert(String),
    Own(String),
    Superuser,
}

/// Every role, owner and grant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub roles: BTreeMap<String, Role>,
    /// Objects whose owner is not `eddy`.
    pub owners: BTreeMap<String, String>,
    pub grants: BTreeSet<Grant>,
}

impl Access {
    /// The role a login acts as: a role of the catalog, or with `trusted` (no
    /// password on the node) the superuser for any other name.
    pub fn acting<'a>(&self, login: &'a str, trusted: bool) -> &'a str {
        if trusted && !self.roles.contains_key(login) {
            SUPERUSER
        } else {
            login
        }
    }

    pub fn is_superuser(&self, role: &str) -> bool {
        role == SUPERUSER || self.roles.get(role).is_some_and(|r| r.superuser)
    }

    fn owns(&self, role: &str, object: &str) -> bool {
        self.is_superuser(role) || self.owners.get(object).is_some_and(|o| o == role)
    }

    /// Whether `role` has what `need` asks for.
    pub fn may(&self, catalog: &Catalog, role: &str, need: &Need) -> bool {
        match need {
            Need::Superuser => self.is_superuser(role),
            Need::Own(object) => self.owns(role, object),
            Need::Select(object) | Need::Insert(object) => {
                if self.owns(role, object) {
                    return true;
                }
                let privilege = match need {
                    Need::Select(_) => Privilege::Select,
                    _ => Privilege::Insert,
                };
                let (one, all) = if catalog.metrics.contains_key(object) {
                    (Target::Metric(object.clone()), Target::AllMetrics)
                } else {
                    (Target::Stream(object.clone()), Target::AllStreams)
                };
                [one, all].into_iter().any(|target| {
                    self.grants.contains(&Grant {
                        role: role.to_string(),
                        privilege,
                        target,
                    })
                })
            }
        }
    }

    /// Fails with 42501 unless `role` has every need.
    pub fn check(&self, catalog: &Catalog, role: &str, needs: &[Need]) -> Result<()> {
        if self.is_superuser(role) {
            return Ok(());
        }
        match needs.iter().find(|n| !self.may(catalog, role, n)) {
            None => Ok(()),
            Some(need) => Err(denied(catalog, role, need)),
        }
    }

    /// Applies a statement about roles or privileges to `catalog`'s objects; the tag,
    /// or a notice when it did nothing.
    pub fn apply(&mut self, catalog: &Catalog, stmt: &AccessStatement) -> Result<Option<String>> {
        match stmt {
            AccessStatement::CreateRole { name, options } => {
                if name == SUPERUSER || self.roles.contains_key(name) {
                    return Err(Error::new(
                        ErrorKind::DuplicateObject,
                        format!("role \"{name}\" already exists"),
                    ));
                }
                let mut role = Role {
                    name: name.clone(),
                    login: false,
                    superuser: false,
                    verifier: None,
                };
                set_options(&mut role, options)?;
                self.roles.insert(name.clone(), role);
            }
            AccessStatement::AlterRole { name, options } => {
                if name == SUPERUSER {
                    return Err(Error::unsupported(format!(
                        "role \"{SUPERUSER}\" cannot be altered"
                    ))
                    .with_hint(
                        "Its password is set with EDDY_PASSWORD or --password-file at start.",
                    ));
                }
                let role = self
                    .roles
                    .get_mut(name)
                    .ok_or_else(|| undefined_role(name))?;
                set_options(role, options)?;
            }
            AccessStatement::DropRole { names, if_exists } => {
                let mut skipped = Vec::new();
                for name in names {
                    if name == SUPERUSER {
                        return Err(Error::unsupported(format!(
                            "role \"{SUPERUSER}\" cannot be dropped"
                        )));
                    }
                    if !self.roles.contains_key(name) {
                        if *if_exists {
                            skipped.push(format!("role \"{name}\" does not exist, skipping"));
                            continue;
                        }
                        return Err(undefined_role(name));
                    }
                    let owned: Vec<&String> = self
                        .owners
                        .iter()
                        .filter(|(_, o)| *o == name)
                        .map(|(n, _)| n)
                        .collect();
                    if !owned.is_empty() {
                        return Err(Error::new(
                            ErrorKind::DependentObjects,
                            format!("role \"{name}\" cannot be dropped because some objects depend on it"),
                        )
                        .with_detail(format!(
                            "owner of {}",
                            owned.iter().map(|o| format!("\"{o}\"")).collect::<Vec<_>>().join(", ")
                        ))
                        .with_hint("Drop the objects, or give them to another role with ALTER STREAM … OWNER TO."));
                    }
                }
                for name in names {
                    self.roles.remove(name);
                    self.grants.retain(|g| g.role != *name);
                }
                if !skipped.is_empty() && skipped.len() == names.len() {
                    return Ok(Some(skipped.join("\n")));
                }
            }
            AccessStatement::Grant {
                privileges,
                target,
                roles,
            }
            | AccessStatement::Revoke {
                privileges,
                target,
                roles,
            } => {
                check_target(catalog, target)?;
                for role in roles {
                    if role != SUPERUSER && !self.roles.contains_key(role) {
                        return Err(undefined_role(role));
                    }
                }
                let streams = matches!(target, Target::Stream(_) | Target::AllStreams);
                if !streams && privileges.contains(&Privilege::Insert) {
                    return Err(Error::new(
                        ErrorKind::InvalidParameter,
                        "INSERT applies to streams; metrics take SELECT",
                    )
                    .with_hint("GRANT INSERT ON STREAM the_metrics_stream TO role."));
                }
                for role in roles {
                    for &privilege in privileges {
                        let grant = Grant {
                            role: role.clone(),
                            privilege,
                            target: target.clone(),
                        };
                        if matches!(stmt, AccessStatement::Grant { .. }) {
                            self.grants.insert(grant);
                        } else {
                            self.grants.remove(&grant);
                        }
                    }
                }
            }
            AccessStatement::SetOwner { target, owner } => {
                check_target(catalog, target)?;
                if owner != SUPERUSER && !self.roles.contains_key(owner) {
                    return Err(undefined_role(owner));
                }
                let name = target_name(target).to_string();
                if owner == SUPERUSER {
                    self.owners.remove(&name);
                } else {
                    self.owners.insert(name, owner.clone());
                }
            }
        }
        Ok(None)
    }

    /// Forgets the owner and grants of a dropped object.
    pub fn forget(&mut self, object: &str) {
        self.owners.remove(object);
        self.grants.retain(|g| match &g.target {
            Target::Stream(n) | Target::Metric(n) => n != object,
            _ => true,
        });
    }

    /// The statements that make these rules again, after the objects of `catalog`.
    pub fn statements(&self, catalog: &Catalog) -> Vec<String> {
        let mut out = Vec::new();
        for role in self.roles.values() {
            let mut sql = format!(
                "CREATE ROLE {} WITH {} {}",
                ident(&role.name),
                if role.login { "LOGIN" } else { "NOLOGIN" },
                if role.superuser {
                    "SUPERUSER"
                } else {
                    "NOSUPERUSER"
                }
            );
            if let Some(v) = &role.verifier {
                sql.push_str(&format!(" PASSWORD '{}'", v.replace('\'', "''")));
            }
            out.push(sql);
        }
        for (object, owner) in &self.owners {
            let kind = if catalog.metrics.contains_key(object) {
                "METRIC"
            } else {
                "STREAM"
            };
            out.push(format!(
                "ALTER {kind} {} OWNER TO {}",
                ident(object),
                ident(owner)
            ));
        }
        for g in &self.grants {
            out.push(format!(
                "GRANT {} ON {} TO {}",
                match g.privilege {
                    Privilege::Select => "SELECT",
                    Privilege::Insert => "INSERT",
                },
                match &g.target {
                    Target::Stream(n) => format!("STREAM {}", ident(n)),
                    Target::Metric(n) => format!("METRIC {}", ident(n)),
                    Target::AllStreams => "ALL STREAMS".to_string(),
                    Target::AllMetrics => "ALL METRICS".to_string(),
                },
                ident(&g.role)
            ));
        }
        out
    }
}

/// What a DDL statement needs of its role, judged from the catalog before it (`before`)
/// and after it (`after`).
pub fn ddl_needs(
    before: &Catalog,
    after: &Catalog,
    role: &str,
    stmt: &crate::sql::Statement,
) -> Vec<Need> {
    use crate::sql::Statement;
    let existing = |name: &str| {
        (before.streams.contains_key(name) || before.metrics.contains_key(name))
            .then(|| Need::Own(name.to_string()))
    };
    match stmt {
        Statement::CreateStream { .. } => Vec::new(),
        Statement::CreateMetric(m) => after
            .metric(&m.name)
            .filter(|_| before.metric(&m.name).is_none())
            .map(|def| Need::Own(def.stream.clone()))
            .into_iter()
            .collect(),
        Statement::DropStream { name, .. } | Statement::DropMetric { name, .. } => {
            existing(name).into_iter().collect()
        }
        Statement::AlterStreamAddColumn { stream, .. } => existing(stream).into_iter().collect(),
        Statement::Access(a) => match a {
            AccessStatement::AlterRole { name, options }
                if name == role && options.login.is_none() && options.superuser.is_none() =>
            {
                Vec::new()
            }
            AccessStatement::Grant { target, .. } | AccessStatement::Revoke { target, .. } => {
                match target {
                    Target::Stream(n) | Target::Metric(n) => existing(n).into_iter().collect(),
                    _ => vec![Need::Superuser],
                }
            }
            _ => vec![Need::Superuser],
        },
        _ => vec![Need::Superuser],
    }
}

fn set_options(role: &mut Role, options: &RoleOptions) -> Result<()> {
    if let Some(login) = options.login {
        role.login = login;
    }
    if let Some(superuser) = options.superuser {
        role.superuser = superuser;
    }
    if let Some(password) = &options.password {
        role.verifier = match password {
            None => None,
            Some(v) if v.starts_with("SCRAM-SHA-256$") => Some(v.clone()),
            Some(_) => {
                return Err(Error::internal("a password reached the catalog unhashed"));
            }
        };
    }
    Ok(())
}

fn check_target(catalog: &Catalog, target: &Target) -> Result<()> {
    match target {
        Target::Stream(n) if !catalog.streams.contains_key(n) => {
            Err(crate::bind::undefined_stream(n))
        }
        Target::Metric(n) if !catalog.metrics.contains_key(n) => Err(Error::new(
            ErrorKind::UndefinedTable,
            format!("metric \"{n}\" does not exist"),
        )),
        _ => Ok(()),
    }
}

fn target_name(target: &Target) -> &str {
    match target {
        Target::Stream(n) | Target::Metric(n) => n,
        Target::AllStreams | Target::AllMetrics => "",
    }
}

fn undefined_role(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedObject,
        format!("role \"{name}\" does not exist"),
    )
}

fn denied(catalog: &Catalog, role: &str, need: &Need) -> Error {
    let kind = |object: &str| {
        if catalog.metrics.contains_key(object) {
            "metric"
        } else {
            "stream"
        }
    };
    let (message, hint) = match need {
        Need::Superuser => (
            "permission denied: only a superuser may do this".to_string(),
            "Connect as a superuser (eddy).".to_string(),
        ),
        Need::Own(object) => (
            format!("must be owner of {} {object}", kind(object)),
            format!("Ask the owner of \"{object}\" or a superuser."),
        ),
        Need::Select(object) => (
            format!("permission denied for {} {object}", kind(object)),
            format!(
                "GRANT SELECT ON {} {object} TO {role};",
                kind(object).to_uppercase()
            ),
        ),
        Need::Insert(object) => (
            format!("permission denied for {} {object}", kind(object)),
            format!("GRANT INSERT ON STREAM {object} TO {role};"),
        ),
    };
    Error::new(ErrorKind::InsufficientPrivilege, message).with_hint(hint)
}

/// A name as a quoted identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Parses `CREATE|ALTER|DROP ROLE|USER`, `GRANT`, `REVOKE` and `ALTER STREAM|METRIC …
/// OWNER TO`, given the statement's tokens without whitespace.
pub fn parse(words: &[&Token]) -> Result<AccessStatement> {
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
    use crate::sql::{parse_statement, Statement};

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
