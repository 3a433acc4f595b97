//! Progress of one request: strictly increasing, bursts coalesced to one message per
//! interval, the last value sent before the response (unless the client stopped reading),
//! nothing sent after it, and the handler never held up by a client that does not read.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;
use wharf_protocol::{ProgressParams, ProgressToken, methods};

use crate::deadline::later;
use crate::request::{Outbox, ProgressFloor};

/// Where a request's progress goes, when its client asked for it.
pub(crate) struct ProgressStream {
    token: ProgressToken,
    outbox: Outbox,
    interval: Duration,
    state: Mutex<State>,
    floor: Option<Arc<ProgressFloor>>,
}

#[derive(Default)]
struct State {
    last_value: Option<f64>,
    last_sent: Option<Instant>,
    /// The newest value not sent yet (a burst inside the interval).
    pending: Option<ProgressParams>,
    flusher: bool,
    closed: bool,
}

impl ProgressStream {
    /// A stream whose values start above `floor`'s, and raise it, when given.
    pub(crate) fn new(
        token: ProgressToken,
        outbox: Outbox,
        interval: Duration,
        floor: Option<Arc<ProgressFloor>>,
    ) -> Arc<Self> {
        let state = State {
            last_value: floor.as_deref().and_then(ProgressFloor::get),
            ..State::default()
        };
        Arc::new(ProgressStream {
            token,
            outbox,
            interval,
            state: Mutex::new(state),
            floor,
        })
    }

    /// Reports a value: dropped unless it increases; sent now if the interval since the last
    /// message has passed, otherwise kept (replacing any kept one) and sent when it has.
    pub(crate) async fn report(
        self: &Arc<Self>,
        progress: f64,
        total: Option<f64>,
        message: Option<&str>,
    ) {
        let mut state = self.state.lock().await;
        if state.closed || !progress.is_finite() || state.last_value.is_some_and(|l| progress <= l)
        {
            return;
        }
        state.last_value = Some(progress);
        if let Some(floor) = &self.floor {
            floor.set(progress);
        }
        let params = ProgressParams {
            progress_token: self.token.clone(),
            progress,
            // JSON has no infinity: a non-finite total is left out rather than sent as null.
            total: total.filter(|t| t.is_finite()),
            message: message.map(str::to_owned),
            meta: None,
        };
        let due = state.last_sent.is_none_or(|t| t.elapsed() >= self.interval);
        if due {
            match self.deliver(&params) {
                Delivery::Sent => {
                    state.pending = None;
                    state.last_sent = Some(Instant::now());
                    return;
                }
                Delivery::Gone => return,
                // Kept, and tried again after the interval.
                Delivery::Full => state.last_sent = Some(Instant::now()),
            }
        }
        state.pending = Some(params);
        if !state.flusher {
            state.flusher = true;
            let at = state
                .last_sent
                .map_or_else(Instant::now, |t| later(t, self.interval));
            // Weak: a request cancelled meanwhile drops its stream, and what it kept is not
            // sent after the cancellation (on stdio, the channel outlives the request).
            tokio::spawn(Self::flush(Arc::downgrade(self), at));
        }
    }

    /// Sends the kept value at `at`, and again an interval later while the stream is full.
    async fn flush(this: std::sync::Weak<Self>, mut at: Instant) {
        loop {
            tokio::time::sleep_until(at).await;
            let Some(this) = this.upgrade() else {
                return;
            };
            let mut state = this.state.lock().await;
            let kept = state.pending.take().filter(|_| !state.closed);
            let Some(params) = kept else {
                state.flusher = false;
                return;
            };
            if let Delivery::Full = this.deliver(&params) {
                state.pending = Some(params);
                // At least a moment: with no interval, a full stream would spin this loop.
                at = later(Instant::now(), this.interval.max(RETRY_FLOOR));
                continue;
            }
            state.last_sent = Some(Instant::now());
            state.flusher = false;
            return;
        }
    }

    /// Sends what is kept and stops: called by the core before it sends the response, so
    /// nothing follows the response. It waits for room on the stream at most
    /// [`FINISH_WAIT`]: the call's transaction, locks and turns are let go only after it,
    /// and a client that keeps the stream open without reading would hold them. A value
    /// still kept then is dropped (the response that follows says the work ended).
    pub(crate) async fn finish(&self) {
        let mut state = self.state.lock().await;
        if let Some(params) = state.pending.take() {
            if let Some(message) = self.message(&params) {
                // Timed out or closed: dropped, as above.
                let _ = self.outbox.send_timeout(message, FINISH_WAIT).await;
            }
        }
        state.closed = true;
    }

    /// The notification carrying `params`.
    fn message(&self, params: &ProgressParams) -> Option<Vec<u8>> {
        let mut buf = Vec::with_capacity(128);
        wharf_protocol::jsonrpc::write_notification(
            &mut buf,
            methods::NOTIFICATION_PROGRESS,
            params,
        )
        .ok()
        .map(|()| buf)
    }

    /// Puts one message on the request's stream if it has room. Progress is coalesced (one
    /// message per interval), so a full stream is a client not reading: the value is kept
    /// for later rather than waited on, and the handler never waits for the client.
    fn deliver(&self, params: &ProgressParams) -> Delivery {
        let Some(message) = self.message(params) else {
            return Delivery::Gone;
        };
        match self.outbox.try_send(message) {
            Ok(()) => Delivery::Sent,
            Err(mpsc::error::TrySendError::Full(_)) => Delivery::Full,
            // The receiver is gone only when the response stream closed: nothing to do.
            Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Gone,
        }
    }
}

/// How long the flush before the response waits for room on the request's stream: a
/// client that reads takes the last value in that time (the stream is shared by the
/// request's logs, and over stdio by every request's answers), and one that stopped reading
/// holds the finished call no longer than that.
const FINISH_WAIT: Duration = Duration::from_millis(100);

/// The least time before a value kept on a full stream is tried again.
const RETRY_FLOOR: Duration = Duration::from_millis(10);

/// What became of a progress message.
enum Delivery {
    Sent,
    /// The stream has no room now.
    Full,
    /// The stream closed (or the message could not be written): nothing more to send.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress_values(rx: &mut mpsc::Receiver<Vec<u8>>) -> Vec<f64> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            let v: serde_json::Value = serde_json::from_slice(&m).unwrap();
            out.push(v["params"]["progress"].as_f64().unwrap());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn bursts_are_coalesced_and_the_last_value_is_never_lost() {
        let (tx, mut rx) = mpsc::channel(64);
        let p = ProgressStream::new(
            ProgressToken::String("t".into()),
            tx,
            Duration::from_millis(100),
            None,
        );
        for i in 1..=10 {
            p.report(f64::from(i), Some(10.0), None).await;
        }
        // The first went out at once; the burst after it is one kept value.
        assert_eq!(progress_values(&mut rx), vec![1.0]);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            progress_values(&mut rx),
            vec![10.0],
            "sent when the interval passed"
        );
        p.report(10.0, None, None).await;
        p.report(9.0, None, None).await;
        assert!(
            progress_values(&mut rx).is_empty(),
            "never decreasing, never repeated"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn finishing_sends_what_is_kept_and_nothing_after() {
        let (tx, mut rx) = mpsc::channel(64);
        let p = ProgressStream::new(
            ProgressToken::Number(1),
            tx,
            Duration::from_millis(100),
            None,
        );
        p.report(1.0, None, None).await;
        p.report(2.0, None, None).await;
        p.finish().await;
        assert_eq!(progress_values(&mut rx), vec![1.0, 2.0]);
        p.report(3.0, None, None).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            progress_values(&mut rx).is_empty(),
            "nothing after the response"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_before_its_kept_value_went_out_sends_nothing_more() {
        let (tx, mut rx) = mpsc::channel(64);
        let p = ProgressStream::new(
            ProgressToken::Number(1),
            tx,
            Duration::from_millis(100),
            None,
        );
        p.report(1.0, None, None).await;
        p.report(2.0, None, None).await;
        // Cancelled: the request's future, and its stream with it, is dropped.
        drop(p);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(progress_values(&mut rx), vec![1.0], "2 is not sent");
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_on_one_stream_continue_from_the_last_value() {
        let (tx, mut rx) = mpsc::channel(64);
        let floor = Arc::new(ProgressFloor::default());
        let round = || {
            ProgressStream::new(
                ProgressToken::Number(1),
                tx.clone(),
                Duration::ZERO,
                Some(Arc::clone(&floor)),
            )
        };
        let first = round();
        first.report(0.5, None, None).await;
        first.finish().await;
        // The handler runs again from the top: what it reported before is not repeated.
        let second = round();
        second.report(0.5, None, None).await;
        second.report(0.7, None, None).await;
        second.finish().await;
        assert_eq!(progress_values(&mut rx), vec![0.5, 0.7]);
    }

    /// A progress stream whose one place a message the client has not read holds.
    async fn on_a_full_stream(
        interval: Duration,
    ) -> (Arc<ProgressStream>, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel(1);
        tx.send(b"unread".to_vec()).await.unwrap();
        let p = ProgressStream::new(ProgressToken::Number(1), tx, interval, None);
        (p, rx)
    }

    /// A client that keeps the stream open without reading fills it: the handler's reports
    /// and the core's `finish` never wait for it (the call's locks are let go after
    /// `finish`). Time is paused: a wait on the stream would let the timeout fire.
    #[tokio::test(start_paused = true)]
    async fn a_full_stream_never_holds_the_call() {
        let (p, mut rx) = on_a_full_stream(Duration::from_millis(100)).await;
        let limit = Duration::from_secs(3600);
        tokio::time::timeout(limit, p.report(1.0, None, None))
            .await
            .expect("a report waited for the client");
        // The flusher tries again while the stream is full, and holds nothing meanwhile.
        tokio::time::sleep(Duration::from_millis(350)).await;
        tokio::time::timeout(limit, p.report(2.0, None, None))
            .await
            .expect("a report waited for the client");
        tokio::time::timeout(FINISH_WAIT * 2, p.finish())
            .await
            .expect("finish waited for the client past its bound");
        assert_eq!(rx.recv().await.unwrap(), b"unread");
        assert!(rx.try_recv().is_err(), "nothing follows the finish");
    }

    /// With no interval, a value kept on a full stream is tried again after a moment, not
    /// in a loop that takes a processor; the last value waits a moment for room at the end.
    #[tokio::test(start_paused = true)]
    async fn no_interval_neither_spins_nor_loses_the_last_value_of_a_reader() {
        let (p, mut rx) = on_a_full_stream(Duration::ZERO).await;
        p.report(1.0, None, None).await;
        // Paused time moves only when every task waits: a spinning flusher never lets it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        p.report(2.0, None, None).await;
        let reader = tokio::spawn(async move {
            tokio::time::sleep(FINISH_WAIT / 2).await;
            let mut got = vec![rx.recv().await.unwrap()];
            while let Some(m) = rx.recv().await {
                got.push(m);
            }
            got
        });
        p.finish().await;
        drop(p);
        let got = reader.await.unwrap();
        assert_eq!(got[0], b"unread");
        let values: Vec<f64> = got[1..]
            .iter()
            .map(|m| {
                serde_json::from_slice::<serde_json::Value>(m).unwrap()["params"]["progress"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            values,
            vec![2.0],
            "the last value, read within the finish's wait"
        );
    }

    /// A value kept because the stream was full goes out once the client reads.
    #[tokio::test(start_paused = true)]
    async fn a_value_kept_while_the_stream_was_full_goes_out_when_it_has_room() {
        let (p, mut rx) = on_a_full_stream(Duration::from_millis(100)).await;
        p.report(1.0, None, None).await;
        p.report(2.0, None, None).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(rx.recv().await.unwrap(), b"unread");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(progress_values(&mut rx), vec![2.0], "the newest value");
        p.finish().await;
        assert!(progress_values(&mut rx).is_empty());
    }
}
