//! Records (`wharf::store::Record`), one suite run unchanged against every backend: SQLite
//! (a file), PostgreSQL and Redis (the real servers). A backend that cannot be reached fails
//! its tests: nothing is skipped.

#[macro_use]
mod support;

use std::sync::Arc;
use std::time::Duration;

use support::unique;
use wharf::store::{NewRecord, Store, StoreError, Write, now_millis};

const WAIT: Duration = Duration::from_secs(3);
const MINUTE: i64 = 60_000;

async fn sqlite() -> Arc<dyn Store> {
    support::sqlite_with(&support::sqlite_url("records"), WAIT).await
}

async fn postgres() -> Arc<dyn Store> {
    support::postgres_with(WAIT).await
}

async fn redis() -> Arc<dyn Store> {
    support::redis_with(WAIT).await
}

fn record<'a>(namespace: &'a str, key: &'a str, value: &'a str) -> NewRecord<'a> {
    NewRecord {
        namespace,
        key,
        value,
        owner: None,
        expires_at: None,
    }
}

/// Create wins once; Replace changes only the version it read, and each write makes a new
/// version; Upsert writes whatever is there; Delete at a version deletes only that one.
async fn writes_are_conditional_on_what_is_there(store: Arc<dyn Store>) {
    let ns = unique("oauth-codes");
    let now = now_millis();
    let key = "https://client.example/metadata.json";
    let first = store
        .write_record(&record(&ns, key, "one"), Write::Create, now)
        .await
        .unwrap()
        .expect("the first create writes");
    assert_eq!(
        store
            .write_record(&record(&ns, key, "two"), Write::Create, now)
            .await
            .unwrap(),
        None,
        "a second create finds the record"
    );
    let read = store.read_record(&ns, key, now).await.unwrap().unwrap();
    assert_eq!((read.value.as_str(), read.version), ("one", first));

    let second = store
        .write_record(&record(&ns, key, "two"), Write::Replace(first), now)
        .await
        .unwrap()
        .expect("a replace at the version read writes");
    assert_ne!(second, first);
    assert_eq!(
        store
            .write_record(&record(&ns, key, "stale"), Write::Replace(first), now)
            .await
            .unwrap(),
        None,
        "a replace at an old version changes nothing"
    );
    assert_eq!(
        store
            .read_record(&ns, key, now)
            .await
            .unwrap()
            .unwrap()
            .value,
        "two"
    );
    let third = store
        .write_record(&record(&ns, key, "three"), Write::Upsert, now)
        .await
        .unwrap()
        .unwrap();
    assert!(!store.delete_record(&ns, key, Some(second)).await.unwrap());
    assert!(store.delete_record(&ns, key, Some(third)).await.unwrap());
    assert_eq!(store.read_record(&ns, key, now).await.unwrap(), None);
    assert!(!store.delete_record(&ns, key, None).await.unwrap());
    assert_eq!(
        store
            .write_record(&record(&ns, key, "x"), Write::Replace(third), now)
            .await
            .unwrap(),
        None,
        "a replace finds nothing to replace"
    );
}

/// An expired record is absent to every operation before any sweep, and a create takes its
/// place; the sweep removes it for good.
async fn expired_records_count_as_absent(store: Arc<dyn Store>) {
    let ns = unique("login");
    let now = now_millis();
    let later = now + 2 * MINUTE;
    let expiring = NewRecord {
        expires_at: Some(now + MINUTE),
        owner: Some("alice"),
        ..record(&ns, "k", "v")
    };
    let version = store
        .write_record(&expiring, Write::Create, now)
        .await
        .unwrap()
        .unwrap();
    let read = store.read_record(&ns, "k", now).await.unwrap().unwrap();
    assert_eq!(read.expires_at, Some(now + MINUTE));
    assert_eq!(read.owner.as_deref(), Some("alice"));
    assert_eq!(store.read_record(&ns, "k", later).await.unwrap(), None);
    assert_eq!(
        store
            .write_record(&expiring, Write::Replace(version), later)
            .await
            .unwrap(),
        None
    );
    assert!(
        store
            .records_of(&ns, "alice", later, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let taken = store
        .write_record(&record(&ns, "k", "new"), Write::Create, later)
        .await
        .unwrap()
        .expect("a create takes an expired record's place");
    assert_ne!(taken, version, "a version read before expiry never matches");
    assert_eq!(
        store
            .read_record(&ns, "k", later)
            .await
            .unwrap()
            .unwrap()
            .value,
        "new"
    );

    // Long expired: the sweep removes it (what a read at a time before its expiry shows).
    let past = now - 10 * MINUTE;
    let gone = NewRecord {
        expires_at: Some(past),
        ..record(&ns, "old", "v")
    };
    store
        .write_record(&gone, Write::Upsert, now)
        .await
        .unwrap()
        .unwrap();
    while store
        .read_record(&ns, "old", past - 1)
        .await
        .unwrap()
        .is_some()
    {
        store.sweep(now, 1000).await.unwrap();
    }
}

/// A user's records are listed by key, live ones only, and follow a change of owner or a
/// delete; keys with separators or URLs are kept apart exactly.
async fn records_are_listed_by_owner(store: Arc<dyn Store>) {
    let ns = unique("consent");
    let now = now_millis();
    let alice = unique("alice:with:colons");
    let bob = unique("bob");
    let put = |key: &'static str, owner: String, expires_at: Option<i64>| {
        let store = store.clone();
        let ns = ns.clone();
        async move {
            let r = NewRecord {
                owner: Some(&owner),
                expires_at,
                ..record(&ns, key, key)
            };
            store
                .write_record(&r, Write::Upsert, now)
                .await
                .unwrap()
                .unwrap()
        }
    };
    put("https://b.example/c.json", alice.clone(), None).await;
    put(
        "https://a.example/c.json",
        alice.clone(),
        Some(now + 10 * MINUTE),
    )
    .await;
    put("soon", alice.clone(), Some(now + MINUTE)).await;
    put("bobs", bob.clone(), None).await;
    let keys = |at: i64, owner: String, limit: u32| {
        let store = store.clone();
        let ns = ns.clone();
        async move {
            store
                .records_of(&ns, &owner, at, limit)
                .await
                .unwrap()
                .into_iter()
                .map(|(key, r)| {
                    assert_eq!(r.value, key);
                    assert_eq!(r.owner.as_deref(), Some(owner.as_str()));
                    key
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        keys(now, alice.clone(), 10).await,
        [
            "https://a.example/c.json",
            "https://b.example/c.json",
            "soon"
        ]
    );
    assert_eq!(
        keys(now, alice.clone(), 1).await,
        ["https://a.example/c.json"]
    );
    assert_eq!(
        keys(now + 2 * MINUTE, alice.clone(), 10).await,
        ["https://a.example/c.json", "https://b.example/c.json"]
    );
    // The record changes hands, then another goes.
    put("https://b.example/c.json", bob.clone(), None).await;
    assert!(
        store
            .delete_record(&ns, "https://a.example/c.json", None)
            .await
            .unwrap()
    );
    assert_eq!(keys(now, alice.clone(), 10).await, ["soon"]);
    assert_eq!(
        keys(now, bob.clone(), 10).await,
        ["bobs", "https://b.example/c.json"]
    );
    // Written again without an owner, it leaves its owner's list (what the authorization
    // server's revocation of every token family relies on to get past what it revoked).
    store
        .write_record(&record(&ns, "soon", "soon"), Write::Upsert, now)
        .await
        .unwrap()
        .unwrap();
    assert!(keys(now, alice.clone(), 10).await.is_empty());

    // A namespace and key that concatenate alike are different records.
    let (a, b) = (format!("{ns}:x"), ns.clone());
    store
        .write_record(&record(&a, "y", "first"), Write::Create, now)
        .await
        .unwrap()
        .unwrap();
    store
        .write_record(&record(&b, "x:y", "second"), Write::Create, now)
        .await
        .unwrap()
        .expect("not the same record");
    assert_eq!(
        store
            .read_record(&a, "y", now)
            .await
            .unwrap()
            .unwrap()
            .value,
        "first"
    );
}

/// Of many replicas creating one record at once, one wins; of many replacing the same
/// version at once, one wins.
async fn concurrent_writers_are_decided_by_the_store(store: Arc<dyn Store>) {
    let ns = unique("jti");
    let now = now_millis();
    let creates = (0..8).map(|i| {
        let (store, ns) = (store.clone(), ns.clone());
        tokio::spawn(async move {
            let value = i.to_string();
            store
                .write_record(&record(&ns, "once", &value), Write::Create, now)
                .await
                .unwrap()
        })
    });
    let won: Vec<_> = futures_util::future::join_all(creates)
        .await
        .into_iter()
        .filter_map(|r| r.unwrap())
        .collect();
    assert_eq!(won.len(), 1, "exactly one create wins");
    let replaces = (0..8).map(|i| {
        let (store, ns, version) = (store.clone(), ns.clone(), won[0]);
        tokio::spawn(async move {
            let value = format!("r{i}");
            store
                .write_record(&record(&ns, "once", &value), Write::Replace(version), now)
                .await
                .unwrap()
        })
    });
    let won = futures_util::future::join_all(replaces)
        .await
        .into_iter()
        .filter_map(|r| r.unwrap())
        .count();
    assert_eq!(won, 1, "exactly one replace wins");
}

/// Names past their limits are refused before the backend sees them.
async fn oversized_names_are_refused(store: Arc<dyn Store>) {
    let now = now_millis();
    let long_ns = "n".repeat(65);
    let err = store
        .write_record(&record(&long_ns, "k", "v"), Write::Create, now)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    let long_key = "k".repeat(2049);
    let err = store.read_record("ns", &long_key, now).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    let ns = unique("edge");
    let key = "k".repeat(2048);
    store
        .write_record(&record(&ns, &key, "v"), Write::Create, now)
        .await
        .unwrap()
        .expect("a key of exactly the limit is taken");
}

all_backends!(
    writes_are_conditional_on_what_is_there,
    expired_records_count_as_absent,
    records_are_listed_by_owner,
    concurrent_writers_are_decided_by_the_store,
    oversized_names_are_refused,
);
