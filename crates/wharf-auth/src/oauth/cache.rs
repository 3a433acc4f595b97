//! Checked tokens, kept a short time so an agent that reuses its token is not checked (or
//! introspected) again on every call. Keyed by a SHA-256 of the token: the cache never holds
//! a token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::Accepted;
use crate::AuthError;

/// Entries kept before expired ones and refusals are dropped (and, if that is not enough,
/// the quarter that would end soonest).
const MAX_ENTRIES: usize = 10_000;

/// Times are in milliseconds since the Unix epoch: a TTL of a second must not end at the
/// next whole second.
#[derive(Debug)]
pub(crate) struct TokenCache {
    ttl: u64,
    map: Mutex<HashMap<[u8; 32], Entry>>,
}

#[derive(Debug, Clone)]
struct Entry {
    outcome: Result<Accepted, AuthError>,
    /// Milliseconds since the Unix epoch.
    until: u64,
}

impl Entry {
    /// Whether this is an accepted token that has not expired at `now` (milliseconds).
    fn accepted_at(&self, now: u64) -> bool {
        self.outcome
            .as_ref()
            .is_ok_and(|a| a.expires_at.saturating_mul(1000) > now)
    }
}

/// What the cache knows of a token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lookup {
    /// An outcome that still holds.
    Hit(Result<Accepted, AuthError>),
    /// A token accepted before, not expired, whose outcome is no longer trusted: it must be
    /// checked again (in the lane of tokens seen before).
    Lapsed,
    /// Nothing known.
    Miss,
}

pub(crate) fn key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        TokenCache {
            ttl: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// What the cache knows of `token` at `now`.
    pub(crate) fn lookup(&self, token: &str, now: u64) -> Lookup {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&key(token)) {
            // With no TTL nothing is a hit, even should the clock step back.
            Some(entry) if self.ttl > 0 && entry.until > now => Lookup::Hit(entry.outcome.clone()),
            Some(entry) if entry.accepted_at(now) => Lookup::Lapsed,
            _ => Lookup::Miss,
        }
    }

    /// Keeps an outcome: a valid token until the earlier of the TTL and its expiry (and,
    /// past that, the memory that it was accepted, until it expires: even with no TTL); a
    /// refusal that cannot change (bad signature, other issuer or audience, inactive, too
    /// few scopes) for the TTL. Refusals that time or a key rotation may lift are not
    /// kept, and any refusal ends the memory of an earlier acceptance.
    pub(crate) fn put(&self, token: &str, outcome: &Result<Accepted, AuthError>, now: u64) {
        let until = match outcome {
            Ok(c) => Some(
                now.saturating_add(self.ttl)
                    .min(c.expires_at.saturating_mul(1000)),
            ),
            // Refusals time or a key rotation may lift, and junk that costs nothing to
            // refuse again, are not kept.
            Err(
                AuthError::NotYetValid
                | AuthError::UnknownKey
                | AuthError::Unavailable
                | AuthError::Missing
                | AuthError::Malformed
                | AuthError::TokenInQuery
                | AuthError::InvalidToken
                | AuthError::UnsupportedAlgorithm,
            ) => None,
            Err(_) if self.ttl == 0 => None,
            Err(_) => Some(now.saturating_add(self.ttl)),
        };
        let key = key(token);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let Some(until) = until else {
            map.remove(&key);
            return;
        };
        if map.len() >= MAX_ENTRIES {
            make_room(&mut map, now);
        }
        map.insert(
            key,
            Entry {
                outcome: outcome.clone(),
                until,
            },
        );
    }
}

/// Frees room in a full map. Refusals go first: a flood of bad tokens must not push out
/// the good ones, nor the memory of tokens accepted before (see `Lookup::Lapsed`). Unless
/// that freed an eighth of the map, those that would end soonest (lapsed ones first) go
/// too, down to three quarters: all of them going at once would send every caller back to
/// the issuer, and a walk that freed a few places would come again within a few insertions,
/// under the lock every request takes.
fn make_room(map: &mut HashMap<[u8; 32], Entry>, now: u64) {
    map.retain(|_, e| e.accepted_at(now));
    if map.len() <= MAX_ENTRIES * 7 / 8 {
        return;
    }
    let mut by_end: Vec<([u8; 32], u64)> = map.iter().map(|(k, e)| (*k, e.until)).collect();
    let excess = map.len() - MAX_ENTRIES * 3 / 4;
    by_end.select_nth_unstable_by_key(excess, |(_, until)| *until);
    for (k, _) in &by_end[..excess] {
        map.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf::Principal;

    fn accepted(expires_at: u64) -> Result<Accepted, AuthError> {
        Ok(Accepted {
            principal: Principal::new("p").unwrap(),
            session: None,
            expires_at,
        })
    }

    /// A full cache drops expired entries and refusals first, then the quarter of valid
    /// ones that would end soonest, never all of them; an entry never outlives its token.
    #[test]
    fn a_full_cache_keeps_the_entries_that_last_longest() {
        // Long enough that every entry ends with its token: no two end at once.
        let cache = TokenCache::new(Duration::from_secs(86_400));
        let now = 1_000_000_000;
        // Tokens expiring one second apart, the first soonest.
        for n in 0..MAX_ENTRIES as u64 {
            cache.put(&format!("t{n}"), &accepted(now / 1000 + 1 + n), now);
        }
        assert!(hit(&cache, "t0", now));
        cache.put("new", &accepted(now / 1000 + 100_000), now);
        let len = cache.map.lock().unwrap().len();
        assert_eq!(len, MAX_ENTRIES * 3 / 4 + 1);
        assert!(!hit(&cache, "t0", now), "the soonest to end went");
        let last = format!("t{}", MAX_ENTRIES - 1);
        assert!(hit(&cache, &last, now), "the longest to last stayed");
        assert!(hit(&cache, "new", now));
        // Kept no longer than the token lives.
        let after = (now / 1000 + MAX_ENTRIES as u64 + 1) * 1000;
        assert_eq!(cache.lookup(&last, after), Lookup::Miss);
    }

    fn hit(cache: &TokenCache, token: &str, now: u64) -> bool {
        matches!(cache.lookup(token, now), Lookup::Hit(_))
    }

    /// A token accepted before is remembered as such once its outcome lapses, until it
    /// expires, and a full cache drops refusals before that memory.
    #[test]
    fn an_accepted_token_is_remembered_after_its_outcome_lapses() {
        let cache = TokenCache::new(Duration::from_secs(1));
        let now = 1_000_000_000;
        let expires = now / 1000 + 3600;
        cache.put("good", &accepted(expires), now);
        cache.put("bad", &Err(AuthError::Inactive), now);
        assert!(hit(&cache, "good", now + 999));
        assert_eq!(cache.lookup("good", now + 1000), Lookup::Lapsed);
        assert_eq!(cache.lookup("bad", now + 1000), Lookup::Miss);
        assert_eq!(cache.lookup("good", expires * 1000), Lookup::Miss);
        // Refusals pushed past the cap go before the lapsed entry.
        let later = now + 2000;
        for n in 0..MAX_ENTRIES {
            cache.put(&format!("junk{n}"), &Err(AuthError::Inactive), later);
        }
        assert_eq!(cache.lookup("good", later), Lookup::Lapsed);
        // Any refusal ends that memory, even one not kept.
        cache.put("good", &Err(AuthError::InvalidToken), later);
        assert_eq!(cache.lookup("good", later), Lookup::Miss);
    }

    /// With no TTL nothing is served from the cache, but what was accepted is remembered.
    #[test]
    fn without_a_ttl_only_the_memory_of_acceptance_is_kept() {
        let cache = TokenCache::new(Duration::ZERO);
        let now = 1_000_000_000;
        cache.put("good", &accepted(now / 1000 + 3600), now);
        cache.put("bad", &Err(AuthError::Inactive), now);
        assert_eq!(cache.lookup("good", now), Lookup::Lapsed);
        assert_eq!(
            cache.lookup("good", now - 1000),
            Lookup::Lapsed,
            "clock stepped back"
        );
        assert_eq!(cache.lookup("bad", now), Lookup::Miss);
    }

    /// A full cache of tokens accepted before makes room for many insertions at once: a
    /// stream of refusals must not walk the whole map at each one.
    #[test]
    fn a_full_cache_frees_room_for_many_insertions() {
        let cache = TokenCache::new(Duration::from_secs(1));
        let now = 1_000_000_000;
        for n in 0..MAX_ENTRIES - 1 {
            cache.put(&format!("t{n}"), &accepted(now / 1000 + 3600), now);
        }
        cache.put("bad0", &Err(AuthError::Inactive), now);
        cache.put("bad1", &Err(AuthError::Inactive), now + 2000);
        let len = cache.map.lock().unwrap().len();
        assert_eq!(len, MAX_ENTRIES * 3 / 4 + 1);
    }
}
