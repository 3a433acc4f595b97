//! A listen stream across a gap in the change bus (a shared bus that lost its connection to
//! the other replicas, or got it back, and so closed its receivers): the stream announces
//! everything it subscribes to, so the client reads again what may have changed meanwhile,
//! and goes on hearing changes. And a stream whose principal's credentials expire ends
//! then. Time is paused.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use wharf::protocol::{Implementation, ResourceContents};
use wharf::testing::Harness;
use wharf::{BusError, ChangeEvent, NotificationBus, Principal, Server, resource};

/// A bus whose gaps close every receiver, as a shared bus's do.
#[derive(Debug)]
struct GappyBus {
    tx: Mutex<broadcast::Sender<ChangeEvent>>,
    /// New receivers come closed: the bus has nothing more to give.
    finished: Mutex<bool>,
    connected: AtomicBool,
}

impl GappyBus {
    fn new() -> Self {
        GappyBus {
            tx: Mutex::new(broadcast::channel(16).0),
            finished: Mutex::new(false),
            connected: AtomicBool::new(true),
        }
    }

    fn gap(&self) {
        *self.tx.lock().unwrap() = broadcast::channel(16).0;
    }

    /// Loses its connection (a gap), or gets it back (another).
    fn connect(&self, connected: bool) {
        self.connected.store(connected, Ordering::SeqCst);
        self.gap();
    }

    fn finish(&self) {
        *self.finished.lock().unwrap() = true;
        self.gap();
    }
}

impl NotificationBus for GappyBus {
    fn publish(
        &self,
        event: ChangeEvent,
    ) -> Pin<Box<dyn Future<Output = Result<(), BusError>> + Send + '_>> {
        let _ = self.tx.lock().unwrap().send(event);
        Box::pin(async { Ok(()) })
    }

    fn subscribe(&self) -> broadcast::Receiver<ChangeEvent> {
        if *self.finished.lock().unwrap() {
            return broadcast::channel(1).1;
        }
        self.tx.lock().unwrap().subscribe()
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }
}

fn server(bus: Arc<GappyBus>) -> Server {
    Server::builder(Implementation::new("t", "1"))
        .bus(bus)
        .resource(resource("notes://a", "a").handler(|_cx, req| async move {
            Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
        }))
        .build()
        .unwrap()
}

/// Opens a listen stream for resource-list changes and `notes://a` (named twice: it counts
/// once), collecting its messages until it ends.
fn listen(server: &Server) -> tokio::task::JoinHandle<Vec<Value>> {
    listen_as(server, Principal::anonymous())
}

fn listen_as(server: &Server, principal: Principal) -> tokio::task::JoinHandle<Vec<Value>> {
    let harness = Harness::new(server.clone()).principal(principal);
    tokio::spawn(async move {
        let params = json!({ "notifications": {
            "resourcesListChanged": true, "resourceSubscriptions": ["notes://a", "notes://a"]
        } });
        harness
            .stream("subscriptions/listen", params, CancellationToken::new())
            .await
            .unwrap()
    })
}

fn methods(sent: &[Value]) -> Vec<String> {
    sent.iter()
        .map(|m| match m["method"].as_str() {
            Some(method) => format!("{method} {}", m["params"]["uri"].as_str().unwrap_or("")),
            None => format!("result {}", m["result"]["resultType"]),
        })
        .map(|s| s.trim().to_owned())
        .collect()
}

/// The messages of a stream expected to end: it has an hour (of paused time, skipped over
/// at once), so a stream that does not end fails the test instead of hanging it.
async fn ended(stream: tokio::task::JoinHandle<Vec<Value>>, what: &str) -> Vec<Value> {
    tokio::time::timeout(Duration::from_secs(3600), stream)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_gap_announces_every_subscribed_change_and_the_stream_goes_on() {
    let bus = Arc::new(GappyBus::new());
    let server = server(Arc::clone(&bus));
    let stream = listen(&server);
    tokio::time::sleep(Duration::from_secs(1)).await;

    bus.gap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let changed = ChangeEvent::ResourceUpdated {
        uri: "notes://a".into(),
    };
    server.bus().publish(changed).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!stream.is_finished(), "the stream ended at the gap");

    server.shutdown();
    let sent = ended(stream, "the stream ends at shutdown").await;
    assert_eq!(
        sent[0]["params"]["notifications"]["resourceSubscriptions"],
        json!(["notes://a"])
    );
    assert_eq!(
        methods(&sent),
        [
            "notifications/subscriptions/acknowledged",
            // The gap: everything subscribed.
            "notifications/resources/updated notes://a",
            "notifications/resources/list_changed",
            // A change after it.
            "notifications/resources/updated notes://a",
            "result \"complete\"",
        ]
    );
}

/// An outage is two gaps (the connection lost, then back): what the stream may have missed
/// is announced once, when the bus listens again.
#[tokio::test(start_paused = true)]
async fn an_outage_is_announced_once_when_the_bus_is_back() {
    let bus = Arc::new(GappyBus::new());
    let server = server(Arc::clone(&bus));
    let stream = listen(&server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    bus.connect(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    bus.connect(true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.shutdown();
    assert_eq!(
        methods(&ended(stream, "the stream ends at shutdown").await),
        [
            "notifications/subscriptions/acknowledged",
            "notifications/resources/updated notes://a",
            "notifications/resources/list_changed",
            "result \"complete\"",
        ]
    );
}

/// A bus with nothing more to give (its new receivers are closed) ends the stream with its
/// final result, rather than announcing gaps for ever.
#[tokio::test(start_paused = true)]
async fn a_bus_that_cannot_give_a_receiver_ends_the_stream() {
    let bus = Arc::new(GappyBus::new());
    let server = server(Arc::clone(&bus));
    let stream = listen(&server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    bus.finish();
    let sent = ended(stream, "the stream ends").await;
    assert_eq!(
        methods(&sent),
        [
            "notifications/subscriptions/acknowledged",
            "result \"complete\""
        ]
    );
}

/// A stream whose principal's credentials expire (an access token's `exp`) ends then with
/// its final result: a token revoked or not renewed hears no more changes.
#[tokio::test(start_paused = true)]
async fn a_stream_ends_when_its_credentials_expire() {
    let server = server(Arc::new(GappyBus::new()));
    let expiring = Principal::new("ann").valid_until(SystemTime::now() + Duration::from_secs(60));
    let stream = listen_as(&server, expiring);
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert!(
        !stream.is_finished(),
        "ended before its credentials expired"
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        stream.is_finished(),
        "still open past its credentials' expiry"
    );
    assert_eq!(
        methods(&stream.await.unwrap()),
        [
            "notifications/subscriptions/acknowledged",
            "result \"complete\""
        ]
    );
}
