//! A listen stream across a gap in the change bus (a shared bus that lost its connection to
//! the other replicas, or got it back, and so closed its receivers): the stream announces
//! everything it subscribes to, so the client reads again what may have changed meanwhile,
//! and goes on hearing changes. And a stream whose principal's credentials expire ends
//! then. Each test acts once the stream has sent what it waits for.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
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
    /// The next this many new receivers come closed (another gap came at once).
    closed_next: Mutex<usize>,
    connected: AtomicBool,
}

impl GappyBus {
    fn new() -> Self {
        GappyBus {
            tx: Mutex::new(broadcast::channel(16).0),
            finished: Mutex::new(false),
            closed_next: Mutex::new(0),
            connected: AtomicBool::new(true),
        }
    }

    fn gap(&self) {
        *self.tx.lock().unwrap() = broadcast::channel(16).0;
    }

    /// Returns once a stream listens on the receiver the last gap left (the stream took the
    /// gap in).
    async fn until_subscribed(&self) {
        while self.tx.lock().unwrap().receiver_count() == 0 {
            tokio::task::yield_now().await;
        }
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
        let mut closed_next = self.closed_next.lock().unwrap();
        if *self.finished.lock().unwrap() || *closed_next > 0 {
            *closed_next = closed_next.saturating_sub(1);
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
/// once), its messages handed over as they come; the acknowledgment, checked, is taken.
async fn listen_as(server: &Server, principal: Principal) -> mpsc::Receiver<Value> {
    let params = json!({ "notifications": {
        "resourcesListChanged": true, "resourceSubscriptions": ["notes://a", "notes://a"]
    } });
    let mut messages = Harness::new(server.clone())
        .principal(principal)
        .open_stream("subscriptions/listen", params, CancellationToken::new())
        .await
        .unwrap();
    let ack = messages.recv().await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!(["notes://a"])
    );
    messages
}

async fn listen(server: &Server) -> mpsc::Receiver<Value> {
    listen_as(server, Principal::anonymous()).await
}

/// The next message of a stream, as a line: its method and URI, or its result type; `None`
/// once the stream has ended.
async fn next(messages: &mut mpsc::Receiver<Value>) -> Option<String> {
    let m = messages.recv().await?;
    let line = match m["method"].as_str() {
        Some(method) => format!("{method} {}", m["params"]["uri"].as_str().unwrap_or("")),
        None => format!("result {}", m["result"]["resultType"]),
    };
    Some(line.trim().to_owned())
}

const UPDATED: &str = "notifications/resources/updated notes://a";
const LIST_CHANGED: &str = "notifications/resources/list_changed";
const COMPLETE: &str = "result \"complete\"";

/// What a stream sends once the server shuts down: its final result, then nothing.
async fn ends_at_shutdown(server: &Server, mut messages: mpsc::Receiver<Value>) {
    server.shutdown();
    assert_eq!(next(&mut messages).await.as_deref(), Some(COMPLETE));
    assert_eq!(next(&mut messages).await, None);
}

#[tokio::test]
async fn a_gap_announces_every_subscribed_change_and_the_stream_goes_on() {
    let bus = Arc::new(GappyBus::new());
    let server = server(Arc::clone(&bus));
    let messages = listen(&server).await;
    bus.gap();
    goes_on_after_a_gap(&server, messages).await;
}

/// What a stream sends after a gap: everything subscribed, once each, then a change made
/// after it, and its final result at shutdown.
async fn goes_on_after_a_gap(server: &Server, mut messages: mpsc::Receiver<Value>) {
    assert_eq!(next(&mut messages).await.as_deref(), Some(UPDATED));
    assert_eq!(next(&mut messages).await.as_deref(), Some(LIST_CHANGED));
    let changed = ChangeEvent::ResourceUpdated {
        uri: "notes://a".into(),
    };
    server.bus().publish(changed).await.unwrap();
    assert_eq!(next(&mut messages).await.as_deref(), Some(UPDATED));
    ends_at_shutdown(server, messages).await;
}

/// A second gap right behind the first (a failed publish, then its own gap heard back)
/// leaves the stream a receiver closed already: it takes the next one and goes on, rather
/// than ending as if the bus had nothing more to give.
#[tokio::test]
async fn a_gap_right_after_a_gap_does_not_end_the_stream() {
    let bus = Arc::new(GappyBus::new());
    let server = server(Arc::clone(&bus));
    let messages = listen(&server).await;
    *bus.closed_next.lock().unwrap() = 1;
    bus.gap();
    goes_on_after_a_gap(&server, messages).await;
}

/// An outage is two gaps (the connection lost, then back): what the stream may have missed
/// is announced once, when the bus listens again.
#[tokio::test]
async fn an_outage_is_announced_once_when_the_bus_is_back() {
    let bus = Arc::new(GappyBus::new());
    let server = server(Arc::clone(&bus));
    let mut messages = listen(&server).await;
    bus.connect(false);
    bus.until_subscribed().await;
    bus.connect(true);
    bus.until_subscribed().await;
    assert_eq!(next(&mut messages).await.as_deref(), Some(UPDATED));
    assert_eq!(next(&mut messages).await.as_deref(), Some(LIST_CHANGED));
    // Nothing more was owed: a bus with nothing more to give ends the stream at once.
    bus.finish();
    assert_eq!(next(&mut messages).await.as_deref(), Some(COMPLETE));
}

/// A bus with nothing more to give (its new receivers are closed) ends the stream with its
/// final result, rather than announcing gaps for ever.
#[tokio::test]
async fn a_bus_that_cannot_give_a_receiver_ends_the_stream() {
    let bus = Arc::new(GappyBus::new());
    let server = server(Arc::clone(&bus));
    let mut messages = listen(&server).await;
    bus.finish();
    assert_eq!(next(&mut messages).await.as_deref(), Some(COMPLETE));
    assert_eq!(next(&mut messages).await, None);
}

/// A stream whose principal's credentials expire (an access token's `exp`) ends then with
/// its final result: a token not renewed hears no more changes. Time is paused: the hour
/// tokio skips over is the credentials' life, not a guess at a delay.
#[tokio::test(start_paused = true)]
async fn a_stream_ends_when_its_credentials_expire() {
    let server = server(Arc::new(GappyBus::new()));
    let life = Duration::from_secs(3600);
    let expiring = Principal::new("ann")
        .unwrap()
        .valid_until(SystemTime::now() + life);
    let opened = tokio::time::Instant::now();
    let mut messages = listen_as(&server, expiring).await;
    assert_eq!(next(&mut messages).await.as_deref(), Some(COMPLETE));
    // Not before the credentials' end (the wall clock moved a little since they were made).
    assert!(
        opened.elapsed() >= life - Duration::from_secs(60),
        "{:?}",
        opened.elapsed()
    );
    assert_eq!(next(&mut messages).await, None);
}

/// A subscription written percent-encoded (`notes://%61`) is the resource it names: the
/// server announces `notes://a`, and the stream hears it; written twice, it counts once.
#[tokio::test]
async fn a_subscription_hears_its_resource_however_it_is_written() {
    let server = Server::builder(Implementation::new("t", "1"))
        .resource(resource("notes://a", "a").handler(|_cx, req| async move {
            Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
        }))
        .build()
        .unwrap();
    let params = json!({ "notifications": {
        "resourceSubscriptions": ["notes://%61", "notes://a"]
    } });
    let mut messages = Harness::new(server.clone())
        .open_stream("subscriptions/listen", params, CancellationToken::new())
        .await
        .unwrap();
    let ack = messages.recv().await.unwrap();
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!(["notes://%61"]),
        "{ack}"
    );
    server
        .announce(ChangeEvent::ResourceUpdated {
            uri: "notes://a".into(),
        })
        .await;
    // The deadline only turns a hang into a failure.
    let heard = tokio::time::timeout(Duration::from_secs(10), next(&mut messages))
        .await
        .expect("the update was heard");
    assert_eq!(heard.as_deref(), Some(UPDATED));
    ends_at_shutdown(&server, messages).await;
}
