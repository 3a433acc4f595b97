//! A set of versioned keys: each has an id, a time from which it seals and a time until
//! which it opens. Cursors and request states carry the id of the key that made them, so a
//! rotation never invalidates what an older key made until that key expires.

use crate::store::Millis;

/// One key of a [`KeySet`].
#[derive(Clone)]
pub(crate) struct Versioned<K> {
    pub(crate) id: String,
    /// From when it is the one that seals (the newest such key is).
    pub(crate) active_from: Millis,
    /// Until when it opens what it sealed.
    pub(crate) expires_at: Millis,
    pub(crate) key: K,
}

/// Keys by id; never empty.
#[derive(Clone)]
pub(crate) struct KeySet<K> {
    keys: Vec<Versioned<K>>,
}

impl<K> KeySet<K> {
    /// A set of one key that never expires.
    pub(crate) fn single(id: &str, key: K) -> Self {
        KeySet {
            keys: vec![Versioned {
                id: id.to_owned(),
                active_from: Millis::MIN,
                expires_at: Millis::MAX,
                key,
            }],
        }
    }

    /// A set of `keys`; `None` when there is none.
    pub(crate) fn new(keys: Vec<Versioned<K>>) -> Option<Self> {
        (!keys.is_empty()).then_some(KeySet { keys })
    }

    /// A set of rotating keys given as `(id, secret, active from, expires at)`, each key
    /// made from its secret by `make`; `None` when there is none.
    pub(crate) fn rotating<S>(
        keys: impl IntoIterator<Item = (String, S, Millis, Millis)>,
        make: impl Fn(&S) -> K,
    ) -> Option<Self> {
        let keys = keys
            .into_iter()
            .map(|(id, secret, active_from, expires_at)| Versioned {
                id,
                active_from,
                expires_at,
                key: make(&secret),
            })
            .collect();
        Self::new(keys)
    }

    /// The key that seals at `now`: the newest active one (the oldest key when none is
    /// active yet, which only a clock far behind the others' can see).
    pub(crate) fn current(&self, now: Millis) -> &Versioned<K> {
        let active = self
            .keys
            .iter()
            .filter(|k| k.active_from <= now && k.expires_at > now)
            .max_by_key(|k| k.active_from);
        active
            .or_else(|| self.keys.iter().min_by_key(|k| k.active_from))
            .unwrap_or_else(|| unreachable!("a key set is never empty"))
    }

    /// The key `id`, if it is in the set and still opens at `now`.
    pub(crate) fn opener(&self, id: &str, now: Millis) -> Option<&K> {
        self.keys
            .iter()
            .find(|k| k.id == id && k.expires_at > now)
            .map(|k| &k.key)
    }

    /// The ids, for `Debug` output that must not show the keys.
    pub(crate) fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, active_from: Millis, expires_at: Millis) -> Versioned<u8> {
        Versioned {
            id: id.into(),
            active_from,
            expires_at,
            key: id.as_bytes()[1],
        }
    }

    #[test]
    fn the_newest_active_key_seals_and_every_unexpired_key_opens() {
        let set = KeySet::new(vec![
            key("e1", 100, 250),
            key("e2", 200, 350),
            key("e3", 300, 450),
        ])
        .unwrap();
        assert_eq!(set.current(150).id, "e1");
        assert_eq!(set.current(220).id, "e2", "e2 took over at 200");
        assert_eq!(
            set.current(50).id,
            "e1",
            "a clock behind everyone's uses the oldest"
        );
        assert_eq!(
            set.opener("e1", 220),
            Some(&b'1'),
            "the overlap: e1 still opens"
        );
        assert_eq!(set.opener("e1", 250), None, "until it expires");
        assert_eq!(set.opener("e9", 220), None);
        assert!(KeySet::<u8>::new(Vec::new()).is_none());
    }
}
