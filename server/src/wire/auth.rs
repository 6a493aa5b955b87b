//! Who may connect. Without a password Eddy trusts every connection, and so listens only
//! on loopback. With one (`EDDY_PASSWORD` or `--password-file` at start), every
//! connection authenticates with SCRAM-SHA-256: as the superuser `eddy`, or as a role of
//! the catalog with LOGIN and a PASSWORD (`CREATE ROLE`); cleartext and md5 are never
//! offered. A wrong password and an unknown user fail alike (28P01): another name gets a
//! mock salt, fixed per name, and a verifier no password matches, as PostgreSQL does.
//!
//! Passwords are kept only as SCRAM verifiers in PostgreSQL's form
//! (`SCRAM-SHA-256$iterations:salt$stored-key:server-key`): the superuser's in
//! `DATA_DIR/auth.scram`, the roles' in the catalog. A verifier proves a client's password
//! without being one: it cannot log in.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::sasl::scram::{ScramAuth, ScramSecret};
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, ServerParameterProvider,
    StartupHandler,
};
use pgwire::api::{ClientInfo, ConnectionManager};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use eddy_planner::access::SUPERUSER;

use crate::session::pg::Session;
use crate::sql::db::Db;
use crate::wire::scram::{Verifier, ITERATIONS};

/// The file that keeps the superuser's SCRAM verifier.
pub const SECRET_FILE: &str = "auth.scram";

/// The superuser's verifier, and the key mock salts are made from.
#[derive(Debug)]
pub struct Secrets {
    superuser: Verifier,
    mock_key: Vec<u8>,
}

impl Secrets {
    /// The secret kept in `data_dir`, replaced first by one made from `password` if
    /// given; `None` when there is neither (trust).
    pub fn load(data_dir: &Path, password: Option<&str>) -> anyhow::Result<Option<Arc<Secrets>>> {
        let path = data_dir.join(SECRET_FILE);
        let secrets = match password {
            Some("") => anyhow::bail!("the password is empty"),
            Some(password) => Secrets {
                superuser: Verifier::of_password(password),
                mock_key: rand::random::<[u8; 32]>().to_vec(),
            },
            None => match std::fs::read_to_string(&path) {
                Ok(text) => Secrets::decode(&text)
                    .ok_or_else(|| anyhow::anyhow!("{} is not a SCRAM secret", path.display()))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e.into()),
            },
        };
        std::fs::create_dir_all(data_dir)?;
        crate::ops::settings::replace_file(data_dir, SECRET_FILE, secrets.encode().as_bytes())?;
        Ok(Some(Arc::new(secrets)))
    }

    /// Whether `password` is the superuser's.
    pub fn accepts(&self, password: &str) -> bool {
        self.superuser.accepts(password)
    }

    /// The verifier on the first line, the mock key in hex on the second.
    fn encode(&self) -> String {
        format!("{}\n{}\n", self.superuser.encode(), hex(&self.mock_key))
    }

    fn decode(text: &str) -> Option<Secrets> {
        let mut lines = text.lines();
        let first = lines.next()?;
        if let Some(superuser) = Verifier::parse(first) {
            return Some(Secrets {
                superuser,
                mock_key: unhex(lines.next()?.trim())?,
            });
        }
        // The form before verifiers: iterations, salt, salted password and mock key in hex.
        let rest = first.trim().strip_prefix("SCRAM-SHA-256$")?;
        let mut parts = rest.split('$');
        let (iterations, salt) = parts.next()?.split_once(':')?;
        let (salt, salted) = (unhex(salt)?, unhex(parts.next()?)?);
        Some(Secrets {
            superuser: Verifier::of_salted(iterations.parse().ok()?, salt, &salted),
            mock_key: unhex(parts.next()?)?,
        })
    }

    /// What nobody's password matches, with a salt fixed per name so that nothing tells
    /// an unknown name from a real role.
    fn mock(&self, user: Option<&str>) -> ScramSecret {
        let mut salt = Vec::with_capacity(16);
        for round in 0u8..2 {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&self.mock_key, user, round).hash(&mut h);
            salt.extend_from_slice(&h.finish().to_be_bytes());
        }
        ScramSecret::Verifier {
            salt,
            iterations: ITERATIONS,
            stored_key: rand::random::<[u8; 32]>().to_vec(),
            server_key: rand::random::<[u8; 32]>().to_vec(),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Verifiers by login name: the superuser's, and the roles' of the current catalog.
#[derive(Debug)]
struct Source {
    secrets: Arc<Secrets>,
    db: Weak<Db>,
}

#[async_trait]
impl AuthSource for Source {
    async fn get_password(&self, _login: &LoginInfo) -> PgWireResult<Password> {
        Err(PgWireError::UnsupportedSASLAuthMethod(
            "cleartext".to_string(),
        ))
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let user = login.user();
        if user == Some(SUPERUSER) {
            return Ok((self.secrets.superuser.secret(), None));
        }
        let role = user.and_then(|user| {
            let catalog = self.db.upgrade()?.catalog();
            let role = catalog.access.roles.get(user)?;
            role.login
                .then(|| role.verifier.as_deref().and_then(Verifier::parse))?
        });
        Ok((
            role.map_or_else(|| self.secrets.mock(user), |v| v.secret()),
            None,
        ))
    }
}

/// The server parameters sent once a client is in, with the TimeZone it asked for (also
/// made the session's, as in PostgreSQL).
struct Parameters(Arc<Session>);

impl ServerParameterProvider for Parameters {
    fn server_parameters<C>(&self, client: &C) -> Option<HashMap<String, String>>
    where
        C: ClientInfo,
    {
        let mut params = DefaultServerParameterProvider::default().server_parameters(client)?;
        if let Some(zone) = self.0.start_settings(client.metadata()) {
            params.insert("TimeZone".to_string(), zone);
        }
        Some(params)
    }
}

/// A session's startup: trust, or SCRAM-SHA-256 when the node has a password.
pub struct Startup {
    session: Arc<Session>,
    scram: Option<SASLAuthStartupHandler<Parameters>>,
}

impl Startup {
    pub fn new(
        session: Arc<Session>,
        secrets: Option<&Arc<Secrets>>,
        manager: Arc<ConnectionManager>,
    ) -> Startup {
        let scram = secrets.map(|s| {
            let source = Source {
                secrets: s.clone(),
                db: Arc::downgrade(session.db()),
            };
            let auth = ScramAuth::new(Arc::new(source));
            SASLAuthStartupHandler::new(Arc::new(Parameters(session.clone())))
                .with_scram(auth)
                .with_connection_manager(manager)
        });
        Startup { session, scram }
    }
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let PgWireFrontendMessage::Startup(startup) = &message {
            let user = startup.parameters.get("user").cloned().unwrap_or_default();
            self.session.log_in_as(user);
        }
        match &self.scram {
            // The failure names the user the client logged in as, as PostgreSQL's does
            // (SCRAM's own user name is usually empty).
            Some(scram) => match scram.on_startup(client, message).await {
                Err(PgWireError::InvalidPassword(_)) => Err(PgWireError::InvalidPassword(
                    client.metadata().get("user").cloned().unwrap_or_default(),
                )),
                other => other,
            },
            None => {
                // Without passwords a login is trusted, but a NOLOGIN role still may
                // not log in, as in PostgreSQL.
                if let PgWireFrontendMessage::Startup(startup) = &message {
                    let user = startup.parameters.get("user").cloned().unwrap_or_default();
                    let catalog = self.session.db().catalog();
                    if catalog.access.roles.get(&user).is_some_and(|r| !r.login) {
                        return Err(PgWireError::UserError(Box::new(
                            pgwire::error::ErrorInfo::new(
                                "FATAL".to_string(),
                                "28000".to_string(),
                                format!("role \"{user}\" is not permitted to log in"),
                            ),
                        )));
                    }
                }
                self.session.on_startup(client, message).await
            }
        }
    }
}

/// The handlers of one connection: its session's, and its startup's.
pub struct Handlers {
    session: Arc<Session>,
    startup: Arc<Startup>,
    cancel: Arc<pgwire::api::cancel::DefaultCancelHandler>,
}

impl Handlers {
    pub fn new(
        db: Arc<Db>,
        manager: Arc<ConnectionManager>,
        peer: Option<tokio::net::TcpStream>,
        secrets: Option<&Arc<Secrets>>,
    ) -> Handlers {
        let cancel = Arc::new(pgwire::api::cancel::DefaultCancelHandler::new(
            manager.clone(),
        ));
        let session = Session::new(db, manager.clone(), peer, secrets.is_none());
        let startup = Arc::new(Startup::new(session.clone(), secrets, manager));
        Handlers {
            session,
            startup,
            cancel,
        }
    }
}

impl pgwire::api::PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        self.session.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        self.session.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }

    fn copy_handler(&self) -> Arc<impl pgwire::api::copy::CopyHandler> {
        self.session.clone()
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        self.cancel.clone()
    }
}
