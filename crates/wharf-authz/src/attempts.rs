//! Failed sign-ins, counted so that guessing a password is slow wherever the guesses come
//! from, without letting a stranger lock the account's owner out.
//!
//! - **Per account name**, in the shared store: the per-address limit alone lets many
//!   addresses, or many replicas, each guess one account's password at full speed. The
//!   first few failures are free, since people mistype; after them each attempt waits twice
//!   as long as the one before, up to a cap, and a success forgets the count. Every name is
//!   counted, known or not, so being slowed down does not tell which accounts exist.
//! - **Per device**: a browser an account signed in on before carries a device cookie
//!   (OWASP's "device cookies"). Its attempts at that account skip the account's count, so
//!   a stranger who keeps the account slowed down does not slow its owner; they are counted
//!   on the device instead, which stops being trusted after a few failures in a row.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wharf::store::{Millis, Write, millis};

use crate::records::{DEVICES, FAILED_SIGN_INS, RecordError, Records, Versioned, digest, secret};

/// Failures an account, or a trusted device, may have before it is slowed (an account) or
/// no longer trusted (a device).
const FREE: u32 = 5;
/// The longest wait between two attempts at one account.
const LONGEST_WAIT: Duration = Duration::from_secs(15 * 60);
/// Times an attempt re-reads the count when a concurrent attempt changed it first.
const RACES: usize = 3;

/// An account's failures, as stored (under the digest of its name).
#[derive(Debug, Serialize, Deserialize)]
struct Failures {
    count: u32,
    last: Millis,
}

/// A browser an account signed in on, as stored under the digest of its cookie.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Device {
    user: String,
    /// Failures in a row since its last success.
    failures: u32,
    /// The account's epoch when it signed in on it: a device trusted before the account
    /// was signed out everywhere is trusted no more.
    #[serde(default)]
    epoch: String,
}

/// Whether an attempt may check its password now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It may; it is counted as a failure until a success says otherwise.
    Granted,
    /// Not before this long.
    Wait(Duration),
}

/// How long after the last failure the next attempt waits, once `count` failures are in.
fn wait(count: u32) -> Duration {
    match count.checked_sub(FREE) {
        None => Duration::ZERO,
        Some(over) => Duration::from_secs(1 << over.min(10)).min(LONGEST_WAIT),
    }
}

/// Takes a turn for an attempt at `name` at time `now`. The attempt is counted before its
/// password is checked, so that attempts racing each other cannot all pass one open turn:
/// of two concurrent attempts, one writes the count and the other reads it again.
pub(crate) async fn take_turn(
    records: &Records,
    name: &str,
    now: Millis,
) -> Result<Turn, RecordError> {
    let key = digest(name);
    for _ in 0..RACES {
        let found = records.get::<Failures>(FAILED_SIGN_INS, &key).await?;
        let (count, write) = match found {
            Some(Versioned { value, version, .. }) => {
                let wait = wait(value.count);
                // Compared only when there is a wait: a replica whose clock is behind must
                // not slow an account that has none.
                let ready = value.last.saturating_add(millis(wait));
                if !wait.is_zero() && now < ready {
                    let left = u64::try_from(ready - now).unwrap_or(0);
                    return Ok(Turn::Wait(Duration::from_millis(left)));
                }
                (value.count.saturating_add(1), Write::Replace(version))
            }
            None => (1, Write::Create),
        };
        let failures = Failures { count, last: now };
        let written = records
            .put(FAILED_SIGN_INS, &key, &failures, None, write, None)
            .await?;
        if written.is_some() {
            return Ok(Turn::Granted);
        }
    }
    // Attempts at this one account keep racing each other: that is no person typing.
    Ok(Turn::Wait(Duration::from_secs(1)))
}

/// Forgets `name`'s failures, after a sign-in that succeeded.
pub(crate) async fn forget(records: &Records, name: &str) -> Result<(), RecordError> {
    records
        .delete(FAILED_SIGN_INS, &digest(name))
        .await
        .map(drop)
}

/// Takes a turn on device `cookie` for an attempt at `name`: granted (and counted, as an
/// account's turn is) when the device is one `name` signed in on under its current `epoch`
/// (not before it was last signed out everywhere), and still trusted. `None`
/// sends the attempt the account's way: an unknown or distrusted device, another account's,
/// or a concurrent attempt on the same device that counted first.
pub(crate) async fn device_turn(
    records: &Records,
    cookie: &str,
    name: &str,
    epoch: &str,
) -> Result<Option<Versioned<Device>>, RecordError> {
    let key = digest(cookie);
    let Some(found) = records.get::<Device>(DEVICES, &key).await? else {
        return Ok(None);
    };
    let device = &found.value;
    if device.user != name || device.failures >= FREE || device.epoch != epoch {
        return Ok(None);
    }
    let counted = Device {
        failures: found.value.failures + 1,
        ..found.value.clone()
    };
    let written = records
        .put(
            DEVICES,
            &key,
            &counted,
            Some(name),
            Write::Replace(found.version),
            found.expires_at,
        )
        .await?;
    Ok(written.map(|version| Versioned {
        value: counted,
        version,
        expires_at: found.expires_at,
    }))
}

/// Remembers that `name` just signed in on this browser: a fresh device cookie, trusted
/// for the kind's lifetime, which replaces the one the browser brought (`old`), so that a
/// copy of a device cookie is good until its owner next signs in, not for ever. The cookie
/// to set.
pub(crate) async fn trust(
    records: &Records,
    old: Option<&str>,
    name: &str,
    epoch: &str,
) -> Result<String, RecordError> {
    let cookie = secret();
    let device = Device {
        user: name.to_owned(),
        failures: 0,
        epoch: epoch.to_owned(),
    };
    records
        .put(
            DEVICES,
            &digest(&cookie),
            &device,
            Some(name),
            Write::Create,
            None,
        )
        .await?;
    if let Some(old) = old {
        // Best effort: the browser gets the new cookie either way, and the old one's
        // record, if it stays, expires.
        if let Err(err) = records.delete(DEVICES, &digest(old)).await {
            tracing::warn!(%err, "a replaced device cookie was not forgotten");
        }
    }
    Ok(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_after_the_free_failures_up_to_the_cap() {
        let waits: Vec<u64> = (0..20).map(|n| wait(n).as_secs()).collect();
        assert_eq!(&waits[..5], &[0; 5]);
        assert_eq!(&waits[5..11], &[1, 2, 4, 8, 16, 32]);
        assert_eq!(waits[14], 512);
        assert_eq!(waits[15], 900, "capped at 15 minutes");
        assert_eq!(wait(u32::MAX), LONGEST_WAIT);
    }
}
