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

use crate::error::{Error, ErrorKind, Result};

/// What the rules need to know of the catalog's objects.
pub trait Objects {
    fn is_stream(&self, name: &str) -> bool;
    fn is_metric(&self, name: &str) -> bool;
}

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
    /// `ALTER ROLE role SET name = value` (`value: None`: `RESET name` or `SET name TO
    /// DEFAULT`; `name: None`: `RESET ALL`). The server checks the value and writes it in
    /// its canonical form before the statement reaches the catalog.
    RoleSetting {
        role: String,
        name: Option<String>,
        value: Option<String>,
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
            AccessStatement::AlterRole { .. } | AccessStatement::RoleSetting { .. } => "ALTER ROLE",
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
    /// Each role's session defaults (`ALTER ROLE … SET`), the superuser's included.
    pub settings: BTreeMap<String, BTreeMap<String, String>>,
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

    /// The session defaults `ALTER ROLE … SET` gave `role`.
    pub fn settings_of(&self, role: &str) -> impl Iterator<Item = (&str, &str)> {
        self.settings
            .get(role)
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn is_superuser(&self, role: &str) -> bool {
        role == SUPERUSER || self.roles.get(role).is_some_and(|r| r.superuser)
    }

    fn owns(&self, role: &str, object: &str) -> bool {
        self.is_superuser(role) || self.owners.get(object).is_some_and(|o| o == role)
    }

    /// Whether `role` has what `need` asks for.
    pub fn may(&self, catalog: &dyn Objects, role: &str, need: &Need) -> bool {
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
                let (one, all) = if catalog.is_metric(object) {
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
    pub fn check(&self, catalog: &dyn Objects, role: &str, needs: &[Need]) -> Result<()> {
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
    pub fn apply(
        &mut self,
        catalog: &dyn Objects,
        stmt: &AccessStatement,
    ) -> Result<Option<String>> {
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
            AccessStatement::RoleSetting { role, name, value } => {
                if role != SUPERUSER && !self.roles.contains_key(role) {
                    return Err(undefined_role(role));
                }
                let settings = self.settings.entry(role.clone()).or_default();
                match (name, value) {
                    (Some(name), Some(value)) => {
                        settings.insert(name.clone(), value.clone());
                    }
                    (Some(name), None) => {
                        settings.remove(name);
                    }
                    (None, _) => settings.clear(),
                }
                if settings.is_empty() {
                    self.settings.remove(role);
                }
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
                    self.settings.remove(name);
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
    pub fn statements(&self, catalog: &dyn Objects) -> Vec<String> {
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
        for (role, settings) in &self.settings {
            for (name, value) in settings {
                out.push(format!(
                    "ALTER ROLE {} SET {name} = '{}'",
                    ident(role),
                    value.replace('\'', "''")
                ));
            }
        }
        for (object, owner) in &self.owners {
            let kind = if catalog.is_metric(object) {
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

fn check_target(catalog: &dyn Objects, target: &Target) -> Result<()> {
    match target {
        Target::Stream(n) if !catalog.is_stream(n) => Err(crate::error::undefined_stream(n)),
        Target::Metric(n) if !catalog.is_metric(n) => Err(Error::new(
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

fn denied(catalog: &dyn Objects, role: &str, need: &Need) -> Error {
    let kind = |object: &str| {
        if catalog.is_metric(object) {
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
