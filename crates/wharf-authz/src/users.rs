//! Local accounts: a user name and an Argon2id password hash, kept in the store so every
//! replica signs the same people in.

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::{Deserialize, Serialize};
use std::time::Duration;

use wharf::store::{Millis, Write, now_millis};

use crate::attempts::{self, Turn};
use crate::families;
use crate::records::{
    CONSENTS, DEVICES, FAMILIES, RecordError, Records, SESSIONS, UPSTREAM_PEOPLE, USERS,
    WITHDRAWN_CONSENTS, digest, secret,
};

/// The longest user name.
const MAX_NAME: usize = 64;
/// The shortest password accepted when an account is added.
pub const MIN_PASSWORD: usize = 12;

#[derive(Serialize, Deserialize)]
struct StoredUser {
    /// The PHC string of the Argon2id hash.
    hash: String,
    /// A random value renewed whenever the account is signed out everywhere (made anew,
    /// password changed): what was signed in to under another no longer counts. Compared
    /// for equality, so no clock decides it; empty for accounts made before it existed.
    #[serde(default)]
    epoch: String,
}

/// A person an upstream provider signed in, as stored under the digest of their name here
/// once an administrator signed them out: names have no length limit a key has.
#[derive(Serialize, Deserialize)]
struct StoredPerson {
    /// What [`StoredUser::epoch`] is to an account; empty until they are first signed out.
    epoch: String,
}

/// What [`Users::remove`] took away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removed {
    /// A local account, with everything of it.
    Account,
    /// What a person an upstream provider signed in (`PROVIDER:SUBJECT`) had here: their
    /// sessions, consents and tokens. They may sign in through the provider again.
    UpstreamPerson,
}

/// Why an account could not be added or checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UserError {
    /// A name outside the allowed characters or length.
    #[error(
        "a user name has 1 to {MAX_NAME} characters of A-Z, a-z, 0-9, '.', '_', '-' and '@' (a person an upstream provider signed in is named PROVIDER:SUBJECT)"
    )]
    BadName,
    /// A password too short.
    #[error("a password has at least {MIN_PASSWORD} characters")]
    ShortPassword,
    /// The name is taken.
    #[error("the user {0:?} exists already")]
    Exists(String),
    /// No account has the name.
    #[error("there is no user {0:?}")]
    Unknown(String),
    /// A person an upstream provider signed in has nothing here to sign out.
    #[error("{0:?} has no session, consent or token here")]
    NothingSignedIn(String),
    /// Another change to the account came first.
    #[error("the user {0:?} was changed at the same time; try again")]
    Concurrent(String),
    /// Hashing failed.
    #[error("password hashing failed: {0}")]
    Hash(String),
    /// The store failed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// What a sign-in attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SignIn {
    /// The password is the account's; the browser's device cookie to set, unless the
    /// store could not remember the device, and when the attempt began (the password was
    /// checked against the account as it was then).
    Accepted {
        device: Option<String>,
        epoch: String,
    },
    /// The name or the password is wrong (which one is not said).
    Refused,
    /// The attempt must wait; its password was not checked.
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
        let turn = std::sync::Arc::clone(&self.hashing)
            .acquire_owned()
            .await
            .map_err(|_| UserError::Hash("the hashing pool is closed".into()))?;
        // The turn goes with the work: a sign-in whose client went away leaves its hash
        // running, and that hash must still count against the pool.
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            work()
        })
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
            .put(
                USERS,
                name,
                &StoredUser {
                    hash,
                    epoch: secret(),
                },
                None,
                Write::Create,
                None,
            )
            .await?;
        created
            .map(drop)
            .ok_or_else(|| UserError::Exists(name.to_owned()))
    }

    /// Checks `password` for `name` from a browser that carries device cookie `device`, if
    /// any, unless the attempt must wait (see the failed sign-ins module): then the password
    /// is not even checked.
    pub(crate) async fn sign_in(
        &self,
        name: &str,
        password: &str,
        device: Option<&str>,
    ) -> Result<SignIn, UserError> {
        self.sign_in_at(name, password, device, now_millis()).await
    }

    async fn sign_in_at(
        &self,
        name: &str,
        password: &str,
        device: Option<&str>,
        now: Millis,
    ) -> Result<SignIn, UserError> {
        let account = self.account(name).await?;
        let epoch = account
            .as_ref()
            .map_or_else(String::new, |a| a.epoch.clone());
        let trusted = match device {
            Some(cookie) => attempts::device_turn(&self.records, cookie, name, &epoch).await?,
            None => None,
        };
        if trusted.is_none() {
            if let Turn::Wait(retry_after) = attempts::take_turn(&self.records, name, now).await? {
                return Ok(SignIn::Throttled { retry_after });
            }
        }
        if !self.verify(account, password).await? {
            return Ok(SignIn::Refused);
        }
        // The password was right: what is left is bookkeeping, and a store that fails it
        // is logged rather than turning a right password away.
        if trusted.is_none() {
            if let Err(err) = attempts::forget(&self.records, name).await {
                tracing::warn!(%err, "an account's failed sign-ins were not forgotten");
            }
        }
        let device = match attempts::trust(&self.records, device, name, &epoch).await {
            Ok(cookie) => Some(cookie),
            Err(err) => {
                tracing::warn!(%err, "a device was not remembered");
                None
            }
        };
        Ok(SignIn::Accepted { device, epoch })
    }

    /// Whether what `user` signed in to under account epoch `epoch` (a session, a code, a
    /// token family) still counts: for a local account, if it still exists and has not
    /// been signed out everywhere since; for a person an upstream provider signed in (a
    /// name with a ':', which no local account has), if an administrator has not signed
    /// them out since.
    pub(crate) async fn still_signed_in(&self, user: &str, epoch: &str) -> Result<bool, UserError> {
        if !is_name(user) {
            return Ok(self.upstream_epoch(user).await? == epoch);
        }
        Ok(self
            .account(user)
            .await?
            .is_some_and(|account| account.epoch == epoch))
    }

    /// The epoch a person an upstream provider signed in as `name` signs in under now.
    pub(crate) async fn upstream_epoch(&self, name: &str) -> Result<String, UserError> {
        let found = self
            .records
            .get::<StoredPerson>(UPSTREAM_PEOPLE, &digest(name))
            .await?;
        Ok(found.map(|f| f.value.epoch).unwrap_or_default())
    }

    /// The account named `name`, if there is one (and the name is one an account can have).
    async fn account(&self, name: &str) -> Result<Option<StoredUser>, UserError> {
        if !is_name(name) {
            return Ok(None);
        }
        let found = self.records.get::<StoredUser>(USERS, name).await?;
        Ok(found.map(|f| f.value))
    }

    /// Gives `name` a new password, and signs the account out everywhere: its sessions end
    /// and the tokens issued to it are revoked (what a password reset after a compromise
    /// needs), and its failed sign-ins are forgotten.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), UserError> {
        if password.chars().count() < MIN_PASSWORD {
            return Err(UserError::ShortPassword);
        }
        if !is_name(name) {
            return Err(UserError::BadName);
        }
        let found = self
            .records
            .get::<StoredUser>(USERS, name)
            .await?
            .ok_or_else(|| UserError::Unknown(name.to_owned()))?;
        let password = password.to_owned();
        let hash = self.hashing(move || hash(&password)).await?;
        // Whatever signed in under the old epoch stops counting, even what is written after
        // this (a sign-in that checked the old password a moment ago): sessions, codes,
        // token families and trusted browsers carry the epoch they were signed in under.
        let changed = StoredUser {
            hash,
            epoch: secret(),
        };
        self.records
            .put(
                USERS,
                name,
                &changed,
                None,
                Write::Replace(found.version),
                None,
            )
            .await?
            .ok_or_else(|| UserError::Concurrent(name.to_owned()))?;
        // The rest is clean-up: what it leaves behind is refused all the same.
        attempts::forget(&self.records, name).await?;
        self.sign_out_everywhere(name).await
    }

    /// Removes `name`'s account, and with it its sessions, consents, trusted browsers,
    /// failed sign-ins and the tokens issued to it. What signed in to it is refused from the
    /// moment the account is gone, so the clean-up after can fail and be run again: it is
    /// done whether the account still exists or not (the error then says it did not).
    ///
    /// For a person an upstream provider signed in (`PROVIDER:SUBJECT`), whom no account
    /// here holds, the same is done to their sessions, consents and tokens; they may sign
    /// in through the provider again (disabling them is the provider's part).
    pub async fn remove(&self, name: &str) -> Result<Removed, UserError> {
        if is_upstream_name(name) {
            return self.sign_out_upstream(name).await;
        }
        if !is_name(name) {
            return Err(UserError::BadName);
        }
        let existed = self.records.delete(USERS, name).await?;
        self.forget(name).await?;
        attempts::forget(&self.records, name).await?;
        if existed {
            Ok(Removed::Account)
        } else {
            Err(UserError::Unknown(name.to_owned()))
        }
    }

    /// Signs `name`, a person an upstream provider signed in, out everywhere, and forgets
    /// their consents.
    async fn sign_out_upstream(&self, name: &str) -> Result<Removed, UserError> {
        // Someone with nothing here is most likely a mistyped name: it is said, and no
        // epoch is kept for it.
        let mut found = false;
        for kind in [SESSIONS, CONSENTS, FAMILIES] {
            let listed = self.records.of_owner::<serde_json::Value>(kind, name, 1);
            found |= !listed.await?.is_empty();
        }
        if !found {
            return Err(UserError::NothingSignedIn(name.to_owned()));
        }
        // As a new password does for an account: whatever was signed in under the old
        // epoch stops counting, even what is written after this (a code issued a moment
        // ago, redeemed a moment later); the provider's next sign-in gets the new one.
        let person = StoredPerson { epoch: secret() };
        self.records
            .put(
                UPSTREAM_PEOPLE,
                &digest(name),
                &person,
                None,
                Write::Upsert,
                None,
            )
            .await?;
        self.forget(name).await?;
        Ok(Removed::UpstreamPerson)
    }

    /// Signs `name` out everywhere and forgets its consents (and what its grants were
    /// checked against: the epoch refuses them now).
    async fn forget(&self, name: &str) -> Result<(), UserError> {
        self.sign_out_everywhere(name).await?;
        self.records.delete_of_owner(CONSENTS, name).await?;
        self.records
            .delete_of_owner(WITHDRAWN_CONSENTS, name)
            .await?;
        Ok(())
    }

    /// Ends `name`'s sessions, forgets the browsers it signed in on and revokes its tokens.
    async fn sign_out_everywhere(&self, name: &str) -> Result<(), UserError> {
        self.records.delete_of_owner(SESSIONS, name).await?;
        self.records.delete_of_owner(DEVICES, name).await?;
        families::revoke_all(&self.records, name, None).await?;
        Ok(())
    }

    /// Whether `password` is `account`'s. No account costs the same hashing time as a
    /// wrong password, so the answer's timing does not tell which names exist.
    async fn verify(&self, account: Option<StoredUser>, password: &str) -> Result<bool, UserError> {
        let (hash, known) = match account {
            Some(user) => (user.hash, true),
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

/// A name an upstream provider's person has here, `PROVIDER:SUBJECT` (a ':' no account's
/// name has).
fn is_upstream_name(name: &str) -> bool {
    name.split_once(':')
        .is_some_and(|(provider, subject)| !provider.is_empty() && !subject.is_empty())
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
        users.add("bob", PASSWORD).await.unwrap();
        users
    }

    fn seconds(n: u64) -> SignIn {
        SignIn::Throttled {
            retry_after: Duration::from_secs(n),
        }
    }

    /// An attempt from a browser with no device cookie.
    async fn attempt(users: &Users, name: &str, password: &str, now: Millis) -> SignIn {
        users.sign_in_at(name, password, None, now).await.unwrap()
    }

    /// A sign-in that must succeed; the device cookie it sets.
    async fn accepted(users: &Users, name: &str, device: Option<&str>, now: Millis) -> String {
        match users.sign_in_at(name, PASSWORD, device, now).await.unwrap() {
            SignIn::Accepted {
                device: Some(cookie),
                ..
            } => cookie,
            other => panic!("{name}: {other:?}"),
        }
    }

    /// A hash whose caller went away (a sign-in's client disconnected) still holds its turn
    /// until it ends: the pool bounds the hashes running, not the callers waiting.
    #[tokio::test]
    async fn a_hash_keeps_its_turn_after_its_caller_goes() {
        let users = users().await;
        let (started_tx, started) = std::sync::mpsc::channel();
        let (finish, finish_rx) = std::sync::mpsc::channel::<()>();
        let caller = users.hashing(move || {
            started_tx.send(()).unwrap();
            finish_rx.recv().unwrap();
            Ok(())
        });
        let mut caller = Box::pin(caller);
        // Poll the caller until its work runs on the blocking pool, then drop it.
        tokio::select! {
            _ = &mut caller => panic!("the work cannot end before it is told to"),
            () = async {
                tokio::task::spawn_blocking(move || started.recv().unwrap()).await.unwrap()
            } => {}
        }
        drop(caller);
        assert_eq!(users.hashing.available_permits(), PARALLEL_HASHES - 1);
        finish.send(()).unwrap();
        let all = users.hashing.acquire_many(PARALLEL_HASHES as u32).await;
        assert!(all.is_ok(), "the turn came back when the hash ended");
    }

    #[tokio::test]
    async fn an_account_that_keeps_failing_is_slowed_and_a_success_forgets() {
        let users = users().await;
        let t = 1_000_000;
        for _ in 0..5 {
            assert_eq!(attempt(&users, "alice", "guess", t).await, SignIn::Refused);
        }
        assert_eq!(attempt(&users, "alice", "guess", t).await, seconds(1));
        assert_eq!(
            attempt(&users, "alice", PASSWORD, t + 400).await,
            SignIn::Throttled {
                retry_after: Duration::from_millis(600)
            },
            "the right password is not even checked while the account waits"
        );
        assert_eq!(
            attempt(&users, "alice", "guess", t + 1000).await,
            SignIn::Refused
        );
        assert_eq!(
            attempt(&users, "alice", "guess", t + 1000).await,
            seconds(2)
        );
        accepted(&users, "alice", None, t + 3000).await;
        // The success forgot the failures: five more are free.
        for _ in 0..5 {
            assert_eq!(
                attempt(&users, "alice", "guess", t + 3000).await,
                SignIn::Refused
            );
        }
        assert_eq!(
            attempt(&users, "alice", "guess", t + 3000).await,
            seconds(1)
        );
    }

    #[tokio::test]
    async fn unknown_and_malformed_names_are_slowed_like_accounts() {
        let users = users().await;
        for name in ["carol", "not a name!"] {
            for _ in 0..5 {
                assert_eq!(attempt(&users, name, PASSWORD, 0).await, SignIn::Refused);
            }
            assert_eq!(
                attempt(&users, name, PASSWORD, 0).await,
                seconds(1),
                "{name}"
            );
        }
        accepted(&users, "alice", None, 0).await;
    }

    #[tokio::test]
    async fn a_stranger_who_slows_an_account_does_not_slow_its_owners_browser() {
        let users = users().await;
        let owners = accepted(&users, "alice", None, 0).await;
        let bobs = accepted(&users, "bob", None, 0).await;
        for _ in 0..5 {
            attempt(&users, "alice", "guess", 0).await;
        }
        assert_eq!(
            attempt(&users, "alice", PASSWORD, 0).await,
            seconds(1),
            "a new browser waits"
        );
        // Bob's browser is not alice's: it waits too.
        let from_bobs = users
            .sign_in_at("alice", PASSWORD, Some(&bobs), 0)
            .await
            .unwrap();
        assert_eq!(from_bobs, seconds(1));
        // Her own browser is let through, and gets a new cookie: the old one, or a copy of
        // it, is trusted no more.
        let renewed = accepted(&users, "alice", Some(&owners), 0).await;
        assert_ne!(renewed, owners);
        let copy = users
            .sign_in_at("alice", PASSWORD, Some(&owners), 0)
            .await
            .unwrap();
        assert_eq!(copy, seconds(1));
        let owners = renewed;
        // Its own failures in a row are counted on it: after five it is trusted no more,
        // and its attempts wait with everyone else's.
        for _ in 0..5 {
            let failed = users
                .sign_in_at("alice", "guess", Some(&owners), 0)
                .await
                .unwrap();
            assert_eq!(failed, SignIn::Refused);
        }
        let distrusted = users
            .sign_in_at("alice", PASSWORD, Some(&owners), 0)
            .await
            .unwrap();
        assert_eq!(distrusted, seconds(1));
    }

    /// A live token family of `user`'s, and whether it is revoked by now.
    async fn family(users: &Users, user: &str) -> impl AsyncFn() -> bool {
        let records = users.records.clone();
        let id = crate::records::secret();
        let family = families::Family {
            client_id: "c".to_owned(),
            user: user.to_owned(),
            revoked: false,
            epoch: String::new(),
            consent: None,
        };
        let kind = crate::records::FAMILIES;
        records
            .put(kind, &id, &family, Some(user), Write::Create, None)
            .await
            .unwrap();
        async move || {
            let found = records.get::<families::Family>(kind, &id).await.unwrap();
            found.unwrap().value.revoked
        }
    }

    #[tokio::test]
    async fn a_new_password_signs_the_account_out_everywhere_and_forgets_its_failures() {
        let users = users().await;
        let device = accepted(&users, "alice", None, 0).await;
        let epoch = |name: &'static str| {
            let users = users.clone();
            async move { users.account(name).await.unwrap().unwrap().epoch }
        };
        let (before, bobs_epoch) = (epoch("alice").await, epoch("bob").await);
        let (alices, bobs) = (family(&users, "alice").await, family(&users, "bob").await);
        assert!(users.still_signed_in("alice", &before).await.unwrap());
        for _ in 0..5 {
            attempt(&users, "alice", "guess", 0).await;
        }
        let new = "another horse battery";
        users.set_password("alice", new).await.unwrap();
        assert!(alices().await && !bobs().await);
        // What signed in before counts no more, even if written after the change (the
        // clean-up cannot have found it); anyone else's still does.
        let after = epoch("alice").await;
        assert_ne!(before, after);
        assert!(!users.still_signed_in("alice", &before).await.unwrap());
        assert!(users.still_signed_in("alice", &after).await.unwrap());
        assert!(users.still_signed_in("bob", &bobs_epoch).await.unwrap());
        assert!(users.still_signed_in("Upstream:someone", "").await.unwrap());
        // Her old browser is trusted no more: its record is gone, and one written again
        // under the old epoch is not trusted either.
        let records = &users.records;
        assert!(
            attempts::device_turn(records, &device, "alice", &before)
                .await
                .unwrap()
                .is_none()
        );
        let planted = attempts::trust(records, None, "alice", &before)
            .await
            .unwrap();
        assert!(
            attempts::device_turn(records, &planted, "alice", &after)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            attempts::device_turn(records, &planted, "alice", &before)
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(
            attempt(&users, "alice", PASSWORD, 0).await,
            SignIn::Refused,
            "not throttled"
        );
        assert!(matches!(
            attempt(&users, "alice", new, 0).await,
            SignIn::Accepted { .. }
        ));
        for (name, password, expected) in [
            ("carol", new, "there is no user"),
            ("alice", "short", "at least"),
        ] {
            let err = users
                .set_password(name, password)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{err}");
        }
    }

    #[tokio::test]
    async fn a_removed_account_signs_in_no_more_and_keeps_nothing() {
        let users = users().await;
        let alices = family(&users, "alice").await;
        let consent = serde_json::json!({"client_id": "c"});
        let kind = CONSENTS;
        users
            .records
            .put(
                kind,
                "alice c",
                &consent,
                Some("alice"),
                Write::Create,
                None,
            )
            .await
            .unwrap();
        let before = users.account("alice").await.unwrap().unwrap().epoch;
        users.remove("alice").await.unwrap();
        assert!(alices().await);
        assert!(!users.still_signed_in("alice", &before).await.unwrap());
        // The name made anew is another account: nothing of the old one counts for it.
        users.add("alice", PASSWORD).await.unwrap();
        assert!(!users.still_signed_in("alice", &before).await.unwrap());
        users.remove("alice").await.unwrap();
        assert!(
            users
                .records
                .get::<serde_json::Value>(kind, "alice c")
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(attempt(&users, "alice", PASSWORD, 0).await, SignIn::Refused);
        let err = users.remove("alice").await.unwrap_err().to_string();
        assert!(err.contains("there is no user"), "{err}");
        accepted(&users, "bob", None, 0).await;
    }

    #[tokio::test]
    async fn a_person_an_upstream_provider_signed_in_is_signed_out_by_remove() {
        let users = users().await;
        let person = "Idp:12345";
        let theirs = family(&users, person).await;
        let alices = family(&users, "alice").await;
        let consent = serde_json::json!({"client_id": "c"});
        let records = &users.records;
        records
            .put(CONSENTS, "k", &consent, Some(person), Write::Create, None)
            .await
            .unwrap();
        assert!(users.still_signed_in(person, "").await.unwrap());

        assert_eq!(users.remove(person).await.unwrap(), Removed::UpstreamPerson);
        assert!(theirs().await && !alices().await);
        let gone = records.get::<serde_json::Value>(CONSENTS, "k").await;
        assert!(gone.unwrap().is_none());
        // What was signed in before counts no more, even if written after; the provider's
        // next sign-in, under the epoch it reads then, does.
        assert!(!users.still_signed_in(person, "").await.unwrap());
        let now = users.upstream_epoch(person).await.unwrap();
        assert!(!now.is_empty());
        assert!(users.still_signed_in(person, &now).await.unwrap());
        assert!(users.still_signed_in("Idp:another", "").await.unwrap());

        // Nothing left, or never anything: said, and no epoch is kept for a stranger.
        for nobody in [person, "Idp:typo"] {
            let err = users.remove(nobody).await.unwrap_err();
            assert!(matches!(err, UserError::NothingSignedIn(_)), "{err}");
        }
        assert_eq!(users.upstream_epoch("Idp:typo").await.unwrap(), "");
        assert_eq!(users.upstream_epoch(person).await.unwrap(), now);
        for bad in [":x", "Idp:", "not a name"] {
            assert!(matches!(users.remove(bad).await, Err(UserError::BadName)));
        }
    }

    #[tokio::test]
    async fn concurrent_attempts_share_one_turn() {
        let users = users().await;
        for _ in 0..5 {
            attempt(&users, "alice", "guess", 0).await;
        }
        let attempts = (0..6).map(|_| attempt(&users, "alice", "guess", 1000));
        let outcomes = futures_util::future::join_all(attempts).await;
        let checked = outcomes.iter().filter(|o| **o == SignIn::Refused).count();
        assert_eq!(checked, 1, "{outcomes:?}");
    }
}
