//! Removes expired handles and idempotency records in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use wharf::store::{Store, now_millis};

/// Every `interval`, removes expired records in batches of at most `batch` (at least 1),
/// yielding between batches so traffic is never held up; stops when `stop` is cancelled.
pub fn spawn_sweeper(
    store: Arc<dyn Store>,
    interval: Duration,
    batch: u32,
    stop: CancellationToken,
) -> JoinHandle<()> {
    // A batch of 0 would remove nothing and, always "full", never end its pass.
    let batch = batch.max(1);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
            loop {
                match store.sweep(now_millis(), batch).await {
                    Ok(n) if n >= u64::from(batch) => tokio::task::yield_now().await,
                    Ok(n) => {
                        if n > 0 {
                            tracing::debug!(removed = n, "swept expired records");
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "sweeping expired records failed");
                        break;
                    }
                }
            }
        }
    })
}
