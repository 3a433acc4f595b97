//! Local accounts: a user name and an Argon2id password hash, kept in the store so every
//! replica signs the same people in.

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::{Deserialize, Serialize};
use std::time::Duration;

use wharf::store::{Millis, Write, now_millis};

use crate::attempts::{self, Turn};
use crate::records::{RecordError, Records, USERS};

/// The longest user name.
const MAX_NAME: usize = 64;
/// The shortest password accepted when an account is added.
pub const MIN_PASSWORD: usize = 12;

#[derive(Serialize, Deserialize)]
struct StoredUser {
    /// The PHC string of the Argon2id hash.
    hash: String,
}

/// Why an account could not be added or checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UserError {
    /// A name outside the allowed characters or length.
    #[error("a user name has 1 to {MAX_NAME} characters of A-Z, a-z, 0-9, '.', '_', '-' and '@'")]
    BadName,
    /// A password too short.
    #[error("a password has at least {MIN_PASSWORD} characters")]
    ShortPassword,
    /// The name is taken.
    #[error("the user {0:?} exists already")]
    Exists(String),
    /// Hashing failed.
    #[error("password hashing failed: {0}")]
    Hash(String),
    /// The store failed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// What a sign-in attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignIn {
    /// The password is the account's.
    Accepted,
    /// The name or the password is wrong (which one is not said).
    Refused,
    /// The account failed too often lately; its password was not checked.
    Throttled {
        /// How long until the next attempt is checked.
        retry_after: Duration,
    },
}

/// Argon2 verifications running at once at most: each takes tens of milliseconds and 19 MiB,
/// on blocking threads, so a burst of sign-ins queues here instead of starving the server.
const PARALLEL_HASHES: usize = 4;

/// The local accounts.
#[derive(Debug, Clone)]
pub struct Users {
    records: Records,
    hashing: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Users {
    /// The accounts kept in `store`.
    pub fn new(store: std::sync::Arc<dyn wharf::store::Store>) -> Self {
        Self::from_records(Records::new(store))
    }

    pub(crate) fn from_records(records: Records) -> Self {
        Self {
            records,
            hashing: std::sync::Arc::new(tokio::sync::Semaphore::new(PARALLEL_HASHES)),
        }
    }

    /// Runs `work` (a password hash or check) on a blocking thread, a few at a time.
    async fn hashing<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, UserError> + Send + 'static,
    ) -> Result<T, UserError> {
        let _turn = self
            .hashing
            .acquire()
            .await
            .map_err(|_| UserError::Hash("the hashing pool is closed".into()))?;
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|err| UserError::Hash(err.to_string()))?
    }

    /// Adds an account; refuses a name that exists.
    pub async fn add(&self, name: &str, password: &str) -> Result<(), UserError> {
        if !is_name(name) {
            return Err(UserError::BadName);
        }
        if password.chars().count() < MIN_PASSWORD {
            return Err(UserError::ShortPassword);
        }
        let password = password.to_owned();
        let hash = self.hashing(move || hash(&password)).await?;
        let created = self
            .records
            .put(USERS, name, &StoredUser { hash }, None, Write::Create, None)
            .await?;
        created
            .map(drop)
            .ok_or_else(|| UserError::Exists(name.to_owned()))
    }

    /// Checks `password` for `name`, unless that account has failed too often lately (see
    /// the failed sign-ins module): then the password is not even checked.
    pub async fn sign_in(&self, name: &str, password: &str) -> Result<SignIn, UserError> {
        self.sign_in_at(name, password, now_millis()).await
    }

    async fn sign_in_at(
        &self,
        name: &str,
        password: &str,
        now: Millis,
    ) -> Result<SignIn, UserError> {
        if let Turn::Wait(retry_after) = attempts::take_turn(&self.records, name, now).await? {
            return Ok(SignIn::Throttled { retry_after });
        }
        if !self.verify(name, password).await? {
            return Ok(SignIn::Refused);
        }
        attempts::forget(&self.records, name).await?;
        Ok(SignIn::Accepted)
    }

    /// Whether `password` is `name`'s. An unknown name costs the same hashing time as a
    /// wrong password, so the answer's timing does not tell which names exist.
    async fn verify(&self, name: &str, password: &str) -> Result<bool, UserError> {
        let stored = if is_name(name) {
            self.records.get::<StoredUser>(USERS, name).await?
        } else {
            None
        };
        let (hash, known) = match stored {
            Some(user) => (user.value.hash, true),
            None => (DUMMY_HASH.to_owned(), false),
        };
        let password = password.to_owned();
        let matches = self
            .hashing(move || {
                let parsed =
                    PasswordHash::new(&hash).map_err(|err| UserError::Hash(err.to_string()))?;
                Ok(Argon2::default()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok())
            })
            .await?;
        Ok(known && matches)
    }
}

fn is_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
}

fn hash(password: &str) -> Result<String, UserError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|err| UserError::Hash(err.to_string()))
}

/// An Argon2id hash (default parameters) of a random password nobody knows, verified
/// against when the user does not exist.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$4zN2Q0Yz7mT0oB2u3xg9wq0VYH0c2b3a8m8o1k3r4s0";

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORD: &str = "correct horse battery";

    async fn users() -> Users {
        let options = wharf_store::StoreOptions::default();
        let store = wharf_store::open("memory://", &options).await.unwrap();
        let users = Users::new(store);
        users.add("alice", PASSWORD).await.unwrap();
        users
    }

    fn seconds(n: u64) -> SignIn {
        SignIn::Throttled {
            retry_after: Duration::from_secs(n),
        }
    }

    #[tokio::test]
    async fn an_account_that_keeps_failing_is_slowed_and_a_success_forgets() {
        let users = users().await;
        let t = 1_000_000;
        for _ in 0..5 {
            assert_eq!(
                users.sign_in_at("alice", "guess", t).await.unwrap(),
                SignIn::Refused
            );
        }
        assert_eq!(
            users.sign_in_at("alice", "guess", t).await.unwrap(),
            seconds(1)
        );
        assert_eq!(
            users.sign_in_at("alice", PASSWORD, t + 400).await.unwrap(),
            SignIn::Throttled {
                retry_after: Duration::from_millis(600)
            },
            "the right password is not even checked while the account waits"
        );
        assert_eq!(
            users.sign_in_at("alice", "guess", t + 1000).await.unwrap(),
            SignIn::Refused
        );
        assert_eq!(
            users.sign_in_at("alice", "guess", t + 1000).await.unwrap(),
            seconds(2)
        );
        assert_eq!(
            users.sign_in_at("alice", PASSWORD, t + 3000).await.unwrap(),
            SignIn::Accepted
        );
        // The success forgot the failures: five more are free.
        for _ in 0..5 {
            assert_eq!(
                users.sign_in_at("alice", "guess", t + 3000).await.unwrap(),
                SignIn::Refused
            );
        }
        assert_eq!(
            users.sign_in_at("alice", "guess", t + 3000).await.unwrap(),
            seconds(1)
        );
    }

    #[tokio::test]
    async fn unknown_and_malformed_names_are_slowed_like_accounts() {
        let users = users().await;
        for name in ["bob", "not a name!"] {
            for _ in 0..5 {
                assert_eq!(
                    users.sign_in_at(name, PASSWORD, 0).await.unwrap(),
                    SignIn::Refused
                );
            }
            assert_eq!(
                users.sign_in_at(name, PASSWORD, 0).await.unwrap(),
                seconds(1),
                "{name}"
            );
        }
        assert_eq!(
            users.sign_in_at("alice", PASSWORD, 0).await.unwrap(),
            SignIn::Accepted,
            "each name has its own count"
        );
    }

    #[tokio::test]
    async fn concurrent_attempts_share_one_turn() {
        let users = users().await;
        for _ in 0..5 {
            users.sign_in_at("alice", "guess", 0).await.unwrap();
        }
        let attempts = (0..6).map(|_| users.sign_in_at("alice", "guess", 1000));
        let outcomes = futures_util::future::join_all(attempts).await;
        let checked = outcomes
            .iter()
            .filter(|o| *o.as_ref().unwrap() == SignIn::Refused)
            .count();
        assert_eq!(checked, 1, "{outcomes:?}");
    }
}
