//! SCRAM-SHA-256 verifiers in PostgreSQL's form (`SCRAM-SHA-256$iterations:salt$
//! stored-key:server-key`): what Eddy keeps of a password. A verifier proves a client's
//! password in the SCRAM exchange without being one: it cannot log in.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use pgwire::api::auth::sasl::scram::{gen_salted_password, ScramSecret};

use eddy_planner::{Error, ErrorKind};

/// SCRAM-SHA-256 iterations, PostgreSQL's default.
pub const ITERATIONS: usize = 4096;

/// A SCRAM-SHA-256 verifier.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    iterations: usize,
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier(…)")
    }
}

impl Verifier {
    /// A verifier of `password` with a fresh salt.
    pub fn of_password(password: &str) -> Verifier {
        let salt: [u8; 16] = rand::random();
        Verifier::of_salted(
            ITERATIONS,
            salt.to_vec(),
            &gen_salted_password(password, &salt, ITERATIONS),
        )
    }

    pub(crate) fn of_salted(iterations: usize, salt: Vec<u8>, salted: &[u8]) -> Verifier {
        match ScramSecret::verifier_from_salted_password(salt, salted.to_vec(), iterations) {
            ScramSecret::Verifier {
                salt,
                iterations,
                stored_key,
                server_key,
            } => Verifier {
                iterations,
                salt,
                stored_key,
                server_key,
            },
            ScramSecret::SaltedPassword { .. } => unreachable!("a verifier is made"),
        }
    }

    /// Reads PostgreSQL's form.
    pub fn parse(text: &str) -> Option<Verifier> {
        let rest = text.trim().strip_prefix("SCRAM-SHA-256$")?;
        let (head, keys) = rest.split_once('$')?;
        let (iterations, salt) = head.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let v = Verifier {
            iterations: iterations.parse().ok().filter(|n| *n > 0)?,
            salt: STANDARD.decode(salt).ok()?,
            stored_key: STANDARD.decode(stored).ok()?,
            server_key: STANDARD.decode(server).ok()?,
        };
        (v.stored_key.len() == 32 && v.server_key.len() == 32).then_some(v)
    }

    pub fn encode(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            STANDARD.encode(&self.salt),
            STANDARD.encode(&self.stored_key),
            STANDARD.encode(&self.server_key)
        )
    }

    /// Whether `password` is the one this verifies (HTTP Basic logins).
    pub fn accepts(&self, password: &str) -> bool {
        let salted = gen_salted_password(password, &self.salt, self.iterations);
        let candidate = Verifier::of_salted(self.iterations, self.salt.clone(), &salted);
        // Every byte compared, whatever the first difference.
        let diff = candidate
            .stored_key
            .iter()
            .zip(&self.stored_key)
            .fold(0u8, |d, (a, b)| d | (a ^ b));
        diff == 0 && candidate.stored_key.len() == self.stored_key.len()
    }

    pub(crate) fn secret(&self) -> ScramSecret {
        ScramSecret::Verifier {
            salt: self.salt.clone(),
            iterations: self.iterations,
            stored_key: self.stored_key.clone(),
            server_key: self.server_key.clone(),
        }
    }
}

/// The verifier a `PASSWORD '…'` clause keeps: a verifier given as such (as psql's
/// `\password` sends it), else one made from the password.
pub fn verifier_of(password: &str) -> eddy_planner::Result<String> {
    if password.starts_with("SCRAM-SHA-256$") {
        return Verifier::parse(password)
            .map(|v| v.encode())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidParameter,
                    "the password is a malformed SCRAM-SHA-256 verifier",
                )
            });
    }
    if password.len() == 35 && password.starts_with("md5") {
        return Err(Error::unsupported("md5 passwords are not supported")
            .with_hint("Give the password itself, or a SCRAM-SHA-256 verifier."));
    }
    if password.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            "the password is empty",
        ));
    }
    Ok(Verifier::of_password(password).encode())
}
