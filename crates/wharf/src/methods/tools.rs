//! `tools/call`: arguments checked against the schema, handle arguments checked
//! against their owner and expiry, idempotent writes claimed, the handler run in the call's
//! transaction, and the transaction committed with the first result.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tracing::{Instrument as _, Span};
use wharf_protocol::{CallToolParams, CallToolResult, RequestId, ResultType, methods};

use crate::context::{CheckedHandle, Context, Finished, Hold, TxSlot};
use crate::deadline::later;
use crate::driver::{Ended, drive, open_turn};
use crate::error::{ErrorKind, RpcError};
use crate::fair_share::Share;
use crate::methods::Call;
use crate::metrics::{Outcome, StoreOp};
use crate::mrtr::{Binding, StateRefused};
use crate::mutation::KeyTurn;
use crate::principal::Principal;
use crate::registry::{HandleParam, ToolEntry};
use crate::reply::respond;
use crate::runtime::{Cut, Runtime, Timed, Timing};
use crate::schema::first_violation;
use crate::store::{Begin, Claim, Digest, Fence, Millis, after, now_millis};
use crate::store::{Expiry, HandleRecord, human, is_handle_id};
use crate::store::{KEY_ARGUMENT, REPLAY_META, StoreError, Transaction};
use crate::tool::Idempotence;
use crate::trace;
use crate::uri_template;

/// Where a call stands before its handler runs.
enum Prepared {
    /// Run the handler with these checked handles, in this transaction slot; a write in
    /// steps holds its claim in `held_claim` meanwhile, where it can.
    Run {
        handles: Vec<CheckedHandle>,
        slot: Option<Arc<TxSlot>>,
        held_claim: Option<Box<dyn Transaction>>,
    },
    /// Answer without running the handler.
    Answer(CallToolResult),
    /// The stored first result of this write.
    Replay(String),
}

/// Calls tool `params.name`; says how the call ended where the request is counted.
pub(crate) async fn call(call: Call<'_, Box<CallToolParams>>) -> Result<Vec<u8>, RpcError> {
    let cell = call.caller.outcome.clone();
    let (message, outcome) = run(call).await?;
    if let Some(cell) = cell {
        cell.set(outcome);
    }
    Ok(message)
}

/// Runs a tool call to its response and how it ended.
async fn run(call: Call<'_, Box<CallToolParams>>) -> Result<(Vec<u8>, Outcome), RpcError> {
    let Call {
        registry,
        runtime,
        id,
        info,
        params,
        caller,
    } = call;
    let entry = registry
        .tool(&params.name)
        .ok_or_else(|| RpcError::invalid_params(format!("Unknown tool: {}", params.name)))?;
    // Scopes and client capabilities were checked in admission.
    let args = Value::Object(params.arguments.unwrap_or_default());
    if let Some(why) = refused_arguments(entry, &args) {
        // Arguments the model got wrong are the model's to correct: a tool execution error
        // it reads (as the specification files input validation), not a protocol error.
        let message = format!("Invalid arguments for tool {}: {why}", params.name);
        return respond_tool(runtime, &id, CallToolResult::error(message));
    }
    let Value::Object(mut args) = args else {
        return Err(RpcError::internal("tool arguments are not an object"));
    };
    let turn = match open_turn(
        runtime,
        &info,
        &caller.principal,
        params.request_state.as_deref(),
        params.input_responses,
        || Binding::new(methods::TOOLS_CALL, &params.name, &args),
    ) {
        Ok(turn) => turn,
        // The caller's state ran out, maybe while the write it confirmed was made (the user
        // took their time, the answer was lost): the retry gets that write's first result,
        // waiting for it if it is still being made. A state this server cannot open (its
        // key retired since: a state sealed just before a rotation outlives its key by as
        // little as the keys' overlap) may have confirmed a write too: its first result is
        // looked up, read only and as the caller's own, what a retry without any state
        // would get; no claim is taken under a state that may be forged.
        Err(refused) => {
            let mut args = args;
            let keyed = keyed(runtime, entry, &mut args, &caller.principal)?;
            let (keyed, now) = (keyed.as_ref(), now_millis());
            let stored = match refused {
                StateRefused::Expired(_) => made_or_making(runtime, keyed, now).await?,
                StateRefused::Invalid(_) => replayed(runtime, keyed, now).await?,
            };
            if let Some(stored) = stored {
                return replay(runtime, &id, &stored);
            }
            return Err(refused.into());
        }
    };
    let name = &entry.def.tool.name;
    // The call's own limit, never beyond the server's, covers its wait for its turn and
    // its run: past it the handler's future is dropped (it stops at its next await) and
    // its transaction rolls back.
    let limit = entry.time_limit(runtime.config.max_call_duration);
    let deadline = later(tokio::time::Instant::now(), limit);
    let bound = Bound {
        tool: name,
        limit,
        deadline,
    };
    // What the tool mutates, read before the idempotency key leaves the arguments.
    let mutation = entry.def.mutates.as_ref().map(|argument| {
        let value = args
            .get(argument)
            .and_then(Value::as_str)
            .unwrap_or_default();
        (argument, mutation_key(&caller.principal, value))
    });
    let keyed = keyed(runtime, entry, &mut args, &caller.principal)?;
    // A write in steps on a store with one writer cannot hold its claim while its handler
    // commits: its attempts take turns in this process's line instead (such a store serves
    // one host), and a retry sent meanwhile waits, then replays.
    let key_turn = match &keyed {
        Some(k) if !k.holds_claim => {
            let (scope, key) = (&k.claim.scope, &k.claim.key);
            // No mutation key starts like this (theirs start with a length).
            let line = format!("claim:{}:{scope}:{key}", scope.len());
            let wait = runtime
                .mutations
                .wait_turn(line, caller.principal.id(), None);
            let behind = || "an earlier attempt of the same write".into();
            match turn_on(runtime, TurnOn::Key, wait, &bound, Some(&k.claim), behind).await? {
                Waited::Turn(turn) => Some(turn),
                Waited::Replay(stored) => return replay(runtime, &id, &stored),
            }
        }
        _ => None,
    };
    let lock = match mutation {
        Some((argument, key)) => {
            let principal = caller.principal.id();
            let wait = runtime
                .mutations
                .wait_turn(key, principal, runtime.store.as_ref());
            let replayable = keyed.as_ref().map(|k| &k.claim);
            let behind = || format!("earlier calls on the same {argument}");
            match turn_on(runtime, TurnOn::Key, wait, &bound, replayable, behind).await? {
                Waited::Turn(turn) => Some(turn),
                Waited::Replay(stored) => return replay(runtime, &id, &stored),
            }
        }
        None => None,
    };
    // A write in steps that holds its claim on a connection of its own waits for one of the
    // places the store keeps for such claims (after its turns, which every call takes in
    // the same order), so that writes in steps alone never hold every connection while
    // their steps wait for one.
    let step_claim = match (&keyed, &runtime.step_claims) {
        (Some(k), Some(places)) if k.how == Idempotence::InSteps && k.holds_claim => {
            let wait = async { Ok(places.enter(caller.principal.id()).await) };
            let behind = || "other writes in steps holding the store's connections".into();
            let on = TurnOn::ClaimPlace;
            let waited = turn_on(runtime, on, wait, &bound, Some(&k.claim), behind).await;
            match waited {
                Ok(Waited::Turn(place)) => Some(place),
                // Ended rather than dropped: a store's lock goes back to its session.
                Ok(Waited::Replay(stored)) => {
                    end_turns([lock, key_turn]).await;
                    return replay(runtime, &id, &stored);
                }
                Err(e) => {
                    end_turns([lock, key_turn]).await;
                    return Err(e);
                }
            }
        }
        _ => None,
    };
    let fence = lock.as_ref().and_then(KeyTurn::fence);
    // Claiming the key may wait behind another attempt of the same write, and a write for
    // the store's lock: within the limit too. Dropped, the claim's transaction rolls back
    // (the store's own wait ends on its own, within its lock wait, as when a client leaves).
    let prepared = prepare(
        runtime,
        entry,
        &args,
        &caller.principal,
        keyed.as_ref(),
        fence.clone(),
    );
    let prepared = match tokio::time::timeout_at(deadline, prepared).await {
        Ok(Ok(prepared)) => prepared,
        failed => {
            end_turns([lock, key_turn]).await;
            return Err(match failed {
                Ok(Err(e)) => e,
                _ => bound.waited_out(
                    "its turn at the store (another attempt of the same write, or a lock on what it uses)",
                ),
            });
        }
    };
    let (handles, slot, held_claim) = match prepared {
        Prepared::Run {
            handles,
            slot,
            held_claim,
        } => (handles, slot, held_claim),
        Prepared::Answer(result) => {
            end_turns([lock, key_turn]).await;
            return respond_tool(runtime, &id, result);
        }
        Prepared::Replay(stored) => {
            end_turns([lock, key_turn]).await;
            return replay(runtime, &id, &stored);
        }
    };
    let mut cx = Context::new(runtime, id.clone(), info, caller);
    cx.set_tx(slot.clone());
    cx.set_handles(handles);
    cx.set_fence(fence);
    if let Some(k) = &keyed {
        cx.set_effect_key(k.claim.effect_key());
        if k.how == Idempotence::InSteps {
            cx.set_in_steps();
        }
    }
    let handler = Arc::clone(&entry.def.handler);
    let run = |cx: Context| async move {
        // Stopped at its deadline, the handler's future is dropped with the guard inside it
        // (see `context::guarded`): what it registered with `on_cancel` runs.
        match tokio::time::timeout_at(deadline, handler.call(cx, Value::Object(args))).await {
                Ok(outcome) => outcome,
                Err(_) => Err(RpcError::new(
                    ErrorKind::TimedOut,
                    format!(
                        "Timed out: tool {name} ran longer than its limit of {}; nothing it wrote was kept",
                        human(limit)
                    ),
                )
                .into()),
            }
    };
    let in_steps = keyed
        .as_ref()
        .is_some_and(|k| k.how == Idempotence::InSteps);
    let result = match drive(cx, turn, run).await {
        Ok(Ended::Value(r)) => r,
        Ok(Ended::Failed(message)) => CallToolResult::error(message),
        // Nothing to commit: the keys go to the next caller (the call's transaction, not
        // committed, is dropped after).
        Ok(Ended::Asked(response)) => {
            leave(runtime, [lock, key_turn], slot.as_ref(), in_steps).await;
            return Ok((response, Outcome::InputRequired));
        }
        Err(e) => {
            leave(runtime, [lock, key_turn], slot.as_ref(), in_steps).await;
            return Err(e);
        }
    };
    // What the schemas would refuse of a result its type lets through is a handler's
    // mistake: nothing of it is sent, nor committed.
    let failed = result.is_error == Some(true);
    let structured = (&entry.output, &result.structured_content, failed);
    let refused = match structured {
        (Some(validator), Some(structured), false) => first_violation(validator, structured)
            .map(|(message, path)| {
                format!("tool {name} returned structuredContent that violates its outputSchema: {message} at {path}")
            }),
        // A tool with an outputSchema must give structured results (tools.mdx).
        (Some(_), None, false) => Some(format!(
            "tool {name} has an outputSchema but returned no structuredContent"
        )),
        _ => None,
    }
    .or_else(|| {
        uri_template::bad_content_uri(&result.content).map(|uri| {
            format!("tool {name} returned content whose URI {uri:?} is not a URI (RFC 3986)")
        })
    });
    if let Some(refused) = refused {
        leave(runtime, [lock, key_turn], slot.as_ref(), in_steps).await;
        return Err(RpcError::internal(refused));
    }
    if slot.is_none() && lock.is_none() {
        return respond_tool(runtime, &id, result);
    }
    // Once the handler has returned, its commit and the release of its key run to the end
    // on their own task, even if the client goes away meanwhile: a commit cut short must
    // never let the next writer of the key in before it lands.
    let settle = tokio::spawn(
        settle(
            Arc::clone(runtime),
            slot,
            keyed.map(|k| match k.how {
                Idempotence::OneTransaction => Record::InCallTransaction(k.claim),
                Idempotence::InSteps => Record::AfterSteps(
                    k.claim,
                    held_claim.map(|tx| HeldClaim {
                        tx,
                        place: step_claim,
                    }),
                ),
            }),
            [lock, key_turn],
            result,
            failed,
        )
        // The commit's spans stay under the request's, though it runs on its own task.
        .instrument(Span::current()),
    );
    let result = settle
        .await
        .map_err(|e| RpcError::internal(format!("the commit task failed: {e}")))??;
    respond_tool(runtime, &id, result)
}

/// Where an idempotent call's first result is recorded.
enum Record {
    /// In the call's transaction, with its writes.
    InCallTransaction(Claim),
    /// After the handler's own commits: in the claim held from the start, or (where none
    /// could be held) in one made then.
    AfterSteps(Claim, Option<HeldClaim>),
}

/// The claim a write in steps holds while its handler runs, and the place it takes among
/// the store's connections. Dropped, the transaction goes first (rolling the claim back),
/// then the place.
struct HeldClaim {
    tx: Box<dyn Transaction>,
    place: Option<Share>,
}

/// Lets the next call on the keys run. Ended, a store's lock goes back to its session;
/// dropped instead (a call cut short), the session holding it is closed.
async fn end_turns(turns: [Option<KeyTurn>; 2]) {
    for turn in turns.into_iter().flatten() {
        turn.end().await;
    }
}

/// Ends a call that stops before its commit: its turns go to the next caller, and what a
/// write in steps announced goes out (its steps stand; a call in one transaction leaves
/// nothing written).
async fn leave(
    runtime: &Runtime,
    turns: [Option<KeyTurn>; 2],
    slot: Option<&Arc<TxSlot>>,
    in_steps: bool,
) {
    end_turns(turns).await;
    if let (true, Some(slot)) = (in_steps, slot) {
        for event in slot.take_announcements().await {
            runtime.announce(event).await;
        }
    }
}

/// Commits a call's writes and records its first result (in the same transaction, or
/// after the handler's own commits for a write in steps), or rolls them back when it
/// failed; then hands its keys to the next caller: `turns` are the turn on what the tool
/// mutates and a write in steps' turn on its idempotency key. Returns the result to send.
async fn settle(
    runtime: Arc<Runtime>,
    slot: Option<Arc<TxSlot>>,
    record: Option<Record>,
    turns: [Option<KeyTurn>; 2],
    result: CallToolResult,
    failed: bool,
) -> Result<CallToolResult, RpcError> {
    // A failed call changes nothing: its transaction is dropped, which rolls it back, and
    // no idempotency record is kept, so a retry runs again.
    let (finished, announcements) = match &slot {
        Some(slot) => (slot.finish().await, slot.take_announcements().await),
        None => (Ok(Finished::Commit(None)), Vec::new()),
    };
    // Whether the writes may have landed: a write in steps committed its steps itself,
    // whatever came of the call after; otherwise once the commit is sent.
    let mut written = matches!(record, Some(Record::AfterSteps(..)));
    // Whether the commit carried the announcements itself (on the store's own bus).
    let mut carried = false;
    let settled = async {
        let result = match finished? {
            Finished::Refused(refusal) => return Ok(CallToolResult::error(refusal)),
            Finished::TouchOnly(due) => {
                for hold in due {
                    if let Some(at) = hold.touch_at {
                        // A use not recorded only lets the handle idle out a touch interval
                        // early: no reason to fail a call that has its result.
                        let touch = runtime.require_store()?.touch_handle(&hold.id, at);
                        if let Err(e) = runtime.store_op(StoreOp::TouchHandle, touch).await {
                            tracing::warn!(error = %e, "could not record a use of a handle");
                        }
                    }
                }
                if failed {
                    return Ok(result);
                }
                written = true;
                result
            }
            Finished::Commit(Some(mut tx)) if !failed => {
                let claim = match &record {
                    Some(Record::InCallTransaction(claim)) => Some(claim),
                    _ => None,
                };
                // Sent with the commit where the store can: they go out exactly when it
                // applies. Otherwise, or when the commit fails, they are announced below.
                let with_commit = runtime.bus_in_store
                    && !announcements.is_empty()
                    && tx.announce_with_commit(&announcements);
                let commit = async {
                    if let Some(claim) = claim {
                        let stored = serde_json::to_string(&result).map_err(RpcError::internal)?;
                        tx.complete_claim(claim, &stored).await?;
                    }
                    Ok::<_, RpcError>(tx.commit().await)
                };
                // From here the writes may land, whatever the store answers (an answer
                // lost with the connection says nothing of the commit).
                written = true;
                match runtime.store_op(StoreOp::Commit, commit).await? {
                    Ok(()) => {
                        carried = with_commit;
                        result
                    }
                    // What was applied stays, and the claim was recorded with this failure:
                    // the call answers what its retries will.
                    Err(StoreError::PartlyApplied(what)) => CallToolResult::error(what),
                    Err(e) => return Err(e.into()),
                }
            }
            Finished::Commit(None) if !failed => {
                written = true;
                result
            }
            Finished::Commit(_) => return Ok(result),
        };
        if let Some(Record::AfterSteps(claim, held)) = record {
            let record = record_steps(runtime.require_store()?, &claim, held, &result);
            runtime.store_op(StoreOp::Commit, record).await?;
        }
        Ok(result)
    }
    .await;
    // Only now, with the writes committed (or failed), may the next call on the keys run.
    end_turns(turns).await;
    // Announced whenever the writes may have landed, the call's answer aside: a listener
    // told of a change that did not happen reads again and finds nothing new; one never
    // told of one that did stays wrong until the next change.
    if written && !carried {
        for event in announcements {
            runtime.announce(event).await;
        }
    }
    settled
}

/// The idempotency key of a call of an idempotent tool, taken out of its arguments (the
/// handler never sees it).
struct Keyed<'e> {
    claim: Claim,
    /// The handle argument that scopes the key: the first handle of the arguments
    /// themselves, when the tool takes one.
    handle: Option<(&'e HandleParam, String)>,
    how: Idempotence,
    /// Whether the claim is held while the handler runs: always for one transaction; for
    /// a write in steps unless the store has one writer, which the handler's own commits
    /// need (SQLite).
    holds_claim: bool,
}

impl Keyed<'_> {
    /// Whether a write may have been made under this key: not when its scope is a string
    /// no handle could be (no call ran under it). Such a key is never looked up: it could
    /// be longer than a store keeps in a key, which PostgreSQL answers with an error.
    fn may_name_a_write(&self) -> bool {
        self.handle.as_ref().is_none_or(|(_, id)| is_handle_id(id))
    }
}

/// The claim a call of an idempotent tool makes; `None` for other tools.
fn keyed<'e>(
    runtime: &Runtime,
    entry: &'e ToolEntry,
    args: &mut Map<String, Value>,
    principal: &Principal,
) -> Result<Option<Keyed<'e>>, RpcError> {
    let Some(how) = entry.def.idempotent else {
        return Ok(None);
    };
    let name = &entry.def.tool.name;
    let Some(Value::String(key)) = args.remove(KEY_ARGUMENT) else {
        // `refused_arguments` answered such a call.
        return Err(RpcError::internal(format!(
            "tool {name} was called without its {KEY_ARGUMENT}"
        )));
    };
    let handle = entry
        .handles
        .iter()
        .filter(|p| p.is_top_level())
        .find_map(|p| Some((p, p.ids(args).first()?.to_string())));
    let claim = Claim {
        scope: match &handle {
            Some((_, id)) => format!("h:{id}"),
            None => Claim::principal_scope(principal.id(), name),
        },
        digest: Digest::of(name, args),
        key,
        expires_at: after(now_millis(), runtime.config.idempotency_retention),
        owner: principal.id().to_owned(),
    };
    let holds_claim = how == Idempotence::OneTransaction
        || runtime.store.as_ref().is_some_and(|s| s.shares_locks());
    Ok(Some(Keyed {
        claim,
        handle,
        how,
        holds_claim,
    }))
}

/// What waiting for a turn came to.
enum Waited<T> {
    Turn(T),
    /// The write the caller retries was made meanwhile: its first result, as stored.
    Replay(String),
}

/// How long a call waits for its turn before it looks whether its write was made already:
/// a turn free at once costs a first attempt no lookup.
const REPLAY_LOOKUP_AFTER: Duration = Duration::from_millis(5);

/// What a call waits for its turn on.
#[derive(Clone, Copy)]
enum TurnOn {
    /// A key: what it mutates, or (one writer) its idempotency key.
    Key,
    /// A place among the store's connections for a write in steps' claim.
    ClaimPlace,
}

/// How long a call may take: its tool, its limit and when that runs out.
struct Bound<'a> {
    tool: &'a str,
    limit: Duration,
    deadline: tokio::time::Instant,
}

impl Bound<'_> {
    /// The refusal of a call that waited its whole limit behind `behind`, without running.
    fn waited_out(&self, behind: &str) -> RpcError {
        RpcError::new(
            ErrorKind::TimedOut,
            format!(
                "Timed out: tool {} waited its whole limit of {} for {behind} to finish; it did not run",
                self.tool,
                human(self.limit),
            ),
        )
    }
}

/// Waits for a turn (`wait`) until the call's deadline; past it, the call is refused as
/// timed out behind what `behind` names, without having run. A retry of the write `claim`
/// that has to wait behind another call is answered from the write's record, if it was
/// made, without waiting any longer.
async fn turn_on<T>(
    runtime: &Runtime,
    on: TurnOn,
    wait: impl std::future::Future<Output = Result<T, StoreError>>,
    bound: &Bound<'_>,
    claim: Option<&Claim>,
    behind: impl FnOnce() -> String,
) -> Result<Waited<T>, RpcError> {
    let store = runtime.store.as_ref();
    let waited = async {
        tokio::pin!(wait);
        let (Some(claim), Some(store)) = (claim, store) else {
            return wait.await.map(Waited::Turn);
        };
        tokio::select! {
            biased;
            turn = &mut wait => return turn.map(Waited::Turn),
            () = tokio::time::sleep(REPLAY_LOOKUP_AFTER) => {}
        }
        tokio::select! {
            biased;
            turn = &mut wait => turn.map(Waited::Turn),
            found = runtime.store_op_raced(StoreOp::Replay, store.replay_of(claim, now_millis())) => match found {
                Ok(Some(stored)) => Ok(Waited::Replay(stored)),
                Ok(None) => wait.await.map(Waited::Turn),
                Err(e) => {
                    tracing::debug!(error = %e, "no replay lookup; the call waits for its turn");
                    wait.await.map(Waited::Turn)
                }
            },
        }
    };
    // Timed until this returns or is dropped (the client gone).
    let _timed = match (&runtime.metrics, on) {
        (Some(m), TurnOn::Key) => Some(Timed::start(m, Timing::LockWait, Cut::Timed)),
        _ => None,
    };
    let span = match on {
        TurnOn::Key => trace::mutation_wait(),
        TurnOn::ClaimPlace => trace::claim_wait(),
    };
    let waited = tokio::time::timeout_at(bound.deadline, waited)
        .instrument(span)
        .await;
    match waited {
        Ok(waited) => Ok(waited?),
        Err(_) => Err(bound.waited_out(&behind())),
    }
}

/// Records the first result of a write in steps, once its handler's commits landed: in the
/// claim it held from the start, or, where it could not hold one (one writer), in a claim
/// made now, which its turn on the key kept free.
async fn record_steps(
    store: &Arc<dyn crate::store::Store>,
    claim: &Claim,
    held: Option<HeldClaim>,
    result: &CallToolResult,
) -> Result<(), RpcError> {
    let stored = serde_json::to_string(result).map_err(RpcError::internal)?;
    // The place goes back once this returns, after the claim's transaction ended.
    let (mut tx, _place) = match held {
        Some(held) => (held.tx, held.place),
        None => match store.begin_idempotent(claim, now_millis()).await? {
            Begin::Run(tx) => (tx, None),
            Begin::Replay(_) | Begin::Mismatch => {
                return Err(RpcError::internal(
                    "a write in steps found its key recorded by another attempt under its own turn",
                ));
            }
        },
    };
    tx.complete_claim(claim, &stored).await?;
    Ok(tx.commit().await?)
}

/// Checks the handle arguments and, for an idempotent tool, claims its key (a write in steps
/// that cannot hold its claim only checks it). The handle that scopes the key is loaded
/// together with the claim (one round trip on PostgreSQL), and judged before the claim's
/// outcome is looked at.
async fn prepare(
    runtime: &Runtime,
    entry: &ToolEntry,
    args: &Map<String, Value>,
    principal: &Principal,
    keyed: Option<&Keyed<'_>>,
    fence: Option<Fence>,
) -> Result<Prepared, RpcError> {
    let name = &entry.def.tool.name;
    let now = now_millis();
    let present: Vec<(&HandleParam, String)> = entry
        .handles
        .iter()
        .flat_map(|p| p.ids(args).into_iter().map(move |id| (p, id.to_owned())))
        .collect();
    let mut handles = Vec::new();
    let mut holds = Vec::new();
    let mut scope_skipped = keyed.is_none_or(|k| k.handle.is_none());
    for (param, id) in present {
        // The handle that scopes the key is loaded with the claim, below (`keyed` chose it
        // by the same rule: the first top-level handle present).
        if !scope_skipped && param.is_top_level() {
            scope_skipped = true;
            continue;
        }
        let record = load_handle(runtime, &id).await?;
        match judge_handle(param, record, principal, now) {
            Ok((record, touch)) => {
                holds.push(hold(param, &record, touch, now));
                handles.push(checked(param, record));
            }
            // A write already made is replayed, though it may have retired this handle (or
            // the handle expired since): its retry must get the first result.
            Err(refusal) => return refused_unless_replayed(runtime, keyed, refusal, now).await,
        }
    }
    let Some(keyed) = keyed else {
        return Ok(Prepared::Run {
            handles,
            // No store, no transaction: nothing to allocate on the stateless path.
            slot: runtime
                .store
                .is_some()
                .then(|| Arc::new(TxSlot::new(holds, fence))),
            held_claim: None,
        });
    };

    let store = runtime.require_store()?;
    let claim = &keyed.claim;
    // The scope handle's hold: the claim's transaction has it already, so only a due use
    // is left to record there; a write in steps, whose claim is let go, needs it whole.
    let mut scope_hold = None;
    let begun = match &keyed.handle {
        // A write in steps takes its claim without the handle: held across the steps, a
        // claim holding the handle would keep the handler's own steps from retiring it
        // (PostgreSQL's lock on it; Redis's check that it still exists when the record is
        // taken). Each step checks it in its own transaction (`Context::transaction`,
        // `Transaction::check_handle`), and the call's transaction holds it. The handle is
        // judged first, so that only its owner claims (or replays) under it.
        Some((param, id)) if keyed.how == Idempotence::InSteps => {
            let record = if is_handle_id(id) {
                load_handle(runtime, id).await?
            } else {
                None
            };
            match judge_handle(param, record, principal, now) {
                Ok((record, touch)) => {
                    scope_hold = Some(hold(param, &record, touch, now));
                    handles.push(checked(param, record));
                }
                // Gone or expired since the write that retired it: that write is replayed.
                Err(refusal) => {
                    return refused_unless_replayed(runtime, Some(keyed), refusal, now).await;
                }
            }
            let begun = store.begin_idempotent(claim, now);
            runtime.store_op(StoreOp::Begin, begun).await?
        }
        Some((param, id)) => {
            let (record, begun) = if is_handle_id(id) {
                let claimed = store.claim_on_handle(claim, id, principal.id(), now);
                runtime.store_op(StoreOp::Begin, claimed).await?
            } else {
                (None, None)
            };
            // A write already made is replayed before the handle's liveness is judged (the
            // handle may have expired since), once its owner is known to be the caller's;
            // if the handle is gone (the write retired it: a commit, an abort), the record
            // says whose write it was.
            let gone = record.is_none() && is_handle_id(id);
            if let Some(Begin::Replay(stored)) = begun {
                return Ok(Prepared::Replay(stored));
            }
            if gone {
                if let Some(stored) = replayed(runtime, Some(keyed), now).await? {
                    return Ok(Prepared::Replay(stored));
                }
            }
            match judge_handle(param, record, principal, now) {
                Ok((record, touch)) => {
                    scope_hold = Some(hold(param, &record, touch, now));
                    handles.push(checked(param, record));
                }
                // Dropping the claim rolls it back: a refused call leaves no trace.
                Err(refusal) => return Ok(Prepared::Answer(CallToolResult::error(refusal))),
            }
            begun.ok_or_else(|| RpcError::internal("the store claimed nothing for the owner"))?
        }
        None => {
            let begun = store.begin_idempotent(claim, now);
            runtime.store_op(StoreOp::Begin, begun).await?
        }
    };
    Ok(match begun {
        Begin::Run(tx) => {
            let (slot, held_claim) = match keyed.how {
                Idempotence::OneTransaction => {
                    holds.extend(scope_hold.filter(|h| h.touch_at.is_some()));
                    (TxSlot::holding(tx, holds, fence), None)
                }
                // The handler commits its steps in transactions of its own; the claim keeps
                // other attempts out meanwhile (or, where it cannot be held, the turn on the
                // key does) and takes the record after.
                Idempotence::InSteps => {
                    holds.extend(scope_hold);
                    // The record it takes at the end is written under the call's mutation
                    // lock too.
                    let held = keyed.holds_claim.then_some(tx).map(|mut tx| {
                        if let Some(fence) = &fence {
                            tx.fence(fence);
                        }
                        tx
                    });
                    (TxSlot::new(holds, fence), held)
                }
            };
            Prepared::Run {
                handles,
                slot: Some(Arc::new(slot)),
                held_claim,
            }
        }
        Begin::Replay(stored) => Prepared::Replay(stored),
        Begin::Mismatch => Prepared::Answer(CallToolResult::error(format!(
            "The idempotency key {:?} was already used for a different call (another tool, or {name} with other arguments). Retry a call with the same tool and arguments as the first, or use a new key for a new write.",
            claim.key
        ))),
    })
}

/// A call whose handle `refusal` refused: the first result of the write its key names, when
/// that write was made or is still being made (see [`made_or_making`]: a write in steps may
/// have retired the handle in a step, and a handle may idle out while its write runs);
/// otherwise the refusal.
async fn refused_unless_replayed(
    runtime: &Runtime,
    keyed: Option<&Keyed<'_>>,
    refusal: String,
    now: Millis,
) -> Result<Prepared, RpcError> {
    Ok(match made_or_making(runtime, keyed, now).await? {
        Some(stored) => Prepared::Replay(stored),
        None => Prepared::Answer(CallToolResult::error(refusal)),
    })
}

/// The first result of the write `keyed` names, once made: recorded already, or recorded
/// by an attempt still running, whose claim is waited for as a duplicate's is. `None` when
/// no attempt holds the key (the claim taken to look, dropped, rolls back).
async fn made_or_making(
    runtime: &Runtime,
    keyed: Option<&Keyed<'_>>,
    now: Millis,
) -> Result<Option<String>, RpcError> {
    let Some(keyed) = keyed.filter(|k| k.may_name_a_write()) else {
        return Ok(None);
    };
    if let Some(stored) = replayed(runtime, Some(keyed), now).await? {
        return Ok(Some(stored));
    }
    let begun = runtime.require_store()?.begin_idempotent(&keyed.claim, now);
    match runtime.store_op(StoreOp::Begin, begun).await? {
        // Read again as the caller's own: the key's scope may be another's handle.
        Begin::Replay(_) => replayed(runtime, Some(keyed), now).await,
        Begin::Run(_) | Begin::Mismatch => Ok(None),
    }
}

/// The first result of the write `keyed` names, if it was made: what a retry gets when one
/// of its handles is gone or refused (the write may have retired it).
async fn replayed(
    runtime: &Runtime,
    keyed: Option<&Keyed<'_>>,
    now: Millis,
) -> Result<Option<String>, RpcError> {
    let Some(keyed) = keyed.filter(|k| k.may_name_a_write()) else {
        return Ok(None);
    };
    let lookup = runtime.require_store()?.replay_of(&keyed.claim, now);
    Ok(runtime.store_op(StoreOp::Replay, lookup).await?)
}

/// A tool's result as its response, and how the call ended.
fn respond_tool(
    runtime: &Runtime,
    id: &RequestId,
    mut result: CallToolResult,
) -> Result<(Vec<u8>, Outcome), RpcError> {
    result.result_type = ResultType::Complete;
    result.meta.server_info = Some(runtime.info.clone());
    let outcome = match result.is_error {
        Some(true) => Outcome::ToolError,
        _ => Outcome::Ok,
    };
    Ok((respond(id, &result)?, outcome))
}

/// The stored first result of an idempotent write, marked as a replay.
fn replay(runtime: &Runtime, id: &RequestId, stored: &str) -> Result<(Vec<u8>, Outcome), RpcError> {
    let mut result: CallToolResult = serde_json::from_str(stored)
        .map_err(|e| RpcError::internal(format!("stored idempotent result is unreadable: {e}")))?;
    result
        .meta
        .extra
        .insert(REPLAY_META.to_owned(), Value::Bool(true));
    if let Some(m) = &runtime.metrics {
        m.replayed();
    }
    respond_tool(runtime, id, result)
}

async fn load_handle(runtime: &Runtime, id: &str) -> Result<Option<HandleRecord>, RpcError> {
    if !is_handle_id(id) {
        return Ok(None);
    }
    let load = runtime.require_store()?.load_handle(id);
    Ok(runtime.store_op(StoreOp::LoadHandle, load).await?)
}

/// Why `args` cannot run `entry`, in words the model can act on: they break the tool's
/// input schema (the place named), an idempotent tool's key is missing, or an argument the
/// store looks up or locks (a handle, what the tool mutates) holds a NUL character, which
/// PostgreSQL's text cannot hold (every backend answers such a call alike).
fn refused_arguments(entry: &ToolEntry, args: &Value) -> Option<String> {
    if let Some((message, path)) = entry.input.as_ref().and_then(|v| first_violation(v, args)) {
        return Some(format!("{message} (at {path})"));
    }
    let args = args.as_object()?;
    if entry.def.idempotent.is_some() && !args.get(KEY_ARGUMENT).is_some_and(Value::is_string) {
        return Some(format!("{KEY_ARGUMENT} is required"));
    }
    let mutated = entry
        .def
        .mutates
        .as_deref()
        .and_then(|name| Some((name, args.get(name)?.as_str()?)));
    let handles = entry
        .handles
        .iter()
        .flat_map(|p| p.ids(args).into_iter().map(move |id| (p.name.as_str(), id)));
    mutated
        .into_iter()
        .chain(handles)
        .find(|(_, v)| v.contains('\0'))
        .map(|(name, _)| format!("{name} holds a NUL character"))
}

/// The serializer's key for `value`, scoped to the caller: only the owner of what a value
/// names can mutate it, and no principal can queue in another's line. (Store locks are
/// capped per principal: see `ServerConfig::max_store_locks_per_principal`.)
fn mutation_key(principal: &Principal, value: &str) -> String {
    let id = principal.id();
    format!("{}:{id}:{value}", id.len())
}

/// The hold a call takes on a handle it was given, judged alive (and recording a use when
/// one is due).
fn hold(param: &HandleParam, record: &HandleRecord, touch: bool, now: Millis) -> Hold {
    Hold {
        id: record.id.clone(),
        touch_at: touch.then_some(now),
        refusal: unknown_handle(param),
    }
}

fn checked(param: &HandleParam, record: HandleRecord) -> CheckedHandle {
    CheckedHandle {
        record,
        refusal: unknown_handle(param),
    }
}

/// What anyone but a live handle's owner hears: the same words whatever the reason.
fn unknown_handle(param: &HandleParam) -> String {
    let HandleParam {
        name,
        kind,
        created_by,
        ..
    } = param;
    format!(
        "The {kind} handle in {name:?} is unknown or has expired. Start a new {kind} with {created_by}."
    )
}

/// Judges a handle argument before the handler runs: it must exist, be of the right kind,
/// belong to the caller and be alive. Anything else gets one answer that says nothing about
/// other principals' handles; only the owner hears that theirs expired. `Ok` says whether a
/// use is due to be recorded: uses closer together than 1 % of the idle lifetime (at most a
/// minute) are recorded once, so a handle may idle out up to that much early.
fn judge_handle(
    param: &HandleParam,
    record: Option<HandleRecord>,
    principal: &Principal,
    now: Millis,
) -> Result<(HandleRecord, bool), String> {
    let record = match record {
        Some(r) if r.owner == principal.id() && r.kind == param.kind => r,
        _ => return Err(unknown_handle(param)),
    };
    let Some(why) = record.expired(now) else {
        let touch = record
            .idle_ms
            .is_some_and(|idle| now - record.last_used_at >= (idle / 100).min(60_000));
        return Ok((record, touch));
    };
    let millis = |ms: i64| human(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    let why = match why {
        Expiry::Lifetime => format!(
            "its lifetime of {} ran out",
            millis(record.expires_at - record.created_at)
        ),
        Expiry::Idle => format!(
            "it was not used for {}",
            millis(record.idle_ms.unwrap_or(0))
        ),
    };
    let HandleParam {
        name,
        kind,
        created_by,
        ..
    } = param;
    Err(format!(
        "The {kind} handle in {name:?} has expired ({why}); what it held is gone. Start a new {kind} with {created_by}."
    ))
}
