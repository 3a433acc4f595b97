//! What a handler knows about the request it serves, and how it talks back while it runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wharf_protocol::jsonrpc::write_notification;
use wharf_protocol::{
    ClientCapabilities, Implementation, LoggingLevel, LoggingMessageParams, RequestId, methods,
};

use crate::bus::ChangeEvent;
use crate::cursor::{CursorError, ListKind};
use crate::error::RpcError;
use crate::handler::HandlerError;
use crate::meta::RequestInfo;
use crate::metrics::{OutcomeCell, StoreOp};
use crate::mrtr::{Ask, Elicited, FormSchema, Round};
use crate::principal::Principal;
use crate::progress::ProgressStream;
use crate::request::{Caller, Outbox};
use crate::runtime::Runtime;
use crate::store::{
    Fence, Handle, HandleKind, HandleRecord, Store, Transaction, TxMode, after, now_millis,
};

/// The request a handler serves: its id, its `_meta`, its cancellation, and its stream.
///
/// Progress and log calls cost nothing when the client did not ask for them.
pub struct Context {
    id: RequestId,
    info: Box<RequestInfo>,
    principal: Principal,
    cancel: Option<CancellationToken>,
    outbox: Option<Outbox>,
    progress: Option<Arc<ProgressStream>>,
    /// The call's transaction slot; `None` where no transaction can be opened (no store,
    /// or a request other than a tool call).
    tx: Option<Arc<TxSlot>>,
    /// The handle arguments the core checked before the handler runs.
    handles: Vec<CheckedHandle>,
    /// The fence of the call's mutation lock, for transactions the handler opens.
    fence: Option<Fence>,
    /// The key of an idempotent call's write, for effects outside the store.
    effect_key: Option<String>,
    /// The handler commits its own steps (`ToolBuilder::idempotent_in_steps`): nothing it
    /// records waits for the call's transaction.
    in_steps: bool,
    /// The answers and state a multi-round retry carries; `None` on a fresh request.
    round: Option<Box<Round>>,
    /// What to run if the call is cancelled (see [`Context::on_cancel`]).
    cleanups: Arc<Cleanups>,
    /// Where the driver says the handler asked for input, when the request is counted.
    pub(crate) outcome: Option<Arc<OutcomeCell>>,
    /// Whether a log message found the client not reading (see [`Context::log`]).
    log_stalled: AtomicBool,
    runtime: Arc<Runtime>,
}

/// Cleanup work a handler registered with [`Context::on_cancel`].
#[derive(Default)]
pub(crate) struct Cleanups(std::sync::Mutex<Vec<Cleanup>>);

type Cleanup = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Held by the driver while a handler runs: dropped with the handler before it returned
/// (the call was cancelled: its client went away, it was cancelled, or its time ran out),
/// it runs the handler's cleanups to completion on a task of their own.
pub(crate) struct CleanupGuard(Option<Arc<Cleanups>>);

impl CleanupGuard {
    /// The handler returned: its cleanups are not needed.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        let Some(cleanups) = self.0.take() else {
            return;
        };
        let pending = std::mem::take(&mut *cleanups.0.lock().unwrap_or_else(|p| p.into_inner()));
        if pending.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("a cancelled call's cleanup could not run: no runtime");
            return;
        };
        runtime.spawn(async move {
            for cleanup in pending {
                cleanup.await;
            }
        });
    }
}

/// A handler's future, which `cleanup` guards (see [`Context::cleanup_guard`]). A handler
/// that panics fails its own request with -32603, not the connection or the stdio session
/// that carries it, and counts as cut short: what it registered with `on_cancel` runs. What
/// the panic said goes to the log only: it may hold anything. Applied where a handler's
/// future is boxed, whose poll is an indirect call anyway: around the whole call it cost
/// every call about 500 instructions (callgrind), here about 140.
pub(crate) fn guarded<T>(
    cleanup: CleanupGuard,
    handler: impl Future<Output = Result<T, HandlerError>> + Send,
) -> impl Future<Output = Result<T, HandlerError>> + Send {
    use futures_util::FutureExt as _;
    std::panic::AssertUnwindSafe(handler)
        .catch_unwind()
        .map(move |out| match out {
            Ok(out) => {
                cleanup.disarm();
                out
            }
            Err(panic) => {
                drop(cleanup);
                Err(HandlerError::Protocol(RpcError::panicked(
                    "a handler",
                    &*panic,
                )))
            }
        })
}

/// The write transaction of one call, shared between the handler (through
/// [`Context::tx`]) and the core, which commits it after the handler succeeds. It also
/// carries the holds on the call's handles, taken when the transaction is first used.
#[derive(Default)]
pub(crate) struct TxSlot(tokio::sync::Mutex<SlotState>);

#[derive(Default)]
struct SlotState {
    tx: Option<SharedTx>,
    /// Handles to hold (and maybe touch) in the transaction before it is used.
    holds: Vec<Hold>,
    /// Set when a held handle turned out to be gone: the call must not commit.
    refused: Option<String>,
    /// The call's mutation lock, for the transaction to check at commit.
    fence: Option<Fence>,
    /// Changes to announce once the transaction has committed.
    announcements: Vec<ChangeEvent>,
}

/// A handle argument the core checked for the call (the caller owns it and it is alive).
pub(crate) struct CheckedHandle {
    pub(crate) record: HandleRecord,
    /// What the caller is told if the handle is gone when a transaction of the handler's
    /// own would write.
    pub(crate) refusal: String,
}

/// A handle a call's transaction must hold before anything is written under it.
pub(crate) struct Hold {
    pub(crate) id: String,
    /// Record a use at this time (the idle expiry is due for a push).
    pub(crate) touch_at: Option<crate::store::Millis>,
    /// What the caller is told if the handle is gone by then.
    pub(crate) refusal: String,
}

type SharedTx = Arc<tokio::sync::Mutex<Box<dyn Transaction>>>;

/// What is left of a call's transaction once its handler returned.
pub(crate) enum Finished {
    /// A transaction to commit (holds taken), or none at all.
    Commit(Option<Box<dyn Transaction>>),
    /// No transaction was opened, but these handles are due a recorded use.
    TouchOnly(Vec<Hold>),
    /// A held handle was gone: roll back and answer with this.
    Refused(String),
}

impl TxSlot {
    /// A slot for a call whose handles need `holds` when it writes.
    pub(crate) fn new(holds: Vec<Hold>, fence: Option<Fence>) -> Self {
        TxSlot(tokio::sync::Mutex::new(SlotState {
            holds,
            fence,
            ..SlotState::default()
        }))
    }

    /// A slot already holding `tx` (an idempotent call's claim).
    pub(crate) fn holding(
        tx: Box<dyn Transaction>,
        holds: Vec<Hold>,
        fence: Option<Fence>,
    ) -> Self {
        TxSlot(tokio::sync::Mutex::new(SlotState {
            tx: Some(Arc::new(tokio::sync::Mutex::new(tx))),
            holds,
            refused: None,
            fence,
            announcements: Vec::new(),
        }))
    }

    /// The changes the handler asked to announce once its writes commit.
    pub(crate) async fn take_announcements(&self) -> Vec<ChangeEvent> {
        std::mem::take(&mut self.0.lock().await.announcements)
    }

    /// Takes the pending holds in `tx`; the refusal if a handle is gone.
    async fn hold(state: &mut SlotState, tx: &mut dyn Transaction) -> Result<(), HandlerError> {
        if let Some(fence) = state.fence.take() {
            tx.fence(&fence);
        }
        if let Some(refusal) = &state.refused {
            return Err(HandlerError::Execution(refusal.clone()));
        }
        // A hold leaves the list only once the store took it: a store error, or a handler
        // that stopped waiting for `cx.tx()` part-way, leaves it for the next `cx.tx()` or
        // the commit, which never go on without it.
        while let Some(hold) = state.holds.last() {
            if !tx.hold_handle(&hold.id, hold.touch_at).await? {
                let refusal = hold.refusal.clone();
                state.refused = Some(refusal.clone());
                return Err(HandlerError::Execution(refusal));
            }
            state.holds.pop();
        }
        Ok(())
    }

    /// Ends the handler's use of the slot. `Err` when the handler still holds the
    /// transaction somewhere (it leaked a guard into another task): it must not commit.
    pub(crate) async fn finish(&self) -> Result<Finished, RpcError> {
        let mut state = self.0.lock().await;
        if let Some(refusal) = state.refused.take() {
            return Ok(Finished::Refused(refusal));
        }
        let Some(shared) = state.tx.take() else {
            let due = std::mem::take(&mut state.holds)
                .into_iter()
                .filter(|h| h.touch_at.is_some())
                .collect();
            return Ok(Finished::TouchOnly(due));
        };
        let mut tx = Arc::try_unwrap(shared)
            .map(tokio::sync::Mutex::into_inner)
            .map_err(|_| {
                RpcError::internal(
                    "a tool kept its transaction after returning; it was rolled back",
                )
            })?;
        match Self::hold(&mut state, tx.as_mut()).await {
            Ok(()) => Ok(Finished::Commit(Some(tx))),
            Err(HandlerError::Execution(refusal)) => Ok(Finished::Refused(refusal)),
            Err(HandlerError::Protocol(e)) => Err(e),
            Err(other) => Err(RpcError::internal(other)),
        }
    }
}

/// The call's write transaction, borrowed by a handler; see [`Context::tx`]. Hold it only
/// while using it: the next [`Context::tx`] waits for it.
pub type TxGuard = tokio::sync::OwnedMutexGuard<Box<dyn Transaction>>;

impl Context {
    pub(crate) fn new(
        runtime: &Arc<Runtime>,
        id: RequestId,
        info: Box<RequestInfo>,
        caller: Caller,
    ) -> Self {
        let progress = match (&info.progress_token, &caller.outbox) {
            (Some(token), Some(outbox)) => Some(ProgressStream::new(
                token.clone(),
                outbox.clone(),
                runtime.config.progress_interval,
                caller.progress_floor,
            )),
            _ => None,
        };
        Context {
            id,
            info,
            principal: caller.principal,
            cancel: caller.cancel,
            outbox: caller.outbox,
            outcome: caller.outcome,
            progress,
            tx: None,
            handles: Vec::new(),
            fence: None,
            effect_key: None,
            in_steps: false,
            round: None,
            cleanups: Arc::default(),
            log_stalled: AtomicBool::new(false),
            runtime: Arc::clone(runtime),
        }
    }

    /// The guard that runs this call's cleanups if it is dropped before disarmed.
    pub(crate) fn cleanup_guard(&self) -> CleanupGuard {
        CleanupGuard(Some(Arc::clone(&self.cleanups)))
    }

    /// Runs `cleanup` to completion, on a task of its own, if this call is cancelled before
    /// its handler returns: the client went away (plain JSON or a stream), sent
    /// `notifications/cancelled`, the call's time ran out, or the handler panicked. A
    /// cancelled handler is dropped at the await it was in, so code after that point never
    /// runs: cleanup that must await (release a reservation, tell another system) belongs
    /// here, not in a `Drop` that spawns a task. Cleanups run in the order they were registered; none runs when the handler
    /// returns, whatever it returns.
    pub fn on_cancel(&self, cleanup: impl std::future::Future<Output = ()> + Send + 'static) {
        self.cleanups
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::pin(cleanup));
    }

    /// The runtime this request runs in.
    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Gives the call its transaction slot.
    pub(crate) fn set_tx(&mut self, tx: Option<Arc<TxSlot>>) {
        self.tx = tx;
    }

    pub(crate) fn set_handles(&mut self, handles: Vec<CheckedHandle>) {
        self.handles = handles;
    }

    pub(crate) fn set_fence(&mut self, fence: Option<Fence>) {
        self.fence = fence;
    }

    pub(crate) fn set_effect_key(&mut self, key: String) {
        self.effect_key = Some(key);
    }

    pub(crate) fn set_in_steps(&mut self) {
        self.in_steps = true;
    }

    /// For an idempotent tool: a key that names this write, the same on every attempt of it
    /// (retries, replicas, a takeover after a crash) and different for every other write.
    /// Pass it to what an effect outside the store goes through (a payment API's
    /// idempotency key, a message id an email service deduplicates on), so that an attempt
    /// that runs again after the effect happened does not repeat it. `None` for other
    /// calls.
    pub fn effect_key(&self) -> Option<&str> {
        self.effect_key.as_deref()
    }

    /// Hands a retry's round to the handler, and keeps what sealing the next round needs
    /// should the handler ask again.
    pub(crate) fn enter_turn(
        &mut self,
        turn: Option<crate::mrtr::Turn>,
    ) -> Option<crate::mrtr::Resume> {
        let turn = turn?;
        let resume = crate::mrtr::Resume {
            binding: turn.binding,
            round: turn.round.number,
            principal: self.principal.clone(),
        };
        self.round = Some(Box::new(turn.round));
        Some(resume)
    }

    /// Starts asking the client for input (MRTR); return the [`Ask`] as the handler's error
    /// (`Err(ask.into())`). Only requests for capabilities the client declared on this
    /// request are sent; asking again for one the last round left out is `-32021` (see
    /// [`Ask`]).
    pub fn ask(&self) -> Ask {
        let left_out = self.round.as_ref().map(|r| r.left_out.clone());
        Ask::new(
            self.info.client_capabilities.clone(),
            left_out.unwrap_or_default(),
        )
    }

    /// How many rounds of input this request went through: 0 on a fresh request.
    pub fn round(&self) -> u32 {
        self.round.as_ref().map_or(0, |r| r.number)
    }

    /// The state the previous round kept with [`Ask::state`]; `None` when there is none or
    /// it does not read as `S`. A [`Handle`] in it reads only as one of this call's handle
    /// arguments, which the core checked again (it may have been retired or have expired
    /// since the state was sealed): any other makes the whole state `None`, so keep such a
    /// handle as its id, or pass it again as an argument.
    pub fn round_state<S: serde::de::DeserializeOwned>(&self) -> Option<S> {
        let state = self.round.as_ref()?.state.clone()?;
        crate::store::reading_input(self.checked_handles(), || {
            serde_json::from_value(state).ok()
        })
    }

    /// The answer to form elicitation `key`, its content checked against the form that was
    /// asked and typed; `None` when it is missing or malformed (ask again). `form` is the form
    /// this handler asks as `key`: answers sent without a `requestState` (a client may send
    /// them with its first try) are checked against it, since nothing else says what was
    /// asked. A [`Handle`] in the content reads only as one of this call's handle
    /// arguments (the client wrote it; nothing else checked it).
    pub fn elicited<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        form: &FormSchema,
    ) -> Option<Elicited<T>> {
        let round = self.round.as_ref()?;
        crate::store::reading_input(self.checked_handles(), || round.elicited(key, form))
    }

    /// What the user did with URL elicitation `key`.
    pub fn elicited_url(&self, key: &str) -> Option<Elicited<()>> {
        self.round.as_ref()?.elicited_url(key)
    }

    /// The client's completion for sampling request `key`.
    pub fn sampled(&self, key: &str) -> Option<wharf_protocol::CreateMessageResult> {
        self.round.as_ref()?.sampled(key)
    }

    /// The client's roots, asked as `key`.
    pub fn roots(&self, key: &str) -> Option<wharf_protocol::ListRootsResult> {
        self.round.as_ref()?.roots(key)
    }

    /// Redeems this round's request state once only, on every replica sharing the store: a
    /// second retry with the same state is refused with `-32602`. Call it before the effect
    /// the answers unlock. In a tool call the redemption commits with the call's writes (a
    /// call that fails leaves the state unused); in a tool whose writes are in steps
    /// ([`ToolBuilder::idempotent_in_steps`](crate::tool::ToolBuilder::idempotent_in_steps)),
    /// at once, in the name of the write: a retry of the same write (the same state, so the
    /// same idempotency key) that was cut short after it redeemed redeems it again, and
    /// goes on. A fresh request has nothing to redeem.
    pub async fn redeem_once(&self) -> Result<(), HandlerError> {
        let Some(round) = &self.round else {
            return Ok(());
        };
        let Some(nonce) = &round.nonce else {
            if round.responses.is_empty() {
                return Ok(());
            }
            // Answers without the state of the round that asked could be replayed at will:
            // a step that must be answered once needs its state.
            return Err(HandlerError::Protocol(RpcError::invalid_params(
                "Invalid requestState: this step can be answered once, and only with the requestState of the round that asked; send the request again without inputResponses",
            )));
        };
        // Redeemed only while the state is alive: a retry that passed with it before it
        // expired, and then waited (for its key's line, its claim, its handler), must not
        // redeem it once its record may be gone.
        if now_millis() >= round.expires_at {
            return Err(HandlerError::Protocol(RpcError::invalid_params(
                "Invalid requestState: it expired before this step was answered; send the request again from the start",
            )));
        }
        let claim = crate::store::Claim {
            scope: "mrtr".to_owned(),
            key: nonce.clone(),
            digest: crate::store::Digest::of("mrtr", &serde_json::Map::new()),
            // Kept past the state's own expiry (after which it is refused anyway) for as long
            // as a call that redeemed it before may take to commit: until then another
            // call's redemption must find it.
            expires_at: after(
                round.expires_at,
                self.runtime
                    .config
                    .max_call_duration
                    .saturating_add(std::time::Duration::from_secs(60)),
            ),
            owner: self.principal.id().to_owned(),
        };
        let used = || {
            HandlerError::Protocol(RpcError::invalid_params(
                "Invalid requestState: it was already used, and this step can be answered once; send the request again from the start",
            ))
        };
        // A tool call records the redemption in its own transaction: it commits with the
        // effect it unlocks, or not at all (and an idempotent call, whose transaction holds
        // its claim from the start, could not wait on a second one on SQLite).
        // A handler in steps commits its own transactions, which an open call transaction
        // would keep waiting on SQLite: its redemption commits at once, on its own.
        if self.tx.is_some() && !self.in_steps {
            let mut tx = self.tx().await?;
            return if tx.record_once(&claim).await? {
                Ok(())
            } else {
                Err(used())
            };
        }
        // Redeemed in the name of the write (its idempotency key): an attempt cut short
        // after it redeemed, retried with the same state (so the same key: the state binds
        // it), is the same write going on, and may redeem it again; any other is refused.
        let redeemed_by = match &self.effect_key {
            Some(key) => format!("redeemed:{key}"),
            None => "redeemed".to_owned(),
        };
        match self.store()?.begin_idempotent(&claim, now_millis()).await? {
            crate::store::Begin::Run(mut tx) => {
                if let Some(fence) = &self.fence {
                    tx.fence(fence);
                }
                tx.complete_claim(&claim, &redeemed_by).await?;
                tx.commit().await.map_err(HandlerError::from)
            }
            crate::store::Begin::Replay(by) if self.effect_key.is_some() && by == redeemed_by => {
                Ok(())
            }
            _ => Err(used()),
        }
    }

    /// The handle arguments of this call, as the core checked them.
    pub(crate) fn checked_handles(&self) -> impl Iterator<Item = &HandleRecord> {
        self.handles.iter().map(|checked| &checked.record)
    }

    /// The stored record of a handle argument of this call (checked: the caller owns it and
    /// it is alive); `None` for a handle that is not one of the call's arguments.
    pub fn handle_record<K: HandleKind>(&self, handle: &Handle<K>) -> Option<&HandleRecord> {
        self.checked_handles()
            .find(|r| r.id == handle.id() && r.kind == K::KIND)
    }

    /// The data a handle argument was minted with (see [`Context::mint_handle_with`]).
    pub fn handle_data<K: HandleKind, T: serde::de::DeserializeOwned>(
        &self,
        handle: &Handle<K>,
    ) -> Result<T, HandlerError> {
        let data = self
            .handle_record(handle)
            .and_then(|r| r.data.as_ref())
            .ok_or_else(|| {
                // Handle ids are credentials in anonymous mode: never in logs.
                HandlerError::internal(format!("a {} handle carries no data", K::KIND))
            })?;
        T::deserialize(data).map_err(|e| {
            HandlerError::internal(format!(
                "the data of a {} handle is unreadable: {e}",
                K::KIND
            ))
        })
    }

    /// Who the request acts for.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The server's store, for reads outside the call's transaction. What is written
    /// through it directly carries no mutation lock's fence (use [`Context::transaction`]
    /// for writes under [`ToolBuilder::mutates`](crate::tool::ToolBuilder::mutates)).
    pub fn store(&self) -> Result<&Arc<dyn Store>, HandlerError> {
        self.runtime
            .store
            .as_ref()
            .ok_or_else(|| HandlerError::internal("this server has no store configured"))
    }

    /// The call's write transaction, opened on first use. The core commits it when the
    /// handler returns a successful result, together with the idempotency record of an
    /// idempotent tool (after it, for a tool in steps), and rolls it back otherwise (an error, an `isError` result, a
    /// cancelled call): a failed call changes nothing.
    pub async fn tx(&self) -> Result<TxGuard, HandlerError> {
        let slot = self.tx.as_ref().ok_or_else(|| {
            HandlerError::internal(
                "no transaction here: only tool calls of a server with a store have one",
            )
        })?;
        let mut state = slot.0.lock().await;
        let shared = match &state.tx {
            Some(shared) => Arc::clone(shared),
            None => {
                let begin = self.store()?.begin(TxMode::Write);
                let tx = self.runtime.store_op(StoreOp::Begin, begin).await?;
                let shared = Arc::new(tokio::sync::Mutex::new(tx));
                state.tx = Some(Arc::clone(&shared));
                shared
            }
        };
        let mut guard = shared.lock_owned().await;
        // Nothing is written under a handle before the transaction holds it: a handle
        // retired since the core checked it is refused here.
        TxSlot::hold(&mut state, guard.as_mut()).await?;
        Ok(guard)
    }

    /// A transaction of the handler's own, which it commits itself: for work recorded in
    /// steps (how far a long call got) or reads outside the call's transaction. Under a
    /// mutation lock ([`ToolBuilder::mutates`](crate::tool::ToolBuilder::mutates)) it carries
    /// the lock's fence, so on a shared store its commit applies nothing once the call lost
    /// its key. A write transaction checks the call's handle arguments, without waiting
    /// ([`Transaction::check_handle`]): if another call retired one since the core checked
    /// it, it is refused (a tool execution error saying the handle is gone), and nothing is
    /// written under a handle that is gone. A retirement under way (the call's own, through
    /// [`Context::retire_handle`], included) is not waited for: on PostgreSQL what a step
    /// writes under a handle another call is retiring at that moment may outlive it.
    pub async fn transaction(&self, mode: TxMode) -> Result<Box<dyn Transaction>, HandlerError> {
        let begin = self.store()?.begin(mode);
        let mut tx = self.runtime.store_op(StoreOp::Begin, begin).await?;
        if let Some(fence) = &self.fence {
            tx.fence(fence);
        }
        if mode == TxMode::Write {
            for checked in &self.handles {
                if !tx.check_handle(&checked.record.id).await? {
                    return Err(HandlerError::Execution(checked.refusal.clone()));
                }
            }
        }
        Ok(tx)
    }

    /// A signed cursor for position `position` of an app's own listing, bound to `scope`
    /// (what was listed: its name, filters, the caller): any replica with the same cursor
    /// key resumes it, and nobody can forge or move it.
    pub fn cursor(&self, position: u64, scope: &[u8]) -> String {
        self.runtime.keys.get().cursors.encode(
            ListKind::App,
            position,
            scope_fingerprint(scope, &self.principal),
        )
    }

    /// The position a cursor from [`Context::cursor`] points at; a garbage, forged, expired
    /// cursor, or one issued for another listing or caller, is an execution error that says
    /// so: in a tool, a result the model reads and can correct by listing again (prompt and
    /// resource handlers answer execution errors as -32603, with the same message).
    pub fn resume(&self, cursor: &str, scope: &[u8]) -> Result<u64, HandlerError> {
        self.runtime
            .keys
            .get()
            .cursors
            .decode(
                cursor,
                ListKind::App,
                scope_fingerprint(scope, &self.principal),
            )
            // An app's fingerprint is its scope, not its content: a mismatch is another
            // listing's (or caller's) cursor, not a stale one.
            .map_err(|e| match e {
                CursorError::Stale => CursorError::OtherListing,
                e => e,
            })
            .map_err(|e| HandlerError::Execution(format!("Invalid cursor: {e}")))
    }

    /// Mints a handle of kind `K` owned by the caller, in the call's transaction; refused
    /// with an `isError` result when the caller holds [`HandleKind::MAX_PER_OWNER`] already.
    pub async fn mint_handle<K: HandleKind>(&self) -> Result<Handle<K>, HandlerError> {
        self.mint(HandleRecord::mint::<K>(&self.principal, now_millis()))
            .await
    }

    /// Mints a handle that carries `data` (what it names: keep it small), handed back with
    /// the handle's check on every later call ([`Context::handle_data`]).
    pub async fn mint_handle_with<K: HandleKind>(
        &self,
        data: serde_json::Value,
    ) -> Result<Handle<K>, HandlerError> {
        let mut record = HandleRecord::mint::<K>(&self.principal, now_millis());
        record.data = Some(data);
        self.mint(record).await
    }

    async fn mint<K: HandleKind>(&self, record: HandleRecord) -> Result<Handle<K>, HandlerError> {
        let mut tx = self.tx().await?;
        if let Some(max) = K::MAX_PER_OWNER {
            let held = tx
                .live_handles(&record.owner, K::KIND, record.created_at)
                .await?;
            if held >= max {
                return Err(HandlerError::execution(format!(
                    "You hold {held} open {kind} handles, the most one user may have at once ({max}). Finish one, or wait for one to expire, before you call {tool} again.",
                    kind = K::KIND,
                    tool = K::CREATED_BY,
                )));
            }
        }
        tx.create_handle(&record).await?;
        Ok(Handle::new(record.id))
    }

    /// Retires a handle (and the data filed under it) in the call's transaction. Only a
    /// handle argument of this call, checked before the handler ran (the caller owns it and
    /// it is alive), can be retired: any other is refused.
    pub async fn retire_handle<K: HandleKind>(
        &self,
        handle: &Handle<K>,
    ) -> Result<(), HandlerError> {
        if self.handle_record(handle).is_none() {
            // Handle ids are credentials in anonymous mode: never in logs.
            return Err(HandlerError::internal(format!(
                "a {} handle that is not a checked argument of this call cannot be retired",
                K::KIND
            )));
        }
        self.tx()
            .await?
            .retire_handle(handle.id())
            .await
            .map_err(HandlerError::from)
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

    /// Resolves when a streamed request is cancelled (the client closed the stream or sent
    /// `notifications/cancelled`). A plain JSON call whose client goes away is cancelled by
    /// dropping it where it waits, so this never resolves there: cleanup that must run in
    /// every case is registered with [`Context::on_cancel`].
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

    /// Reports progress, if the client asked for it with a `progressToken` (otherwise this
    /// costs nothing). Values that do not increase are dropped, so the client always sees
    /// progress strictly increasing; bursts are coalesced to one message per
    /// `ServerConfig::progress_interval`, the last value is sent before the response (unless
    /// the client stopped reading: progress never waits long for it), and nothing is sent
    /// after the response.
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        if let Some(stream) = &self.progress {
            stream.report(progress, total, message).await;
        }
    }

    /// The progress stream, for the core to flush and close before the response.
    pub(crate) fn progress_stream(&self) -> Option<Arc<ProgressStream>> {
        self.progress.clone()
    }

    /// Sends a `notifications/message` if the client asked for logs at `level` or below (and
    /// the server offers logging: see [`ServerBuilder::logging`](crate::ServerBuilder::logging)).
    ///
    /// A client that reads slowly holds the handler back here; one that stopped reading
    /// does not: a message that finds no room on the request's stream for 100 ms is
    /// dropped, and so are the next ones that find it full, until one finds room again
    /// (the handler may hold its call's transaction, locks and turns meanwhile).
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
        let mut message = Vec::with_capacity(128);
        if write_notification(&mut message, methods::NOTIFICATION_MESSAGE, &params).is_err() {
            return;
        }
        let sent = if self.log_stalled.load(Ordering::Relaxed) {
            outbox.try_send(message).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Unsent::Stalled,
                mpsc::error::TrySendError::Closed(_) => Unsent::Gone,
            })
        } else {
            outbox
                .send_timeout(message, LOG_WAIT)
                .await
                .map_err(|e| match e {
                    mpsc::error::SendTimeoutError::Timeout(_) => Unsent::Stalled,
                    mpsc::error::SendTimeoutError::Closed(_) => Unsent::Gone,
                })
        };
        match sent {
            Ok(()) => self.log_stalled.store(false, Ordering::Relaxed),
            Err(Unsent::Stalled) => {
                if !self.log_stalled.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "a client is not reading its request's stream: log messages are dropped until it does"
                    );
                }
            }
            // The receiver is gone only when the response stream closed: nothing to do.
            Err(Unsent::Gone) => {}
        }
    }

    /// Announces a change to every listen stream that opted into it, on every replica the
    /// server's bus reaches (see [`Server::announce`](crate::Server::announce)).
    pub async fn announce(&self, event: ChangeEvent) {
        self.runtime.announce(event).await;
    }

    /// Announces `event` once the call's writes have committed (see [`Context::tx`]), or may
    /// have (a commit whose answer was lost; a write in steps, whose steps stand whatever
    /// comes after), and not when they are rolled back: listeners who re-read on the
    /// notification see the change. On Redis and PostgreSQL, when the server uses the
    /// store's bus, the commit of the call's transaction ([`Context::tx`]) carries it (see
    /// [`Transaction::announce_with_commit`](crate::store::Transaction::announce_with_commit)):
    /// it goes out even if the process dies right after. Where there is no call transaction
    /// (no store, or not a tool call) it is announced at once.
    pub async fn announce_on_commit(&self, event: ChangeEvent) {
        match &self.tx {
            Some(slot) => slot.0.lock().await.announcements.push(event),
            None => self.runtime.announce(event).await,
        }
    }
}

fn scope_fingerprint(scope: &[u8], principal: &Principal) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(principal.id().as_bytes());
    h.update([0]);
    h.update(scope);
    let d = h.finalize();
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// How long a log message waits for room on its request's stream before the client counts
/// as not reading (see [`Context::log`]).
const LOG_WAIT: Duration = Duration::from_millis(100);

/// Why a log message was not sent.
enum Unsent {
    /// The stream had no room: the client is not reading.
    Stalled,
    /// The stream is closed: the request is over.
    Gone,
}
