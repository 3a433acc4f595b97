//! Failed sign-ins counted per account name in the shared store. The per-address limit
//! alone lets many addresses, or many replicas, each guess one account's password at full
//! speed; this count slows every guess at that account wherever it comes from. The first
//! few failures are free, since people mistype; after them each attempt waits twice as
//! long as the one before, up to a cap, and a success forgets the count. Every name is
//! counted, known or not, so being slowed down does not tell which accounts exist.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wharf::store::{Millis, Write, millis};

use crate::records::{FAILED_SIGN_INS, RecordError, Records, Versioned, digest};

/// Failures an account may have before its attempts are spaced out.
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

/// Whether an attempt may check its password now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It may; it is counted as a failure until [`forget`] says otherwise.
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
                let ready = value.last.saturating_add(millis(wait(value.count)));
                if now < ready {
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
