//! The keys that sign cursors (and tag legacy server requests' ids) and seal request
//! states, agreed on by every replica of a store without configuration.
//!
//! Time is cut into rotation periods ("epochs"); each has one secret in the store, id
//! `e{epoch}`, added by whichever replica looks first (the store keeps the first write, so
//! all agree). A replica adds the next epoch's secret as well as the current one, so every
//! replica, refreshing several times per epoch, holds a key well before anyone signs with
//! it. A key signs during its epoch and opens what it signed until the longest a cursor, a
//! request state or a legacy server request's id lives after that (the overlap); then the
//! store sweeps it.
//!
//! Fixed keys (`ServerConfig::cursor_key`, `StateConfig::keys`) take precedence; without a
//! store each process makes random keys of its own.

use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::OnceCell;

use crate::config::ServerConfig;
use crate::cursor::{CursorCodec, CursorKey};
use crate::mrtr::StateKeys;
use crate::store::{Millis, SHARED_KEY_LEN, SharedKey, Store, StoreError, millis, now_millis};

/// The keys in use at one moment.
pub(crate) struct Ring {
    pub(crate) cursors: CursorCodec,
    pub(crate) states: StateKeys,
}

/// The server's keys, refreshed from the store when they are shared.
pub(crate) struct KeyRing {
    ring: RwLock<Arc<Ring>>,
    shared: Option<Shared>,
    loaded: OnceCell<()>,
}

/// Where shared keys come from and how they rotate.
struct Shared {
    store: Arc<dyn Store>,
    rotation: Millis,
    overlap: Millis,
    cursor_max_age: Duration,
    fixed_cursors: Option<CursorCodec>,
    fixed_states: Option<StateKeys>,
}

impl KeyRing {
    /// The keys `config` names; what it leaves open comes from `store` (or is random when
    /// there is no store).
    pub(crate) fn new(config: &ServerConfig, store: Option<&Arc<dyn Store>>) -> Self {
        let fixed_cursors = config
            .cursor_key
            .as_ref()
            .map(|k| CursorCodec::new(k, config.cursor_max_age));
        let fixed_states = config.request_state.keys.clone();
        let local = Ring {
            cursors: fixed_cursors
                .clone()
                .unwrap_or_else(|| CursorCodec::new(&CursorKey::random(), config.cursor_max_age)),
            states: fixed_states.clone().unwrap_or_else(StateKeys::random),
        };
        let all_fixed = fixed_cursors.is_some() && fixed_states.is_some();
        let shared = store.filter(|_| !all_fixed).map(|store| Shared {
            store: Arc::clone(store),
            rotation: millis(config.key_rotation.max(Duration::from_secs(1))),
            // What a key signed lives at most this long: a cursor, a request state, or
            // a legacy session's server request id (answered within the input timeout).
            overlap: millis(
                config
                    .cursor_max_age
                    .max(config.request_state.max_age)
                    .max(config.legacy.input_timeout),
            ),
            cursor_max_age: config.cursor_max_age,
            fixed_cursors,
            fixed_states,
        });
        KeyRing {
            ring: RwLock::new(Arc::new(local)),
            shared,
            loaded: OnceCell::new(),
        }
    }

    /// The keys to use now.
    pub(crate) fn get(&self) -> Arc<Ring> {
        Arc::clone(&self.ring.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Loads the shared keys the first time it is called (and starts refreshing them in the
    /// background); a no-op afterwards and for keys that are not shared.
    pub(crate) async fn ready(self: &Arc<Self>) -> Result<(), StoreError> {
        if self.shared.is_none() {
            return Ok(());
        }
        self.loaded
            .get_or_try_init(|| async {
                self.refresh().await?;
                tokio::spawn(refresh_loop(Arc::downgrade(self)));
                Ok::<(), StoreError>(())
            })
            .await
            .map(drop)
    }

    /// Reads the store's keys, adding this epoch's and the next one's when missing.
    async fn refresh(&self) -> Result<(), StoreError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let now = now_millis();
        let mut keys = shared.store.shared_keys().await?;
        let epoch = now / shared.rotation;
        let mut added = false;
        for e in [epoch, epoch + 1] {
            let id = format!("e{e}");
            let expires_at = (e + 1)
                .saturating_mul(shared.rotation)
                .saturating_add(shared.overlap);
            // Missing, or written by a replica whose states and cursors live shorter (a
            // rolling change of their lifetimes): what this one seals must outlive its own
            // expiry.
            if !keys
                .iter()
                .any(|k| k.id == id && k.expires_at >= expires_at)
            {
                shared
                    .store
                    .add_shared_key(&SharedKey {
                        id,
                        secret: rand::random(),
                        active_from: e.saturating_mul(shared.rotation),
                        expires_at,
                    })
                    .await?;
                added = true;
            }
        }
        if added {
            keys = shared.store.shared_keys().await?;
        }
        keys.retain(|k| k.expires_at > now);
        let derived = |purpose: &[u8]| {
            keys.iter()
                .map(|k| {
                    let secret = derive(&k.secret, purpose);
                    (k.id.clone(), secret, k.active_from, k.expires_at)
                })
                .collect::<Vec<_>>()
        };
        let missing = || StoreError::Corrupt("the store holds no shared key".into());
        let cursors = match &shared.fixed_cursors {
            Some(fixed) => fixed.clone(),
            None => CursorCodec::rotating(derived(b"wharf cursor v1"), shared.cursor_max_age)
                .ok_or_else(missing)?,
        };
        let states = match &shared.fixed_states {
            Some(fixed) => fixed.clone(),
            None => StateKeys::rotating(derived(b"wharf request state v1")).ok_or_else(missing)?,
        };
        *self.ring.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Ring { cursors, states });
        Ok(())
    }

    /// How often the keys are read again: several times per rotation, at least once a
    /// minute.
    fn refresh_every(&self) -> Duration {
        let rotation = self.shared.as_ref().map_or(60_000, |s| s.rotation);
        Duration::from_millis(u64::try_from(rotation / 4).unwrap_or(u64::MAX))
            .clamp(Duration::from_millis(250), Duration::from_secs(60))
    }
}

/// Refreshes the ring until the server that holds it is gone.
async fn refresh_loop(ring: Weak<KeyRing>) {
    loop {
        let Some(every) = ring.upgrade().map(|r| r.refresh_every()) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(ring) = ring.upgrade() else {
            return;
        };
        if let Err(e) = ring.refresh().await {
            // The keys held still work; the next epoch's key was loaded long before it is
            // needed.
            tracing::warn!(error = %e, "could not refresh the shared keys");
        }
    }
}

/// A key for one purpose from a shared secret: HMAC-SHA256 of the purpose under the secret,
/// a PRF keyed with 32 uniformly random bytes (so no extraction step is needed), and keys of
/// different purposes are independent.
fn derive(secret: &[u8; SHARED_KEY_LEN], purpose: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256>>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(purpose);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purposes_derive_different_keys_from_one_secret() {
        let secret = [7u8; SHARED_KEY_LEN];
        let cursor = derive(&secret, b"wharf cursor v1");
        assert_ne!(cursor, derive(&secret, b"wharf request state v1"));
        assert_eq!(cursor, derive(&secret, b"wharf cursor v1"));
        assert_ne!(cursor, secret);
    }
}
