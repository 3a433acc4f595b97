//! What replicas share through the store besides data: the keys they sign cursors and seal
//! request states with (every backend), and the bus change notifications travel on
//! (PostgreSQL and Redis, against the real servers; two stores opened on one database stand
//! for two replicas).

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use wharf::ChangeEvent;
use wharf::store::{SharedKey, Store, TxMode, now_millis};

const WAIT: Duration = Duration::from_secs(3);

/// The bus tests cut every listening connection of their backend: one at a time, so that
/// no test sees its streams end because of another.
static BUS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn key(id: &str, byte: u8, expires_at: i64) -> SharedKey {
    SharedKey {
        id: id.to_owned(),
        secret: [byte; 32],
        active_from: now_millis() - 1000,
        expires_at,
    }
}

async fn shared_keys_keep_the_first_write_and_go_when_expired(store: Arc<dyn Store>) {
    let live = support::unique("live");
    let gone = support::unique("gone");
    let far = now_millis() + 3_600_000;
    store.add_shared_key(&key(&live, 1, far)).await.unwrap();
    // A second replica racing for the same id keeps the first one's secret.
    store.add_shared_key(&key(&live, 2, far)).await.unwrap();
    store
        .add_shared_key(&key(&gone, 3, now_millis() - 1))
        .await
        .unwrap();
    let keys = store.shared_keys().await.unwrap();
    let found = keys.iter().find(|k| k.id == live).expect("the key is kept");
    assert_eq!(found.secret, [1; 32], "the first write wins");
    assert_eq!(found.expires_at, far);
    assert!(keys.iter().any(|k| k.id == gone));
    // A replica whose states live longer extends the key, its secret kept; a shorter
    // expiry never shortens it.
    store
        .add_shared_key(&key(&live, 4, far + 1_000))
        .await
        .unwrap();
    store
        .add_shared_key(&key(&live, 5, far - 1_000))
        .await
        .unwrap();
    let keys = store.shared_keys().await.unwrap();
    let found = keys.iter().find(|k| k.id == live).unwrap();
    assert_eq!(found.secret, [1; 32], "the secret stays the first write's");
    assert_eq!(found.expires_at, far + 1_000, "the later expiry");
    store.sweep(now_millis(), 500).await.unwrap();
    let keys = store.shared_keys().await.unwrap();
    assert!(keys.iter().any(|k| k.id == live), "an unexpired key stays");
    assert!(
        !keys.iter().any(|k| k.id == gone),
        "an expired key is swept"
    );
}

#[tokio::test]
async fn sqlite_shared_keys_keep_the_first_write_and_go_when_expired() {
    let store = support::sqlite_with(&support::sqlite_url("shared-keys"), WAIT).await;
    shared_keys_keep_the_first_write_and_go_when_expired(store).await;
}

#[tokio::test]
async fn postgres_shared_keys_keep_the_first_write_and_go_when_expired() {
    shared_keys_keep_the_first_write_and_go_when_expired(support::postgres_with(WAIT).await).await;
}

#[tokio::test]
async fn redis_shared_keys_keep_the_first_write_and_go_when_expired() {
    shared_keys_keep_the_first_write_and_go_when_expired(support::redis_with(WAIT).await).await;
}

/// Waits until `store`'s bus listens.
async fn listening(store: &Arc<dyn Store>) {
    let bus = store.bus().expect("a shared store has a bus");
    support::wait_until("the bus listens", Duration::from_secs(10), async || {
        bus.is_connected()
    })
    .await;
}

async fn next(
    rx: &mut tokio::sync::broadcast::Receiver<ChangeEvent>,
) -> Result<ChangeEvent, RecvError> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event or the end in time")
}

/// Reads `rx` until `event` arrives (within the usual time each), every event before it
/// shown to `before`.
async fn until_heard(
    rx: &mut tokio::sync::broadcast::Receiver<ChangeEvent>,
    event: &ChangeEvent,
    mut before: impl FnMut(&ChangeEvent),
) {
    loop {
        let heard = next(rx).await.expect("open");
        if heard == *event {
            return;
        }
        before(&heard);
    }
}

/// Events published on one replica reach the subscribers of every replica, the publisher's
/// own included; a lost listening connection ends the open receivers (they may have missed
/// events), and the bus listens again by itself.
async fn events_reach_every_replica_and_an_outage_ends_open_streams(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    kill_listeners: impl AsyncFnOnce(),
) {
    listening(&a).await;
    listening(&b).await;
    let (bus_a, bus_b) = (a.bus().unwrap(), b.bus().unwrap());
    let mut on_a = bus_a.subscribe();
    let mut on_b = bus_b.subscribe();
    let uri = format!("dataset://{}", support::unique("ds"));
    let private = ChangeEvent::PrivateResourceUpdated {
        uri: uri.clone(),
        principal: "user 42".into(),
    };
    bus_b.publish(private.clone()).await.unwrap();
    // Other tests may publish on the same channel: skip what is not ours.
    let ours = async |rx: &mut tokio::sync::broadcast::Receiver<ChangeEvent>| loop {
        let event = next(rx).await.expect("open");
        if event == private {
            return;
        }
    };
    ours(&mut on_a).await;
    ours(&mut on_b).await;

    // The listening connections are cut: every open stream ends.
    kill_listeners().await;
    for rx in [&mut on_a, &mut on_b] {
        loop {
            match next(rx).await {
                Ok(_) => continue,
                Err(RecvError::Closed) => break,
                Err(RecvError::Lagged(_)) => continue,
            }
        }
    }
    listening(&a).await;
    listening(&b).await;
    let mut again = bus_a.subscribe();
    bus_b
        .publish(ChangeEvent::ResourceUpdated { uri: uri.clone() })
        .await
        .unwrap();
    until_heard(&mut again, &ChangeEvent::ResourceUpdated { uri }, |_| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_events_reach_every_replica_and_an_outage_ends_open_streams() {
    let _one_at_a_time = BUS.lock().await;
    let (a, b) = (
        support::postgres_with(WAIT).await,
        support::postgres_with(WAIT).await,
    );
    events_reach_every_replica_and_an_outage_ends_open_streams(a, b, async || {
        let pool = support::pg_observer().await;
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query LIKE 'LISTEN %wharf_changes%' AND pid <> pg_backend_pid()) k",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(killed >= 2, "both listening sessions were found ({killed})");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_events_reach_every_replica_and_an_outage_ends_open_streams() {
    let _one_at_a_time = BUS.lock().await;
    let (a, b) = (
        support::redis_with(WAIT).await,
        support::redis_with(WAIT).await,
    );
    events_reach_every_replica_and_an_outage_ends_open_streams(a, b, async || {
        let mut conn = support::raw_redis().await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            killed >= 2,
            "both listening connections were found ({killed})"
        );
    })
    .await;
}

/// A receiver of `store`'s bus that the gap of its first connection cannot close: the one
/// that hears a marker `publisher` sent after it was taken.
async fn past_the_first_gap(
    store: &Arc<dyn Store>,
    publisher: &Arc<dyn Store>,
) -> tokio::sync::broadcast::Receiver<ChangeEvent> {
    listening(store).await;
    loop {
        let mut heard = store.bus().unwrap().subscribe();
        let marker = format!("dataset://{}", support::unique("marker"));
        let event = ChangeEvent::ResourceUpdated { uri: marker };
        publisher
            .bus()
            .unwrap()
            .publish(event.clone())
            .await
            .unwrap();
        loop {
            match next(&mut heard).await {
                Ok(heard_now) if heard_now == event => return heard,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            }
        }
    }
}

/// Two replicas (two stores opened by `open` on one database), and a receiver of the
/// second's bus past its first gap (open while the second is kept).
async fn replicas<F: Future<Output = Arc<dyn Store>>>(
    open: impl Fn(Duration) -> F,
) -> (
    Arc<dyn Store>,
    Arc<dyn Store>,
    tokio::sync::broadcast::Receiver<ChangeEvent>,
) {
    let (a, b) = (open(WAIT).await, open(WAIT).await);
    let on_b = past_the_first_gap(&b, &a).await;
    (a, b, on_b)
}

/// What a call announces travels with its Redis commit: every replica hears it once the
/// commit applies, and nothing of a transaction rolled back or of a commit whose writes
/// stopped part-way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_commit_carries_its_announcements_and_only_a_commit_does() {
    let _one_at_a_time = BUS.lock().await;
    let (a, _b, mut on_b) = replicas(support::redis_with).await;
    let uri = |what: &str| ChangeEvent::ResourceUpdated {
        uri: format!("dataset://{}", support::unique(what)),
    };
    let (rolled_back, failed, committed) = (uri("rolled-back"), uri("failed"), uri("committed"));

    let mut tx = a.begin(TxMode::Write).await.unwrap();
    assert!(tx.announce_with_commit(std::slice::from_ref(&rolled_back)));
    drop(tx);
    let mut tx = a.begin(TxMode::Write).await.unwrap();
    assert!(tx.announce_with_commit(std::slice::from_ref(&failed)));
    let key = support::unique("announce:string");
    let redis = tx
        .backend_tx()
        .downcast_mut::<wharf_store::redis::RedisTx>()
        .unwrap();
    redis.queue(["SET", key.as_str(), "a string"]).unwrap();
    // A list command on a string: refused after the SET applied.
    redis.queue(["RPUSH", key.as_str(), "row"]).unwrap();
    tx.commit().await.expect_err("a write refused part-way");
    let mut tx = a.begin(TxMode::Write).await.unwrap();
    assert!(tx.announce_with_commit(std::slice::from_ref(&committed)));
    tx.commit().await.unwrap();

    // The channel keeps one order: what the first two sent would come before the third.
    until_heard(&mut on_b, &committed, |event| {
        assert!(
            *event != rolled_back && *event != failed,
            "{event:?} was announced without a commit"
        );
    })
    .await;
}

/// A publish Redis refuses (here an ACL user without `PUBLISH`) does not undo the commit
/// that carried it: the writes stand, and the replica's streams are told of a gap, as when
/// its bus cannot publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_refused_publish_leaves_the_commit_and_is_a_gap() {
    let _one_at_a_time = BUS.lock().await;
    let user = AclUser(support::unique("nopub"));
    let mut admin = support::raw_redis().await;
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                user.0.as_str(),
                "reset",
                "on",
                "nopass",
                "~*",
                "&*",
                "+@all",
                "-publish",
            ][..],
        )
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let base = support::redis_url();
    let rest = base
        .strip_prefix("redis://")
        .filter(|rest| !rest.contains('@'))
        .expect("a redis:// URL without credentials");
    // A password, any (the user has none), or the client does not authenticate at all.
    let store = wharf_store::open(
        &format!("redis://{}:any@{rest}", user.0),
        &support::options(WAIT),
    )
    .await
    .unwrap();
    let mut heard = past_the_first_gap(&store, &support::redis_with(WAIT).await).await;
    let key = support::unique("announce:kept");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert!(tx.announce_with_commit(&[ChangeEvent::ResourceUpdated {
        uri: format!("dataset://{key}"),
    }]));
    tx.backend_tx()
        .downcast_mut::<wharf_store::redis::RedisTx>()
        .unwrap()
        .queue(["SET", key.as_str(), "kept"])
        .unwrap();
    tx.commit()
        .await
        .expect("the writes do not depend on the publish");
    let kept: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(kept.as_deref(), Some("kept"));
    // Told at once (a connection's silence would take 30 s); other tests' news may come
    // first, this change never does.
    let announced = ChangeEvent::ResourceUpdated {
        uri: format!("dataset://{key}"),
    };
    loop {
        match next(&mut heard).await {
            Err(RecvError::Closed) => break,
            Ok(event) => assert_ne!(event, announced, "published though refused"),
            Err(RecvError::Lagged(_)) => {}
        }
    }
}

/// A Redis ACL user, deleted however the test that made it ends.
struct AclUser(String);

impl Drop for AclUser {
    fn drop(&mut self) {
        let client = redis::Client::open(support::redis_url()).expect("the Redis URL");
        if let Ok(mut conn) = client.get_connection() {
            let _ = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&self.0)
                .query::<i64>(&mut conn);
        }
    }
}

/// SQLite's commits carry no announcements (it keeps to one process, with no bus): the
/// core announces them itself.
#[tokio::test]
async fn sqlite_commits_carry_no_announcements() {
    let store = support::sqlite_with(&support::sqlite_url("announce"), WAIT).await;
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert!(!tx.announce_with_commit(&[ChangeEvent::ToolsListChanged]));
}

/// Rows of PostgreSQL's announcements table that hold `uri`.
async fn pg_announcements_of(pool: &sqlx::PgPool, uri: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM wharf_announcements WHERE payload = $1")
        .bind(format!("u {uri}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A replica whose calls hold every connection of its pool (long handlers in their
/// transactions) still answers its readiness ping: busy is what admission answers calls,
/// and a fleet under load must not leave the balancer all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_pool_the_calls_hold_whole_still_answers_the_ping() {
    let mut options = support::options(Duration::from_secs(5));
    options.max_connections = 1;
    let store = wharf_store::open(&support::pg_url(), &options)
        .await
        .expect("PostgreSQL");
    let held = store.begin(TxMode::Write).await.unwrap();
    // A hang guard: without a connection of its own, the ping waits for the pool's 30 s.
    let pinged = tokio::time::timeout(Duration::from_secs(20), store.ping()).await;
    assert!(matches!(pinged, Ok(Ok(()))), "{pinged:?}");
    drop(held);
}

/// What a call announces travels with its PostgreSQL commit: written in its transaction,
/// published once the commit answered (and its row deleted), nothing of a transaction rolled
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_commit_carries_its_announcements_and_only_a_commit_does() {
    let _one_at_a_time = BUS.lock().await;
    let (a, _b, mut on_b) = replicas(support::postgres_with).await;
    let uri = |what: &str| format!("dataset://{}", support::unique(what));
    let (rolled_back, committed) = (uri("rolled-back"), uri("committed"));
    let updated = |uri: &str| ChangeEvent::ResourceUpdated {
        uri: uri.to_owned(),
    };

    let mut tx = a.begin(TxMode::Write).await.unwrap();
    assert!(tx.announce_with_commit(&[updated(&rolled_back)]));
    drop(tx);
    let mut tx = a.begin(TxMode::Write).await.unwrap();
    assert!(tx.announce_with_commit(&[updated(&committed)]));
    tx.commit().await.unwrap();
    until_heard(&mut on_b, &updated(&committed), |event| {
        assert_ne!(*event, updated(&rolled_back), "announced without a commit");
    })
    .await;
    // Published with its row's deletion, in one transaction.
    let pool = support::pg_observer().await;
    assert_eq!(pg_announcements_of(&pool, &committed).await, 0, "published");
    assert_eq!(pg_announcements_of(&pool, &rolled_back).await, 0);
}

/// An announcement PostgreSQL cannot store (a NUL in its URI) does not fail the writes: it
/// goes out as a gap, which ends every open stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_announcement_it_cannot_store_is_a_gap_not_a_failed_commit() {
    let _one_at_a_time = BUS.lock().await;
    let (a, _b, mut on_b) = replicas(support::postgres_with).await;
    let mut tx = a.begin(TxMode::Write).await.unwrap();
    assert!(tx.announce_with_commit(&[ChangeEvent::ResourceUpdated {
        uri: "dataset://nul\0inside".to_owned(),
    }]));
    tx.commit()
        .await
        .expect("the writes do not depend on the announcement");
    loop {
        match next(&mut on_b).await {
            Err(RecvError::Closed) => break,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
        }
    }
}

/// An announcement its replica left unpublished (it died right after its commit) is not
/// lost: the next replica whose sweep finds it publishes it, once. A store's bus sweeps
/// when it starts, so a replica that starts sweeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_announcement_a_dead_replica_left_is_published_by_another() {
    let _one_at_a_time = BUS.lock().await;
    let (_a, _b, mut on_b) = replicas(support::postgres_with).await;
    let orphan = format!("dataset://{}", support::unique("orphan"));
    let pool = support::pg_observer().await;
    // As the dead replica's commit left it, a minute ago.
    sqlx::query(
        "INSERT INTO wharf_announcements (payload, at) \
         VALUES ($1, clock_timestamp() - interval '1 minute')",
    )
    .bind(format!("u {orphan}"))
    .execute(&pool)
    .await
    .unwrap();
    let starting = support::postgres_with(WAIT).await;
    let _ = starting.bus().unwrap().is_connected();
    let published = ChangeEvent::ResourceUpdated {
        uri: orphan.clone(),
    };
    until_heard(&mut on_b, &published, |_| {}).await;
    assert_eq!(
        pg_announcements_of(&pool, &orphan).await,
        0,
        "deleted once published"
    );
}

/// An event too large for PostgreSQL's channel is not dropped in silence: it goes out as a
/// gap, which ends every open stream on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_event_too_large_for_the_channel_ends_open_streams() {
    let _one_at_a_time = BUS.lock().await;
    let (a, b) = (
        support::postgres_with(WAIT).await,
        support::postgres_with(WAIT).await,
    );
    listening(&a).await;
    let mut on_a = a.bus().unwrap().subscribe();
    let huge = ChangeEvent::ResourceUpdated {
        uri: format!("dataset://{}", "x".repeat(10_000)),
    };
    b.bus().unwrap().publish(huge).await.unwrap();
    loop {
        match next(&mut on_a).await {
            Err(RecvError::Closed) => break,
            Ok(ChangeEvent::ResourceUpdated { uri }) => {
                assert!(
                    uri.len() < 10_000,
                    "the oversized event never arrives whole"
                )
            }
            _ => continue,
        }
    }
}

/// Two replicas on one store, keys rotating every second: a cursor one signs opens on the
/// other, in the next rotation period too (its key is kept for the cursor's lifetime), and
/// new cursors are signed with the new period's key; once the old key has expired, what it
/// signed is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_open_on_every_replica_across_a_key_rotation() {
    use wharf::testing::Harness;
    let url = support::sqlite_url("rotation");
    let replica = async || {
        let store = support::sqlite_with(&url, WAIT).await;
        let mut config = wharf::ServerConfig::default();
        config.page_size = 1;
        config.key_rotation = Duration::from_secs(1);
        config.cursor_max_age = Duration::from_secs(2);
        config.request_state.max_age = Duration::from_secs(1);
        let echo = |name: &str| {
            wharf::tool(name).handler(|_cx: wharf::Context, _: wharf::NoArgs| async move { "ok" })
        };
        let server = wharf::Server::builder(wharf::protocol::Implementation::new("r", "1"))
            .config(config)
            .store(store)
            .tool(echo("first"))
            .tool(echo("second"))
            .build()
            .unwrap();
        Harness::new(server)
    };
    let (a, b) = (replica().await, replica().await);
    let page = a.call("tools/list", serde_json::json!({})).await.unwrap();
    let cursor = page["nextCursor"].as_str().unwrap().to_owned();
    let kid = cursor.split('.').next().unwrap().to_owned();
    assert!(kid.starts_with('e'), "{cursor}");
    let second = |h: &Harness, c: String| {
        let h = h.clone();
        async move {
            h.call("tools/list", serde_json::json!({ "cursor": c }))
                .await
                .map(|p| p["tools"][0]["name"].clone())
        }
    };
    assert_eq!(second(&b, cursor.clone()).await.unwrap(), "second");
    // The next period: the old key still opens, the new one signs.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(second(&b, cursor.clone()).await.unwrap(), "second");
    let newer = b.call("tools/list", serde_json::json!({})).await.unwrap()["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        !newer.starts_with(&format!("{kid}.")),
        "{newer} after {cursor}"
    );
    assert_eq!(second(&a, newer).await.unwrap(), "second");
    // Past the old key's overlap (its period's end plus the cursor lifetime).
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let refused = second(&a, cursor).await.unwrap_err();
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
}

/// Redis's publish/subscribe ignores the database number: two deployments kept apart by it
/// (`redis://host/14`, `redis://host/15`) each hear their own changes only.
#[tokio::test]
async fn deployments_on_two_redis_databases_hear_their_own_changes_only() {
    let on = async |db: u32| {
        let url = format!("{}{db}", support::redis_url());
        let store = wharf_store::open(&url, &support::options(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
        listening(&store).await;
        store
    };
    let (a, other, b) = (on(14).await, on(15).await, on(14).await);
    let mut on_a = a.bus().unwrap().subscribe();
    let uri = |tag| format!("dataset://{}", support::unique(tag));
    let theirs = ChangeEvent::ResourceUpdated { uri: uri("theirs") };
    let ours = ChangeEvent::ResourceUpdated { uri: uri("ours") };
    // Theirs is published first: heard at all, it would come first.
    other.bus().unwrap().publish(theirs.clone()).await.unwrap();
    b.bus().unwrap().publish(ours.clone()).await.unwrap();
    loop {
        let event = next(&mut on_a).await.expect("open");
        assert_ne!(event, theirs, "a change of the deployment on database 15");
        if event == ours {
            break;
        }
    }
}
