//! `tools/call`: arguments checked against the schema, handle arguments checked
//! against their owner and expiry, idempotent writes claimed, the handler run in the call's
//! transaction, and the transaction committed with the first result.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use wharf_protocol::{CallToolParams, CallToolResult, RequestId, ResultType, methods};

use crate::context::{Context, Finished, Hold, TxSlot};
use crate::driver::{Ended, drive, open_turn};
use crate::error::{ErrorKind, RpcError};
use crate::methods::Call;
use crate::mrtr::Binding;
use crate::mutation::KeyTurn;
use crate::principal::Principal;
use crate::registry::{HandleParam, ToolEntry};
use crate::reply::respond;
use crate::runtime::Runtime;
use crate::schema::first_violation;
use crate::store::{Begin, Claim, Digest, Fence, Millis, now_millis};
use crate::store::{Expiry, HandleRecord, human};
use crate::store::{KEY_ARGUMENT, REPLAY_META};

/// Where a call stands before its handler runs.
enum Prepared {
    /// Run the handler with these checked handles, in this transaction slot, completing
    /// this claim (idempotent tools).
    Run {
        handles: Vec<HandleRecord>,
        slot: Option<Arc<TxSlot>>,
        claim: Option<Claim>,
    },
    /// Answer without running the handler.
    Answer(CallToolResult),
    /// The stored first result of this write.
    Replay(String),
}

/// Calls tool `params.name`.
pub(crate) async fn call(call: Call<'_, Box<CallToolParams>>) -> Result<Vec<u8>, RpcError> {
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
    if let Some((message, path)) = entry.input.as_ref().and_then(|v| first_violation(v, &args)) {
        return Err(RpcError::invalid_params(format!(
            "Invalid arguments for tool {}: {message} (at {path})",
            params.name
        ))
        .with_data(serde_json::json!({ "path": path })));
    }
    let Value::Object(mut args) = args else {
        return Err(RpcError::internal("tool arguments are not an object"));
    };
    let turn = open_turn(
        runtime,
        &info,
        &caller.principal,
        params.request_state.as_deref(),
        params.input_responses,
        || Binding::new(methods::TOOLS_CALL, &params.name, &args),
    )?;
    let name = &entry.def.tool.name;
    // The call's own limit, never beyond the server's, covers its wait for its turn and
    // its run: past it the handler's future is dropped (it stops at its next await) and
    // its transaction rolls back.
    let limit = entry
        .def
        .timeout
        .map_or(runtime.config.max_call_duration, |t| {
            t.min(runtime.config.max_call_duration)
        });
    let deadline = tokio::time::Instant::now() + limit;
    let lock = match &entry.def.mutates {
        Some(argument) => {
            let value = args
                .get(argument)
                .and_then(Value::as_str)
                .unwrap_or_default();
            let key = mutation_key(&caller.principal, value);
            let wait =
                runtime
                    .mutations
                    .wait_turn(key, caller.principal.id(), runtime.store.as_ref());
            match tokio::time::timeout_at(deadline, wait).await {
                Ok(turn) => Some(turn?),
                Err(_) => {
                    return Err(RpcError::new(
                        ErrorKind::TimedOut,
                        format!(
                            "Timed out: tool {name} waited its whole limit of {} for earlier calls on the same {argument} to finish; it did not run",
                            human(limit)
                        ),
                    ));
                }
            }
        }
        None => None,
    };
    let fence = lock.as_ref().and_then(KeyTurn::fence);
    let prepared = prepare(runtime, entry, &mut args, &caller.principal, fence.clone()).await?;
    let (handles, slot, claim) = match prepared {
        Prepared::Run {
            handles,
            slot,
            claim,
        } => (handles, slot, claim),
        Prepared::Answer(result) => return respond_tool(runtime, &id, result),
        Prepared::Replay(stored) => return replay(runtime, &id, &stored),
    };
    let mut cx = Context::new(runtime, id.clone(), info, caller);
    cx.set_tx(slot.clone());
    cx.set_handles(handles);
    cx.set_fence(fence);
    if let Some(claim) = &claim {
        cx.set_effect_key(claim.effect_key());
    }
    let handler = Arc::clone(&entry.def.handler);
    let run = |cx| async move {
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
    let result = match drive(cx, turn, run).await? {
        Ended::Value(r) => r,
        Ended::Failed(message) => CallToolResult::error(message),
        Ended::Asked(response) => return Ok(response),
    };
    let failed = result.is_error == Some(true);
    if let (Some(validator), Some(structured), false) =
        (&entry.output, &result.structured_content, failed)
    {
        if let Some((message, path)) = first_violation(validator, structured) {
            return Err(RpcError::internal(format!(
                "tool {name} returned structuredContent that violates its outputSchema: {message} at {path}"
            )));
        }
    }
    if slot.is_none() && lock.is_none() {
        return respond_tool(runtime, &id, result);
    }
    // Once the handler has returned, its commit and the release of its key run to the end
    // on their own task, even if the client goes away meanwhile: a commit cut short must
    // never let the next writer of the key in before it lands.
    let settle = tokio::spawn(settle(
        Arc::clone(runtime),
        slot,
        claim,
        lock,
        result,
        failed,
    ));
    let result = settle
        .await
        .map_err(|e| RpcError::internal(format!("the commit task failed: {e}")))??;
    respond_tool(runtime, &id, result)
}

/// Commits a call's writes with its idempotency record (or rolls them back when it
/// failed), then hands its key to the next caller. Returns the result to send.
async fn settle(
    runtime: Arc<Runtime>,
    slot: Option<Arc<TxSlot>>,
    claim: Option<Claim>,
    lock: Option<KeyTurn>,
    result: CallToolResult,
    failed: bool,
) -> Result<CallToolResult, RpcError> {
    // A failed call changes nothing: its transaction is dropped, which rolls it back, and
    // no idempotency record is kept, so a retry runs again.
    let (finished, announcements) = match &slot {
        Some(slot) => (slot.finish().await?, slot.take_announcements().await),
        None => (Finished::Commit(None), Vec::new()),
    };
    let mut committed = false;
    let result = match finished {
        Finished::Refused(refusal) => CallToolResult::error(refusal),
        Finished::TouchOnly(due) => {
            for hold in due {
                if let Some(at) = hold.touch_at {
                    runtime.require_store()?.touch_handle(&hold.id, at).await?;
                }
            }
            committed = !failed;
            result
        }
        Finished::Commit(Some(mut tx)) if !failed => {
            if let Some(claim) = &claim {
                let stored = serde_json::to_string(&result).map_err(RpcError::internal)?;
                tx.complete_claim(claim, &stored).await?;
            }
            tx.commit().await?;
            committed = true;
            result
        }
        Finished::Commit(None) if !failed => {
            committed = true;
            result
        }
        Finished::Commit(_) => result,
    };
    // Only now, with the writes committed, may the next call on the key run.
    if let Some(lock) = lock {
        lock.end().await;
    }
    if committed {
        for event in announcements {
            runtime.announce(event).await;
        }
    }
    Ok(result)
}

/// Checks the handle arguments and, for an idempotent tool, claims its key. The handle
/// that scopes the key is loaded together with the claim (one round trip on
/// PostgreSQL), and judged before the claim's outcome is looked at.
async fn prepare(
    runtime: &Runtime,
    entry: &ToolEntry,
    args: &mut Map<String, Value>,
    principal: &Principal,
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
    let mut scope_handle = None;
    for (param, id) in present {
        // The first handle of the arguments themselves scopes an idempotency key.
        if entry.def.idempotent && scope_handle.is_none() && param.is_top_level() {
            scope_handle = Some((param, id));
            continue;
        }
        let record = load_handle(runtime, &id).await?;
        match judge_handle(param, record, principal, now) {
            Ok((record, touch)) => {
                holds.push(Hold {
                    id: record.id.clone(),
                    touch_at: touch.then_some(now),
                    refusal: unknown_handle(param),
                });
                handles.push(record);
            }
            Err(refusal) => return Ok(Prepared::Answer(CallToolResult::error(refusal))),
        }
    }
    if !entry.def.idempotent {
        return Ok(Prepared::Run {
            handles,
            // No store, no transaction: nothing to allocate on the stateless path.
            slot: runtime
                .store
                .is_some()
                .then(|| Arc::new(TxSlot::new(holds, fence))),
            claim: None,
        });
    }

    let store = runtime.require_store()?;
    let key = match args.remove(KEY_ARGUMENT) {
        Some(Value::String(k)) => k,
        _ => {
            return Err(RpcError::invalid_params(format!(
                "Invalid arguments for tool {name}: {KEY_ARGUMENT} is required"
            )));
        }
    };
    let retention =
        i64::try_from(runtime.config.idempotency_retention.as_millis()).unwrap_or(i64::MAX);
    let claim = Claim {
        scope: match &scope_handle {
            Some((_, id)) => format!("h:{id}"),
            None => format!("p:{}:{name}", principal.id()),
        },
        digest: Digest::of(name, args),
        key,
        expires_at: now.saturating_add(retention),
        owner: principal.id().to_owned(),
    };
    let begun = match &scope_handle {
        Some((param, id)) => {
            let (record, begun) = if handle_shaped(id) {
                store
                    .claim_on_handle(&claim, id, principal.id(), now)
                    .await?
            } else {
                (None, None)
            };
            // A write already made is replayed before the handle's liveness is judged (the
            // handle may have expired since), once its owner is known to be the caller's;
            // if the handle is gone (the write retired it: a commit, an abort), the record
            // says whose write it was.
            let gone = record.is_none() && handle_shaped(id);
            if let Some(Begin::Replay(stored)) = begun {
                return Ok(Prepared::Replay(stored));
            }
            if gone {
                if let Some(stored) = store.replay_of(&claim, now).await? {
                    return Ok(Prepared::Replay(stored));
                }
            }
            match judge_handle(param, record, principal, now) {
                // The claim's transaction holds this handle already; only a due use is
                // left to record, in that transaction.
                Ok((record, touch)) => {
                    if touch {
                        holds.push(Hold {
                            id: record.id.clone(),
                            touch_at: Some(now),
                            refusal: unknown_handle(param),
                        });
                    }
                    handles.push(record);
                }
                // Dropping the claim rolls it back: a refused call leaves no trace.
                Err(refusal) => return Ok(Prepared::Answer(CallToolResult::error(refusal))),
            }
            begun.ok_or_else(|| RpcError::internal("the store claimed nothing for the owner"))?
        }
        None => store.begin_idempotent(&claim, now).await?,
    };
    Ok(match begun {
        Begin::Run(tx) => Prepared::Run {
            handles,
            slot: Some(Arc::new(TxSlot::holding(tx, holds, fence))),
            claim: Some(claim),
        },
        Begin::Replay(stored) => Prepared::Replay(stored),
        Begin::Mismatch => Prepared::Answer(CallToolResult::error(format!(
            "The idempotency key {:?} was already used for a different call of {name} (other arguments). Retry a call with the same arguments as the first, or use a new key for a new write.",
            claim.key
        ))),
    })
}

fn respond_tool(
    runtime: &Runtime,
    id: &RequestId,
    mut result: CallToolResult,
) -> Result<Vec<u8>, RpcError> {
    result.result_type = ResultType::Complete;
    result.meta.server_info = Some(runtime.info.clone());
    respond(id, &result)
}

/// The stored first result of an idempotent write, marked as a replay.
fn replay(runtime: &Runtime, id: &RequestId, stored: &str) -> Result<Vec<u8>, RpcError> {
    let mut result: CallToolResult = serde_json::from_str(stored)
        .map_err(|e| RpcError::internal(format!("stored idempotent result is unreadable: {e}")))?;
    result
        .meta
        .extra
        .insert(REPLAY_META.to_owned(), Value::Bool(true));
    respond_tool(runtime, id, result)
}

async fn load_handle(runtime: &Runtime, id: &str) -> Result<Option<HandleRecord>, RpcError> {
    if !handle_shaped(id) {
        return Ok(None);
    }
    Ok(runtime.require_store()?.load_handle(id).await?)
}

/// The serializer's key for `value`, scoped to the caller: only the owner of what a value
/// names can mutate it, and no principal can queue in another's line. (Store locks are
/// capped per principal: see `ServerConfig::max_store_locks_per_principal`.)
fn mutation_key(principal: &Principal, value: &str) -> String {
    let id = principal.id();
    format!("{}:{id}:{value}", id.len())
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

/// Whether `id` has the shape of a minted handle (`prefix_` and 32 lowercase hex digits):
/// anything else is refused without a lookup.
fn handle_shaped(id: &str) -> bool {
    id.len() <= MAX_HANDLE_LEN
        && id.split_once('_').is_some_and(|(prefix, hex)| {
            !prefix.is_empty()
                && prefix.bytes().all(|b| b.is_ascii_alphanumeric())
                && hex.len() == 32
                && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// Longer strings are not handles: they are refused without a lookup.
const MAX_HANDLE_LEN: usize = 128;
