//! `subscriptions/listen`: one stream of change notifications per request.

use serde::Serialize;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;
use wharf_protocol::jsonrpc::{write_notification, write_result};
use wharf_protocol::{RequestId, ResultType, SubscriptionFilter, methods};

use std::sync::Arc;

use crate::bus::ChangeEvent;
use crate::deadline;
use crate::error::{ErrorKind, RpcError};
use crate::principal::Principal;
use crate::registry::Registry;
use crate::request::{ParsedRequest, RequestBody};
use crate::runtime::Runtime;

/// How many new receivers a listen stream takes from the bus after a gap before it counts
/// the bus as closed for good.
const RESUBSCRIBE_TRIES: usize = 4;

/// An open subscription. [`Listener::next`] yields serialized messages: the acknowledgment
/// first, then the notifications the client opted into, and when the server drains or stops
/// the final `subscriptions/listen` response, after which it yields `None`. After a lag or
/// a gap in the bus it announces every change it subscribes to, and goes on.
pub(crate) struct Listener {
    /// Ends the stream with its final response ([`Runtime::stream_end`]).
    end: CancellationToken,
    id: RequestId,
    /// Whose stream it is: private resource changes reach only their principal.
    principal: String,
    filter: SubscriptionFilter,
    /// The subscribed URIs normalized, for matching each change announced at once.
    subscribed: std::collections::HashSet<String>,
    rx: broadcast::Receiver<ChangeEvent>,
    runtime: Arc<Runtime>,
    acknowledged: bool,
    done: bool,
    /// Notifications owed after a lag, sent before anything new.
    backlog: Vec<ChangeEvent>,
    /// When the principal's credentials expire: the stream ends then, and the client
    /// listens again with fresh ones (a token revoked or not renewed hears no more).
    until: Option<tokio::time::Instant>,
}

impl Listener {
    /// Opens a subscription for an admitted `subscriptions/listen` request.
    pub(crate) fn open(
        registry: &Registry,
        runtime: &Arc<Runtime>,
        req: ParsedRequest,
        principal: &Principal,
    ) -> Result<Listener, RpcError> {
        let RequestBody::Listen(params) = req.body else {
            return Err(RpcError::new(
                ErrorKind::InvalidRequest,
                "not a subscriptions/listen request",
            ));
        };
        let caps = &registry.capabilities;
        let asked = params.notifications;
        let yes =
            |asked: Option<bool>, offered: bool| (asked == Some(true) && offered).then_some(true);
        // Each URI once, kept normalized too: every change announced is matched against them.
        let mut subscribed = std::collections::HashSet::new();
        let subscribable: Option<Vec<String>> = asked.resource_subscriptions.map(|uris| {
            uris.into_iter()
                .filter(|u| {
                    registry.resource(u).is_some()
                        && subscribed.insert(crate::uri_template::normalized(u).into_owned())
                })
                .collect()
        });
        let filter = SubscriptionFilter {
            tools_list_changed: yes(asked.tools_list_changed, caps.tools.is_some()),
            prompts_list_changed: yes(asked.prompts_list_changed, caps.prompts.is_some()),
            resources_list_changed: yes(asked.resources_list_changed, caps.resources.is_some()),
            resource_subscriptions: subscribable.filter(|_| caps.resources.is_some()),
        };
        if filter.resource_subscriptions.is_none() {
            subscribed.clear();
        }
        Ok(Listener {
            end: runtime.stream_end(),
            id: req.id,
            principal: principal.id().to_owned(),
            filter,
            subscribed,
            rx: runtime.bus.subscribe(),
            runtime: Arc::clone(runtime),
            acknowledged: false,
            done: false,
            backlog: Vec::new(),
            until: deadline::credentials_end(principal),
        })
    }

    fn wants(&self, event: &ChangeEvent) -> bool {
        match event {
            ChangeEvent::ToolsListChanged => self.filter.tools_list_changed == Some(true),
            ChangeEvent::PromptsListChanged => self.filter.prompts_list_changed == Some(true),
            ChangeEvent::ResourcesListChanged => self.filter.resources_list_changed == Some(true),
            ChangeEvent::ResourceUpdated { uri } => self.subscribed(uri),
            ChangeEvent::PrivateResourceUpdated { uri, principal } => {
                *principal == self.principal && self.subscribed(uri)
            }
            ChangeEvent::Session { .. } => false,
        }
    }

    /// Whether `uri` is one of the subscribed resources, however either is written
    /// (`secr%65ts` is `secrets`).
    fn subscribed(&self, uri: &str) -> bool {
        !self.subscribed.is_empty()
            && self
                .subscribed
                .contains(crate::uri_template::normalized(uri).as_ref())
    }

    /// Everything this subscription could have missed, for after a lag: clients refetch.
    fn everything(&self) -> Vec<ChangeEvent> {
        let mut all = vec![
            ChangeEvent::ToolsListChanged,
            ChangeEvent::PromptsListChanged,
            ChangeEvent::ResourcesListChanged,
        ];
        for uri in self.filter.resource_subscriptions.iter().flatten() {
            all.push(ChangeEvent::ResourceUpdated { uri: uri.clone() });
        }
        all.retain(|e| self.wants(e));
        all
    }

    fn sub_meta(&self) -> SubscriptionMeta<'_> {
        SubscriptionMeta {
            id: &self.id,
            server_info: None,
        }
    }

    fn notification<P: Serialize>(&self, method: &str, params: &P) -> Vec<u8> {
        let mut buf = Vec::with_capacity(160);
        // Serializing these plain structs cannot fail.
        let _ = write_notification(&mut buf, method, params);
        buf
    }

    /// The notification for `event` (`None` for what no listen stream carries).
    fn render(&self, event: &ChangeEvent) -> Option<Vec<u8>> {
        #[derive(Serialize)]
        struct Params<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            uri: Option<&'a str>,
            #[serde(rename = "_meta")]
            meta: SubscriptionMeta<'a>,
        }
        let (method, uri) = match event {
            ChangeEvent::ToolsListChanged => (methods::NOTIFICATION_TOOLS_LIST_CHANGED, None),
            ChangeEvent::PromptsListChanged => (methods::NOTIFICATION_PROMPTS_LIST_CHANGED, None),
            ChangeEvent::ResourcesListChanged => {
                (methods::NOTIFICATION_RESOURCES_LIST_CHANGED, None)
            }
            ChangeEvent::ResourceUpdated { uri }
            | ChangeEvent::PrivateResourceUpdated { uri, .. } => {
                (methods::NOTIFICATION_RESOURCE_UPDATED, Some(uri.as_str()))
            }
            ChangeEvent::Session { .. } => return None,
        };
        Some(self.notification(
            method,
            &Params {
                uri,
                meta: self.sub_meta(),
            },
        ))
    }

    /// The final response that ends the subscription gracefully.
    fn final_response(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Final<'a> {
            #[serde(rename = "resultType")]
            result_type: ResultType,
            #[serde(rename = "_meta")]
            meta: SubscriptionMeta<'a>,
        }
        let meta = SubscriptionMeta {
            id: &self.id,
            server_info: Some(&self.runtime.info),
        };
        let mut buf = Vec::with_capacity(160);
        let _ = write_result(
            &mut buf,
            &self.id,
            &Final {
                result_type: ResultType::Complete,
                meta,
            },
        );
        buf
    }

    /// The next notification owed after a lag or a gap, if any.
    fn owed(&mut self) -> Option<Vec<u8>> {
        while let Some(event) = self.backlog.pop() {
            if let Some(m) = self.render(&event) {
                return Some(m);
            }
        }
        None
    }

    /// The next message to send, or `None` once the subscription has ended.
    pub(crate) async fn next(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        if !self.acknowledged {
            self.acknowledged = true;
            #[derive(Serialize)]
            struct Ack<'a> {
                notifications: &'a SubscriptionFilter,
                #[serde(rename = "_meta")]
                meta: SubscriptionMeta<'a>,
            }
            let params = Ack {
                notifications: &self.filter,
                meta: self.sub_meta(),
            };
            return Some(
                self.notification(methods::NOTIFICATION_SUBSCRIPTIONS_ACKNOWLEDGED, &params),
            );
        }
        // A stream told to end does not first send what it owes (a slow client with many
        // subscriptions would hold the drain).
        if self.end.is_cancelled() {
            self.backlog.clear();
            self.done = true;
            return Some(self.final_response());
        }
        if let Some(m) = self.owed() {
            return Some(m);
        }
        let end = self.end.clone();
        let expired = deadline::reached(self.until);
        tokio::pin!(expired);
        loop {
            tokio::select! {
                biased;
                () = end.cancelled() => {
                    self.done = true;
                    return Some(self.final_response());
                }
                () = &mut expired => {
                    self.done = true;
                    return Some(self.final_response());
                }
                received = self.rx.recv() => match received {
                    Ok(event) if self.wants(&event) => {
                        if let Some(m) = self.render(&event) {
                            return Some(m);
                        }
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "listen stream lagged; announcing every subscribed change");
                        if let Some(m) = &self.runtime.metrics {
                            m.listen_missed(missed);
                        }
                        self.backlog = self.everything();
                        if let Some(m) = self.owed() {
                            return Some(m);
                        }
                    }
                    Err(RecvError::Closed) => {
                        // The bus could no longer promise this receiver every event (its
                        // connection to the other replicas was lost, or came back): the
                        // stream goes on from a new receiver, after announcing everything
                        // it subscribes to, so the client reads again what may have
                        // changed meanwhile. A client that took a completion for the end
                        // would otherwise stop hearing anything. A new receiver closed
                        // already is most often a second gap right after the first (a
                        // failed publish, then its own gap heard back; a reconnect): the
                        // next one is live. A bus whose new receivers stay closed has
                        // nothing more to give: the stream ends.
                        let Some(rx) = (0..RESUBSCRIBE_TRIES)
                            .map(|_| self.runtime.bus.subscribe())
                            .find(|rx| !rx.is_closed())
                        else {
                            self.done = true;
                            return Some(self.final_response());
                        };
                        self.rx = rx;
                        // While the bus is disconnected, the gap at its next connection says
                        // it again: announced once then, not at each.
                        if self.runtime.bus.is_connected() {
                            tracing::debug!("the change bus had a gap; announcing every subscribed change");
                            self.backlog = self.everything();
                            if let Some(m) = self.owed() {
                                return Some(m);
                            }
                        }
                    }
                },
            }
        }
    }
}

/// `_meta` of a subscription message: the listen request's id, written exactly as the
/// client sent it (a `serde_json::Value` would turn ids beyond 64 bits into floats).
#[derive(Serialize)]
struct SubscriptionMeta<'a> {
    #[serde(
        rename = "io.modelcontextprotocol/serverInfo",
        skip_serializing_if = "Option::is_none"
    )]
    server_info: Option<&'a wharf_protocol::ServerInfo>,
    #[serde(rename = "io.modelcontextprotocol/subscriptionId")]
    id: &'a RequestId,
}
