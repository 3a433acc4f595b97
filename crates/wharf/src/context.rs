//! What a handler knows about the request it serves, and how it talks back while it runs.

use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wharf_protocol::jsonrpc::write_notification;
use wharf_protocol::{
    ClientCapabilities, Implementation, LoggingLevel, LoggingMessageParams, ProgressParams,
    RequestId, methods,
};

use crate::bus::ChangeEvent;
use crate::meta::RequestInfo;
use crate::server::Server;

/// Serialized JSON-RPC messages for the response stream of one request, in order.
pub type Outbox = mpsc::Sender<Vec<u8>>;

/// The request a handler serves: its id, its `_meta`, its cancellation, and its stream.
///
/// Progress and log calls cost nothing when the client did not ask for them.
pub struct Context {
    id: RequestId,
    info: Box<RequestInfo>,
    cancel: Option<CancellationToken>,
    outbox: Option<Outbox>,
    last_progress: Mutex<Option<f64>>,
    server: Server,
}

impl Context {
    pub(crate) fn new(
        id: RequestId,
        info: Box<RequestInfo>,
        cancel: Option<CancellationToken>,
        outbox: Option<Outbox>,
        server: Server,
    ) -> Self {
        Context {
            id,
            info,
            cancel,
            outbox,
            last_progress: Mutex::new(None),
            server,
        }
    }

    /// The JSON-RPC id of the request.
    pub fn request_id(&self) -> &RequestId {
        &self.id
    }

    /// The validated `_meta` of the request.
    pub fn info(&self) -> &RequestInfo {
        &self.info
    }

    /// The capabilities the client declared on this request.
    pub fn client_capabilities(&self) -> &ClientCapabilities {
        &self.info.client_capabilities
    }

    /// Who the client says it is, if it said.
    pub fn client_info(&self) -> Option<&Implementation> {
        self.info.client_info.as_ref()
    }

    /// Resolves when the request is cancelled (the client went away or cancelled it); never
    /// resolves for a request that cannot be cancelled.
    pub async fn cancelled(&self) {
        match &self.cancel {
            Some(token) => token.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// Whether the request has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// The server, to announce changes from inside a handler.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Reports progress, if the client asked for it with a `progressToken`. Values that do
    /// not increase are dropped, so the client always sees progress strictly increasing.
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let (Some(token), Some(outbox)) = (&self.info.progress_token, &self.outbox) else {
            return;
        };
        {
            let mut last = self.last_progress.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|l| progress <= l) || !progress.is_finite() {
                return;
            }
            *last = Some(progress);
        }
        let params = ProgressParams {
            progress_token: token.clone(),
            progress,
            // JSON has no infinity: a non-finite total is left out rather than sent as null.
            total: total.filter(|t| t.is_finite()),
            message: message.map(str::to_owned),
            meta: None,
        };
        send(outbox, methods::NOTIFICATION_PROGRESS, &params).await;
    }

    /// Sends a `notifications/message` if the client asked for logs at `level` or below.
    pub async fn log(&self, level: LoggingLevel, logger: Option<&str>, data: serde_json::Value) {
        let (Some(min), Some(outbox)) = (self.info.log_level, &self.outbox) else {
            return;
        };
        if level < min {
            return;
        }
        let params = LoggingMessageParams {
            level,
            logger: logger.map(str::to_owned),
            data,
            meta: None,
        };
        send(outbox, methods::NOTIFICATION_MESSAGE, &params).await;
    }

    /// Announces a change to every listen stream (see [`Server::announce`]).
    pub async fn announce(&self, event: ChangeEvent) {
        self.server.announce(event).await;
    }
}

async fn send<P: Serialize>(outbox: &Outbox, method: &str, params: &P) {
    let mut buf = Vec::with_capacity(128);
    if write_notification(&mut buf, method, params).is_ok() {
        // The receiver is gone only when the response stream closed: nothing to do.
        let _ = outbox.send(buf).await;
    }
}
