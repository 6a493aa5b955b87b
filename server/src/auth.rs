//! Who may connect. Without a password Eddy trusts every connection, and so listens only
//! on loopback. With one (`EDDY_PASSWORD` or `--password-file` at start), every
//! connection authenticates with SCRAM-SHA-256 as the superuser `eddy`; cleartext and md5
//! are never offered. A wrong password and an unknown user fail alike (28P01): another
//! name gets a mock salt, fixed per name, and a secret no password matches, as
//! PostgreSQL does.
//!
//! The secret is kept in `DATA_DIR/auth.scram`: the salt, the iteration count and the
//! salted password (what pgwire's SCRAM verifier derives its keys from), never the
//! password; a password given at start replaces it.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::sasl::scram::{gen_salted_password, ScramAuth};
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, ServerParameterProvider,
    StartupHandler,
};
use pgwire::api::{ClientInfo, ConnectionManager};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use crate::pg::Session;

/// The superuser, the only role until roles exist.
pub const SUPERUSER: &str = "eddy";
/// SCRAM-SHA-256 iterations, PostgreSQL's default.
pub const ITERATIONS: usize = 4096;
/// The file that keeps the superuser's SCRAM secret.
pub const SECRET_FILE: &str = "auth.scram";

/// The superuser's SCRAM secret, and the key mock salts are made from.
#[derive(Debug)]
pub struct Secrets {
    salt: Vec<u8>,
    iterations: usize,
    salted: Vec<u8>,
    mock_key: Vec<u8>,
}

impl Secrets {
    /// The secret kept in `data_dir`, replaced first by one made from `password` if
    /// given; `None` when there is neither (trust).
    pub fn load(data_dir: &Path, password: Option<&str>) -> anyhow::Result<Option<Arc<Secrets>>> {
        let path = data_dir.join(SECRET_FILE);
        if let Some(password) = password {
            if password.is_empty() {
                anyhow::bail!("the password is empty");
            }
            let salt: [u8; 16] = rand::random();
            let mock_key: [u8; 32] = rand::random();
            let secrets = Secrets {
                salted: gen_salted_password(password, &salt, ITERATIONS),
                salt: salt.to_vec(),
                iterations: ITERATIONS,
                mock_key: mock_key.to_vec(),
            };
            std::fs::create_dir_all(data_dir)?;
            crate::settings::replace_file(data_dir, SECRET_FILE, secrets.encode().as_bytes())?;
            return Ok(Some(Arc::new(secrets)));
        }
        match std::fs::read_to_string(&path) {
            Ok(text) => Secrets::decode(&text)
                .map(|s| Some(Arc::new(s)))
                .ok_or_else(|| anyhow::anyhow!("{} is not a SCRAM secret", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `SCRAM-SHA-256$iterations:salt$salted$mock-key`, in hex.
    fn encode(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}${}\n",
            self.iterations,
            hex(&self.salt),
            hex(&self.salted),
            hex(&self.mock_key)
        )
    }

    fn decode(text: &str) -> Option<Secrets> {
        let rest = text.trim().strip_prefix("SCRAM-SHA-256$")?;
        let mut parts = rest.split('$');
        let (iterations, salt) = parts.next()?.split_once(':')?;
        Some(Secrets {
            iterations: iterations.parse().ok()?,
            salt: unhex(salt)?,
            salted: unhex(parts.next()?)?,
            mock_key: unhex(parts.next()?)?,
        })
    }

    /// What a login as `user` is checked against.
    fn password_of(&self, user: Option<&str>) -> Password {
        if user == Some(SUPERUSER) {
            return Password::new(Some(self.salt.clone()), self.salted.clone());
        }
        // The same salt for a name each time, so nothing tells it from a real role.
        let mut salt = Vec::with_capacity(16);
        for round in 0u8..2 {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&self.mock_key, user, round).hash(&mut h);
            salt.extend_from_slice(&h.finish().to_be_bytes());
        }
        let nothing: [u8; 32] = rand::random();
        Password::new(Some(salt), nothing.to_vec())
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

#[derive(Debug)]
struct Source(Arc<Secrets>);

#[async_trait]
impl AuthSource for Source {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        Ok(self.0.password_of(login.user()))
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
        if let Some(zone) = self.0.startup_time_zone(client.metadata()) {
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
            let mut auth = ScramAuth::new(Arc::new(Source(s.clone())));
            auth.set_iterations(s.iterations);
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
        match &self.scram {
            // The failure names the user the client logged in as, as PostgreSQL's does
            // (SCRAM's own user name is usually empty).
            Some(scram) => match scram.on_startup(client, message).await {
                Err(PgWireError::InvalidPassword(_)) => Err(PgWireError::InvalidPassword(
                    client.metadata().get("user").cloned().unwrap_or_default(),
                )),
                other => other,
            },
            None => self.session.on_startup(client, message).await,
        }
    }
}
