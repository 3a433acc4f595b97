//! Legacy (2025-era) sessions kept in a shared store: two stores opened on one SQLite file
//! stand for two replicas serving one session.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use wharf::protocol::{Implementation, RequestId, ResourceContents};
use wharf::store::{Store, TxMode, now_millis};
use wharf::{Principal, Scope, Server, Session, template};

const WAIT: Duration = Duration::from_secs(3);
/// How many resources a session may subscribe to.
const MAX_SUBSCRIPTIONS: usize = 1_000;

fn server(store: Arc<dyn Store>) -> Server {
    Server::builder(Implementation::new("t", "1"))
        .store(store)
        .template(
            template("items://{n}", "item").handler(|_cx, req| async move {
                Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
            }),
        )
        .build()
        .unwrap()
}

/// Opens a 2025-11-25 session of `who` on `server`.
async fn open(server: &Server, who: &Principal) -> Result<Session, wharf::ErrorReply> {
    let init = RawValue::from_string(
        r#"{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}"#
            .into(),
    )
    .unwrap();
    server
        .sessions()
        .initialize(RequestId::Int(0), Some(&init), who, Scope::Shared)
        .await
        .map(|(session, _)| session)
}

async fn subscribe(
    server: &Server,
    session: &mut Session,
    method: &str,
    n: usize,
) -> Result<(), wharf::ErrorReply> {
    subscribe_to(server, session, method, &format!("items://{n}")).await
}

async fn subscribe_to(
    server: &Server,
    session: &mut Session,
    method: &str,
    uri: &str,
) -> Result<(), wharf::ErrorReply> {
    let params = RawValue::from_string(serde_json::json!({ "uri": uri }).to_string()).unwrap();
    server
        .sessions()
        .request(
            session,
            RequestId::Int(1),
            method,
            Some(&params),
            Principal::new("alice").unwrap(),
            wharf::TraceContext::default(),
        )
        .await
        .map(|_| ())
}

/// The URIs a session subscribes to are capped in bytes too (128 KiB together): each change
/// of the session rewrites its record whole, and each replica reads it again. 1,000 URIs of
/// 2 KiB made every later one-URI change write 2 MB.
#[tokio::test]
async fn subscriptions_are_capped_in_bytes() {
    let store = support::sqlite_with(&support::sqlite_url("legacy-subscribed-bytes"), WAIT).await;
    let s = server(store.clone());
    let alice = Principal::new("alice").unwrap();
    let mut session = open(&s, &alice).await.unwrap();
    // 2,000 bytes each: 65 fit in 128 KiB, a 66th does not.
    let uri = |n: usize| format!("items://{n:01992}");
    for n in 0..65 {
        subscribe_to(&s, &mut session, "resources/subscribe", &uri(n))
            .await
            .unwrap();
    }
    let refused = subscribe_to(&s, &mut session, "resources/subscribe", &uri(65))
        .await
        .unwrap_err();
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
    assert!(refused.error().message.contains("128 KiB"), "{refused:?}");
    // One already there is no new byte; room made lets the new one in.
    subscribe_to(&s, &mut session, "resources/subscribe", &uri(0))
        .await
        .unwrap();
    subscribe_to(&s, &mut session, "resources/unsubscribe", &uri(0))
        .await
        .unwrap();
    subscribe_to(&s, &mut session, "resources/subscribe", &uri(65))
        .await
        .unwrap();
    let stored = store.load_handle(session.id()).await.unwrap().unwrap();
    let bytes = serde_json::to_string(&stored.data).unwrap().len();
    assert!(
        bytes < 140 * 1024,
        "the session's record holds {bytes} bytes"
    );
}

/// A subscription past the cap is refused, also where this replica's copy of the session
/// was out of date and only the state as stored shows the cap reached; and the refusal
/// writes nothing (the session's record, and with it its last use, stays as it was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_past_the_cap_is_refused_and_changes_nothing() {
    let url = support::sqlite_url("legacy-subscriptions");
    let store = support::sqlite_with(&url, WAIT).await;
    let a = server(store.clone());
    let b = server(support::sqlite_with(&url, WAIT).await);
    let alice = Principal::new("alice").unwrap();
    let mut on_a = open(&a, &alice).await.unwrap();
    // B's copy is read before A subscribes: it holds no subscription.
    let mut on_b = b.sessions().resume(on_a.id(), &alice, None).await.unwrap();
    for n in 0..MAX_SUBSCRIPTIONS {
        subscribe(&a, &mut on_a, "resources/subscribe", n)
            .await
            .unwrap();
    }
    let before = store.load_handle(on_a.id()).await.unwrap().unwrap();
    // A write now would record a later use than the last one.
    while now_millis() <= before.last_used_at {
        tokio::task::yield_now().await;
    }

    let refused = subscribe(&b, &mut on_b, "resources/subscribe", MAX_SUBSCRIPTIONS)
        .await
        .unwrap_err();
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
    assert!(
        refused.error().message.contains("at most 1000 resources"),
        "{refused:?}"
    );
    let after = store.load_handle(on_a.id()).await.unwrap().unwrap();
    assert_eq!(
        after.last_used_at, before.last_used_at,
        "the refusal rewrote the session"
    );
    assert!(after == before, "the refusal changed the session");

    // B now knows the session as stored: making room lets the same subscription in.
    subscribe(&b, &mut on_b, "resources/unsubscribe", 0)
        .await
        .unwrap();
    subscribe(&b, &mut on_b, "resources/subscribe", MAX_SUBSCRIPTIONS)
        .await
        .unwrap();
}

/// Anonymous callers share one principal: their sessions, together, are capped by
/// `legacy.max_anonymous_sessions`. Past it their `initialize` is "busy, retry" (not their
/// fault), an authenticated principal still opens sessions, and once one ends an anonymous
/// caller opens one again. With a store and without one.
#[tokio::test]
async fn anonymous_sessions_are_capped_together_and_leave_room_for_everyone_else() {
    let url = support::sqlite_url("legacy-anonymous");
    for store in [Some(support::sqlite_with(&url, WAIT).await), None] {
        let mut config = wharf::ServerConfig::default();
        config.legacy.max_anonymous_sessions = 3;
        let mut builder = Server::builder(Implementation::new("t", "1")).config(config);
        if let Some(store) = &store {
            builder = builder.store(Arc::clone(store));
        }
        let server = builder.build().unwrap();
        let anonymous = Principal::anonymous();
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(open(&server, &anonymous).await.unwrap());
        }
        let refused = open(&server, &anonymous).await.unwrap_err();
        assert_eq!(
            refused.error().kind,
            wharf::ErrorKind::RetryLater,
            "{refused:?}"
        );
        assert!(
            refused
                .error()
                .message
                .contains("3 sessions are open for anonymous callers"),
            "{refused:?}"
        );
        open(&server, &Principal::new("alice").unwrap())
            .await
            .unwrap();
        server.sessions().end(&held.pop().unwrap()).await.unwrap();
        open(&server, &anonymous).await.unwrap();
    }
}

/// Two replicas asked at once to end one session on PostgreSQL (a DELETE retried through
/// another replica): the session ends, and neither is answered "busy". Both used to hold
/// the session's handle and then wait to retire it, each for the other: PostgreSQL broke
/// the deadlock by failing one of them (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_ends_of_one_session_at_once_end_it_once() {
    let store = support::postgres_with(WAIT).await;
    let a = server(store.clone());
    let b = server(support::postgres_with(WAIT).await);
    let alice = Principal::new("alice").unwrap();
    let on_a = open(&a, &alice).await.unwrap();
    let on_b = b.sessions().resume(on_a.id(), &alice, None).await.unwrap();
    let id = on_a.id().to_owned();

    // A retirement of the session's handle under way: both ends queue behind it, and start
    // together once it is gone.
    let holder = support::pg_observer().await;
    let mut retiring = holder.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(on_a.id())
        .execute(&mut *retiring)
        .await
        .unwrap();
    let ends = [(a, on_a), (b, on_b)].map(|(server, session)| {
        tokio::spawn(async move { server.sessions().end(&session).await })
    });
    let observer = support::pg_observer().await;
    support::wait_until("both ends wait", Duration::from_secs(10), async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' \
             AND datname = current_database()",
        )
        .fetch_one(&observer)
        .await
        .unwrap();
        waiting >= 2
    })
    .await;
    retiring.rollback().await.unwrap();

    let mut outcomes = Vec::new();
    for end in ends {
        outcomes.push(match end.await.unwrap() {
            Ok(()) => "ended",
            Err(wharf::SessionError::Unknown) => "unknown",
            Err(other) => panic!("an end of the session failed: {other}"),
        });
    }
    assert!(outcomes.contains(&"ended"), "{outcomes:?}");
    assert!(store.load_handle(&id).await.unwrap().is_none());
}

/// A principal opening many sessions at once, on two replicas, stays within its cap: its
/// openings take turns, each ending the least recently used session to make room. Made at
/// once, they used to count the same sessions and end the same one, and each add its own:
/// 32 openings over a cap of 4 left 33 live sessions on Redis, 14 on PostgreSQL (SQLite's
/// write transactions always took turns).
async fn openings_at_once_stay_within_the_principals_cap(stores: [Arc<dyn Store>; 2]) {
    const CAP: u64 = 4;
    let replicas = stores.clone().map(|store| {
        let mut config = wharf::ServerConfig::default();
        config.legacy.max_sessions_per_principal = CAP;
        Server::builder(Implementation::new("t", "1"))
            .config(config)
            .store(store)
            .build()
            .unwrap()
    });
    let alice = Principal::new(support::unique("alice")).unwrap();
    for _ in 0..CAP {
        open(&replicas[0], &alice).await.unwrap();
    }
    let openings: Vec<_> = (0..32)
        .map(|n| {
            let (replica, alice) = (replicas[n % 2].clone(), alice.clone());
            tokio::spawn(async move { open(&replica, &alice).await.map(drop) })
        })
        .collect();
    for opening in openings {
        opening.await.unwrap().unwrap();
    }
    let mut tx = stores[0].begin(TxMode::Read).await.unwrap();
    let live = tx
        .live_handles(alice.id(), "mcp-session", now_millis())
        .await
        .unwrap();
    assert_eq!(
        live, CAP,
        "live sessions of one principal after openings at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_openings_at_once_stay_within_the_principals_cap() {
    let stores = [
        support::postgres_with(WAIT).await,
        support::postgres_with(WAIT).await,
    ];
    openings_at_once_stay_within_the_principals_cap(stores).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_openings_at_once_stay_within_the_principals_cap() {
    let stores = [
        support::redis_with(WAIT).await,
        support::redis_with(WAIT).await,
    ];
    openings_at_once_stay_within_the_principals_cap(stores).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_openings_at_once_stay_within_the_principals_cap() {
    let url = support::sqlite_url("legacy-openings-at-once");
    let stores = [
        support::sqlite_with(&url, WAIT).await,
        support::sqlite_with(&url, WAIT).await,
    ];
    openings_at_once_stay_within_the_principals_cap(stores).await;
}

/// A session's stream opened on a replica whose copy of the session is older than a
/// subscription made on another replica hears of that resource from the start: it reads
/// the subscriptions afresh once it listens. It went by the copy until its next look at the
/// session (30 s), deaf to the new subscription meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_hears_of_a_subscription_made_on_another_replica() {
    use futures_util::StreamExt as _;

    let url = support::sqlite_url("legacy-stream-fresh");
    let a = server(support::sqlite_with(&url, WAIT).await);
    let b = server(support::sqlite_with(&url, WAIT).await);
    let alice = Principal::new("alice").unwrap();
    let opened = open(&a, &alice).await.unwrap();
    let mut on_b = b
        .sessions()
        .resume(opened.id(), &alice, None)
        .await
        .unwrap();
    subscribe(&b, &mut on_b, "resources/subscribe", 7)
        .await
        .unwrap();
    // A's copy, kept when it opened the session (two seconds at most), has no subscription:
    // the two stores share no bus that would have told A.
    let on_a = a
        .sessions()
        .resume(opened.id(), &alice, None)
        .await
        .unwrap();
    let mut stream = a.sessions().stream(&on_a, &alice).await.unwrap();
    a.bus()
        .publish(wharf::ChangeEvent::ResourceUpdated {
            uri: "items://7".into(),
        })
        .await
        .unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the update is heard")
        .expect("the stream goes on");
    let heard: serde_json::Value = serde_json::from_slice(&heard).unwrap();
    assert_eq!(
        heard["method"], "notifications/resources/updated",
        "{heard}"
    );
    assert_eq!(heard["params"]["uri"], "items://7", "{heard}");
}
