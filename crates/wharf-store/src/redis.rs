//! Redis, standalone (or behind Sentinel): its scripts name keys they build themselves, so
//! Redis Cluster is not supported. It must not evict keys (`maxmemory-policy noeviction`:
//! checked when the store opens), or the records that keep writes exactly once may go.
//!
//! **What it guarantees.** A transaction on Redis buffers its writes; reads go to the server
//! as they are made (they see the transaction's own writes to documents and row counts, and
//! other clients' committed writes). [`Transaction::commit`] applies every buffered write in
//! one Lua script, so no other client sees them half-applied, and a commit refused by its
//! checks (the claim, held handles, the fence, `expect_field`) applies nothing. For an
//! idempotent call the same script first checks that the call still holds its claim on the
//! idempotency record (a random token stored in the record) and marks the record done with
//! the result, with the app's writes. Unlike a SQL transaction, a script cannot undo a write:
//! one that Redis refuses part-way (an app's command on a key of another type) keeps the
//! writes before it, and the record is then marked done with that failure, so no retry
//! applies them again ([`StoreError::PartlyApplied`]).
//!
//! A claim is a lease, timed by Redis's clock (the one every replica shares) and renewed
//! while the call holding it runs (however long it runs). A
//! duplicate that finds the record `running` polls until it is done (then replays) or until
//! its wait runs out (then "busy, retry"). If the first attempt died (or its process lost
//! Redis for longer than the lease), its lease runs out and the next attempt takes the claim
//! over; should the first attempt
//! still be alive and try to commit after that, its script finds another token and applies
//! nothing ([`StoreError::ClaimLost`]). So a write is never applied twice, whatever the
//! timing. Durability across a Redis crash is Redis's: run it with `appendonly yes` and
//! `appendfsync always` if an acknowledged write must survive one.

mod lock;
pub(crate) mod records;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{TcpSettings, socket2};
use redis::{AsyncCommands, Script};
use serde_json::{Value, json};
use wharf::store::{
    Begin, Claim, Fence, HandleRecord, KeyLock, Millis, NewRecord, Record, SHARED_KEY_LEN,
    SharedKey, Store, StoreError, Transaction, TxMode, Write, check_key,
};

use crate::EXPIRED_HANDLE_GRACE_MS;
use crate::StoreOptions;

const HANDLE_EXPIRY: &str = "wharf:handles:expiry";
/// Longest life given to a key holding several handles' ids (ten years): a kind's lifetime
/// may be `Duration::MAX`, which no expiry command takes.
const MAX_SET_TTL_MS: i64 = 10 * 365 * 24 * 3_600_000;
/// The shared keys: a hash of id → `ACTIVE_FROM:EXPIRES_AT:SECRET_HEX`.
const SHARED_KEYS: &str = "wharf:keys";

fn shared_key_value(key: &SharedKey) -> String {
    let hex: String = key.secret.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}:{}:{hex}", key.active_from, key.expires_at)
}

fn shared_key_from(id: String, value: &str) -> Result<SharedKey, StoreError> {
    let bad = || corrupt(&format!("{SHARED_KEYS} {id}"));
    let mut parts = value.splitn(3, ':');
    let mut next = || parts.next().ok_or_else(bad);
    let (active_from, expires_at, hex) = (next()?, next()?, next()?);
    let int = |s: &str| s.parse::<i64>().map_err(|_| bad());
    let (active_from, expires_at) = (int(active_from)?, int(expires_at)?);
    if hex.len() != 2 * SHARED_KEY_LEN {
        return Err(bad());
    }
    let mut secret = [0u8; SHARED_KEY_LEN];
    for (i, byte) in secret.iter_mut().enumerate() {
        let pair = hex.get(2 * i..2 * i + 2).ok_or_else(bad)?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(SharedKey {
        id,
        secret,
        active_from,
        expires_at,
    })
}

fn handle_key(id: &str) -> String {
    format!("wharf:h:{id}")
}
fn owned_key(id: &str) -> String {
    format!("wharf:h:{id}:collections")
}
/// A principal's handles of one kind, scored by their absolute expiry: what counts them for
/// a kind's cap. The owner's length goes first so no (owner, kind) pair spells another's
/// key; the commit script builds the same name when it retires a handle.
fn owner_kind_key(owner: &str, kind: &str) -> String {
    format!("wharf:hk:{}:{owner}:{kind}", owner.len())
}
/// The scope's length goes first so no (scope, key) pair can spell another's key.
fn claim_key(claim: &Claim) -> String {
    format!(
        "wharf:i:{}:{}:{}",
        claim.scope.len(),
        claim.scope,
        claim.key
    )
}

pub(crate) fn backend(e: redis::RedisError) -> StoreError {
    // Answered "busy, retry": a read, or the commit of a keyed call (whose retry finds its
    // claim or record, as after any lost answer). An unkeyed commit whose answer was lost
    // is not mapped here (see `RedisTx::commit`).
    if e.is_timeout() {
        return StoreError::Busy(format!(
            "Redis did not answer within {} s",
            IO_TIMEOUT.as_secs()
        ));
    }
    // Redis unreachable (restarting, failing over): a client may retry, as after a timeout.
    if e.is_io_error() {
        tracing::warn!(error = %e, "Redis cannot be reached");
        return StoreError::Busy("Redis cannot be reached right now".into());
    }
    // Refusals of a Redis that will take the command later, which it did not run: loading
    // its data after a restart, a primary without its replicas (MASTERDOWN), TRYAGAIN, a
    // script still running (BUSY), or a primary demoted by a failover (READONLY: the
    // connection still points at the old one).
    if matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry)
        || e.kind() == redis::ErrorKind::ReadOnly
        || e.code() == Some("BUSY")
        // Full (`maxmemory` with `noeviction`, which the store requires): the command was
        // refused before it wrote anything, and may pass once memory is freed.
        || e.code() == Some("OOM")
    {
        tracing::warn!(error = %e, "Redis refused a command for now");
        return StoreError::Busy(format!("Redis refused the command for now: {e}"));
    }
    StoreError::Backend(format!("redis: {e}"))
}

/// [`backend`] for a command that writes and whose retry would not find it done (an
/// unkeyed commit, a record's write): when its answer was lost (none in time, the
/// connection cut) it may have been applied, and "retry" could apply it twice. A refused
/// connection sent nothing.
pub(crate) fn write_backend(e: redis::RedisError) -> StoreError {
    if e.is_io_error() && !e.is_connection_refusal() {
        return StoreError::Backend(format!(
            "redis: the answer was lost ({e}); the write may have been applied"
        ));
    }
    backend(e)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("redis record {what}"))
}

/// A store in Redis.
pub struct RedisStore {
    conn: ConnectionManager,
    bus: std::sync::Arc<crate::bus::StoreBus>,
    /// The channel the bus listens on, which commits publish what calls announce to.
    channel: std::sync::Arc<str>,
    lock_wait: Duration,
    claim: Script,
    commit: Script,
    touch: Script,
    records: records::Records,
    lines: lock::Lines,
}

/// Claims a record: `run` (new, or taken over after its lease ran out), `replay` with the
/// result, `mismatch`, or `wait`. Leases are judged by Redis's clock, the one clock every
/// replica shares: a replica whose own clock runs ahead must not take over a live claim.
const CLAIM_LUA: &str = r#"
local k = KEYS[1]
local digest, token, lease, expires = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec = redis.call('HMGET', k, 'digest', 'state', 'result', 'lease_until')
if not rec[1] then
  redis.call('HSET', k, 'digest', digest, 'state', 'running', 'token', token, 'lease_until', now + lease)
  redis.call('PEXPIREAT', k, expires)
  return {'run'}
end
if rec[2] == 'done' then
  if rec[1] ~= digest then return {'mismatch'} end
  return {'replay', rec[3]}
end
-- A running attempt is waited for whatever its arguments, as the SQL stores wait on its
-- row: it may fail and leave nothing, and then this call runs. One whose lease ran out
-- left nothing that counts, and this call takes the key over with its own arguments.
if tonumber(rec[4]) <= now then
  redis.call('HSET', k, 'digest', digest, 'token', token, 'lease_until', now + lease)
  -- Kept for the taker's retention, from now: its result must outlive its retries.
  redis.call('PEXPIREAT', k, expires)
  return {'run'}
end
return {'wait'}
"#;

/// Adds shared key `ARGV[1]` (its value `ARGV[2]`, `ACTIVE_FROM:EXPIRES_AT:SECRET_HEX`)
/// unless the hash holds it; one held that expires before `ARGV[3]` keeps its start and
/// secret and expires then.
const ADD_SHARED_KEY_LUA: &str = r#"
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
local from, expires, secret = string.match(held, '^([^:]*):([^:]*):(.*)$')
if expires and tonumber(expires) and tonumber(expires) < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], ARGV[1], from .. ':' .. ARGV[3] .. ':' .. secret)
end
return 0
"#;

/// Reserves a one-time record (`record_once`) unless one holds its key: running under
/// `ARGV[2]`, its lease as long as the record lives (the transaction that reserved it gives
/// it back when it ends without a commit). 1 when reserved.
const RESERVE_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'digest', ARGV[1], 'state', 'running', 'token', ARGV[2], 'owner', ARGV[3], 'lease_until', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return 1
"#;

/// Pushes back the lease of a claim its holder still runs, by `ARGV[2]` ms from Redis's
/// clock (returns 0, doing nothing, once the claim is no longer the holder's).
const RENEW_CLAIM_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] and redis.call('HGET', KEYS[1], 'state') == 'running' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
  return 1
end
return 0
"#;

/// Keeps a claim's lease while the call holding it runs, however long: renewed every third
/// of the lease, so only a holder whose process is gone (or cut off) loses it to a retry.
async fn renew_claim(conn: ConnectionManager, key: String, token: String, lease: Duration) {
    let script = Script::new(RENEW_CLAIM_LUA);
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    keep_renewing(lease, || {
        let (mut conn, script, key, token) = (conn.clone(), &script, &key, &token);
        async move {
            script
                .key(key)
                .arg(token)
                .arg(lease_ms)
                .invoke_async::<i64>(&mut conn)
                .await
        }
    })
    .await;
}

/// Calls `renew` every third of `lease` until it says the claim is no longer held (0). A
/// renewal that fails, or gets no answer within a third of the lease (a connection gone
/// half-open), is tried again after a tenth: waiting the whole third again could let the
/// lease run out, and a retry on another replica take the claim, after one lost answer.
async fn keep_renewing<F, E>(lease: Duration, mut renew: impl FnMut() -> F)
where
    F: Future<Output = Result<i64, E>>,
    E: std::fmt::Display,
{
    let (every, again) = (lease / 3, (lease / 10).max(Duration::from_millis(10)));
    let mut pause = every;
    loop {
        tokio::time::sleep(pause).await;
        pause = match tokio::time::timeout(every, renew()).await {
            Ok(Ok(1)) => every,
            Ok(Ok(_)) => return,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not renew an idempotency claim; trying again");
                again
            }
            Err(_) => {
                tracing::warn!("an idempotency claim's renewal got no answer; trying again");
                again
            }
        };
    }
}

/// Records a use of a handle, if it still exists and the use is later than the last one
/// recorded (a long call's use, recorded when it ends, may come after a later call's): its
/// last use, and its place in the expiry set (the earlier of its lifetime and its idle end,
/// plus the grace).
const TOUCH_LUA: &str = r#"
local h, id, now, grace = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', h) == 0 then return 0 end
if now <= tonumber(redis.call('HGET', h, 'last_used_at') or '0') then return 1 end
redis.call('HSET', h, 'last_used_at', now)
local at = tonumber(redis.call('HGET', h, 'expires_at'))
local idle = tonumber(redis.call('HGET', h, 'idle_ms') or '')
if idle then at = math.min(at, now + idle) end
redis.call('ZADD', KEYS[2], at + grace, id)
return 1
"#;

/// Counts a principal's live handles of one kind: those past their absolute expiry leave
/// the set; those idle too long, or swept, are not counted (the expiry set holds each
/// handle's effective expiry plus the grace).
const LIVE_LUA: &str = r#"
local set, expiry, now, grace = KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
local n = 0
for _, id in ipairs(redis.call('ZRANGE', set, 0, -1)) do
  local at = redis.call('ZSCORE', expiry, id)
  if not at then redis.call('ZREM', set, id)
  elseif tonumber(at) - grace > now then n = n + 1 end
end
return n
"#;

/// The `ARGV[3]` live handles of a principal's set (`KEYS[1]`) with the earliest
/// `last_used_at`, then the smallest ids: of the handles `LIVE_LUA` counts. (Each handle's
/// hash is named as `handle_key` names it.)
const LEAST_RECENTLY_USED_LUA: &str = r#"
local set, expiry, now, grace, n = KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local live = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', set, '(' .. now, '+inf')) do
  local at = redis.call('ZSCORE', expiry, id)
  local used = tonumber(redis.call('HGET', 'wharf:h:' .. id, 'last_used_at') or '')
  if at and used and tonumber(at) - grace > now then
    live[#live + 1] = { used, id }
  end
end
table.sort(live, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
local ids = {}
for i = 1, math.min(n, #live) do ids[i] = live[i][2] end
return ids
"#;

/// Applies a transaction's buffered writes; with a claim, only while the claim is held, only
/// while every handle it holds still exists, and only while its fence (if it was written
/// under a mutation lock) is the live holder (returns 0, -2 or -4 otherwise, applying
/// nothing; -3 when an expected value changed). Once every write applied, publishes what the
/// call announces on the bus's channel (`ARGV[5]`, the payloads a JSON list in `ARGV[6]`),
/// and returns 1, or 2 when Redis refused to publish (the writes stand).
///
/// A write Redis refuses (an app's command on a key of another type, say) stops the script,
/// and Redis keeps what the writes before it did: nothing undoes them. So the writes run
/// under `pcall`, and the first refusal ends them: the claim, if there is one, is recorded
/// done with a failed tool result that says so (a retry answers it, and applies nothing
/// twice), and the script returns that result's text. (Without a claim nothing is recorded:
/// a retry runs again.) (Out of memory refuses only a script's first write,
/// before anything is applied: then the claim's record cannot be written either, the
/// script fails whole, and the claim lapses or is released as after any failed commit.)
const COMMIT_LUA: &str = r#"
local claim, token, result = ARGV[1], ARGV[2], ARGV[3]
local ops = cjson.decode(ARGV[4])
if claim ~= '' then
  if redis.call('HGET', claim, 'token') ~= token or redis.call('HGET', claim, 'state') ~= 'running' then
    return 0
  end
end
for _, op in ipairs(ops) do
  if op[1] == 'fence' then
    local head = redis.call('ZRANGE', op[2], 0, 0)[1]
    local deadline = tonumber(redis.call('HGET', op[3], op[4]) or '0')
    local t = redis.call('TIME')
    if head ~= op[4] or deadline < tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
      return -4
    end
  end
  if op[1] == 'require' and redis.call('EXISTS', op[2]) == 0 then return -2 end
  if op[1] == 'expect' then
    local have = redis.call('HGET', op[2], op[3])
    if op[4] == nil then
      if have then return -3 end
    elseif have ~= op[4] then return -3 end
  end
  if op[1] == 'hsetnx' then
    local have = redis.call('HGET', op[2], op[3])
    if have and have ~= op[4] then return -3 end
  end
end
local applied, refused = pcall(function()
for _, op in ipairs(ops) do
  local o = op[1]
  if o == 'call' then redis.call(unpack(op, 2))
  elseif o == 'hset' then redis.call('HSET', op[2], op[3], op[4])
  elseif o == 'hsetnx' then redis.call('HSETNX', op[2], op[3], op[4])
  elseif o == 'hdel' then redis.call('HDEL', op[2], op[3])
  elseif o == 'rpush' then for i = 3, #op do redis.call('RPUSH', op[2], op[i]) end
  elseif o == 'move' then
    -- The source's rows keep their numbers gone: its next row is numbered after them.
    local n = redis.call('LLEN', op[2])
    if n > 0 then redis.call('INCRBY', op[4], n) end
    if redis.call('EXISTS', op[3]) == 0 then
      -- Renamed, not copied; the source's expiry (a staging list's) does not come along.
      if redis.call('EXISTS', op[2]) == 1 then
        redis.call('RENAME', op[2], op[3])
        redis.call('PERSIST', op[3])
      end
    else
      local rows = redis.call('LRANGE', op[2], 0, -1)
      for _, r in ipairs(rows) do redis.call('RPUSH', op[3], r) end
      redis.call('UNLINK', op[2])
    end
  elseif o == 'del' then
    if op[3] then
      local n = redis.call('LLEN', op[2])
      if n > 0 then redis.call('INCRBY', op[3], n) end
    end
    redis.call('UNLINK', op[2])
  elseif o == 'sadd' then redis.call('SADD', op[2], op[3])
  elseif o == 'handle' then
    redis.call('HSET', op[2], 'kind', op[4], 'owner', op[5], 'created_at', op[6], 'expires_at', op[7], 'idle_ms', op[8], 'last_used_at', op[9], 'data', op[11])
    redis.call('ZADD', KEYS[1], op[10], op[3])
    redis.call('ZADD', op[12], op[7], op[3])
    if redis.call('PTTL', op[12]) < tonumber(op[13]) then redis.call('PEXPIRE', op[12], op[13]) end
  elseif o == 'touch' then
    -- Only ever later, as TOUCH_LUA.
    if redis.call('EXISTS', op[2]) == 1
      and tonumber(op[4]) > tonumber(redis.call('HGET', op[2], 'last_used_at') or '0') then
      redis.call('HSET', op[2], 'last_used_at', op[4])
      local at = tonumber(redis.call('HGET', op[2], 'expires_at'))
      local idle = tonumber(redis.call('HGET', op[2], 'idle_ms') or '')
      if idle then at = math.min(at, op[4] + idle) end
      redis.call('ZADD', KEYS[1], at + op[5], op[3])
    end
  elseif o == 'retire' then
    local who = redis.call('HMGET', op[2], 'owner', 'kind')
    if who[1] and who[2] then
      redis.call('ZREM', 'wharf:hk:' .. string.len(who[1]) .. ':' .. who[1] .. ':' .. who[2], op[4])
    end
    for _, c in ipairs(redis.call('SMEMBERS', op[3])) do redis.call('UNLINK', c) end
    redis.call('DEL', op[2], op[3])
    redis.call('ZREM', KEYS[1], op[4])
  end
end
end)
if not applied then
  local why = type(refused) == 'table' and refused.err or tostring(refused)
  -- Redis names the script and its line: nothing a caller can use.
  why = (string.gsub(why, '%s*script: .*$', ''))
  local text = 'The write failed part-way: the store refused one of its commands (' .. why ..
    '). Whatever it wrote before that is kept.'
  if claim ~= '' then
    text = text .. ' This call is recorded as failed and will not be applied again.'
    local failed = cjson.encode({resultType = 'complete', content = {{type = 'text', text = text}}, isError = true})
    redis.call('HSET', claim, 'state', 'done', 'result', failed)
    redis.call('HDEL', claim, 'token', 'lease_until')
    -- Its owner, queued after the writes, so not written yet: replays look for it.
    for _, op in ipairs(ops) do
      if op[1] == 'hset' and op[2] == claim and op[3] == 'owner' then
        redis.call('HSET', claim, 'owner', op[4])
      end
    end
  end
  return text
end
if claim ~= '' then
  redis.call('HSET', claim, 'state', 'done', 'result', result)
  redis.call('HDEL', claim, 'token', 'lease_until')
end
-- What the call announces, once every write applied. A refused publish (an ACL without the
-- channel) leaves the writes as they are: 2 tells the replica to announce a gap instead.
if ARGV[6] ~= '' then
  local published = pcall(function()
    for _, payload in ipairs(cjson.decode(ARGV[6])) do redis.call('PUBLISH', ARGV[5], payload) end
  end)
  if not published then return 2 end
end
return 1
"#;

/// How long a connection attempt or a command's answer may take before it fails ("busy,
/// retry" to the caller). Each command is one short script or lookup: waits for a lock are
/// polls, not blocking commands, so no answer is legitimately this slow.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

impl RedisStore {
    /// Connects (with automatic reconnection) and checks that the server answers.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::Backend(format!("invalid Redis URL: {e}")))?;
        // Without these, a command sent to a Redis that vanished without a reset (a
        // failover that moved its address, a partition) waits for the kernel to give up on
        // the connection, a quarter of an hour, and every call here waits behind it. Each
        // command fails after IO_TIMEOUT; and the kernel drops a connection whose data goes
        // unacknowledged past twice that (or, idle, whose keep-alive probes go unanswered),
        // so the manager connects again instead of failing every command until then.
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(IO_TIMEOUT)
            .with_interval(IO_TIMEOUT / 5)
            .with_retries(3);
        let tcp = TcpSettings::default().set_keepalive(keepalive);
        // Linux's own (redis-rs has it only there); elsewhere keep-alive alone.
        #[cfg(target_os = "linux")]
        let tcp = tcp.set_user_timeout(IO_TIMEOUT * 2);
        // Commands sent while the manager reconnects wait for its attempts to end: by
        // default seven of them, a second then a minute apart (redis-rs multiplies each
        // delay by the factor, 100), so with Redis gone every command waited about eight
        // minutes before it failed. One attempt fails it at once (within the connection
        // timeout where connecting hangs), and the next command tries again. So does the
        // first connection: a server started before Redis answers fails at once, to be
        // restarted by its supervisor.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(IO_TIMEOUT)
            .set_response_timeout(IO_TIMEOUT)
            .set_number_of_retries(0)
            .set_tcp_settings(tcp);
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot reach Redis: {e}")))?;
        // A lease Redis can hold, and a deadline the clock can: at most an i32 of
        // milliseconds (about 24 days), as on PostgreSQL.
        let lock_wait = options.lock_wait.clamp(
            Duration::from_millis(1),
            Duration::from_millis(i32::MAX as u64),
        );
        let channel = crate::bus::redis_channel(client.get_connection_info().redis.db).into();
        let store = RedisStore {
            bus: crate::bus::redis(client, conn.clone()),
            channel,
            conn,
            lock_wait,
            claim: Script::new(CLAIM_LUA),
            commit: Script::new(COMMIT_LUA),
            touch: Script::new(TOUCH_LUA),
            records: records::Records::new(),
            lines: lock::Lines::new(lock_wait),
        };
        store.ping().await?;
        store.check_eviction().await?;
        Ok(store)
    }

    /// Refuses a Redis that evicts keys when it runs out of memory: an idempotency record
    /// or a single-use mark it evicted would let a retry apply its write a second time.
    /// Where `CONFIG` is not allowed (some managed services), a warning says what to check.
    async fn check_eviction(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let settings: Result<HashMap<String, String>, _> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory*")
            .query_async(&mut conn)
            .await;
        let settings = match settings {
            Ok(settings) => settings,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot read Redis's maxmemory-policy: make sure it is noeviction, or Redis may evict the records that keep writes exactly once"
                );
                return Ok(());
            }
        };
        let policy = settings.get("maxmemory-policy").map_or("", String::as_str);
        let limit = settings
            .get("maxmemory")
            .and_then(|m| m.parse::<u64>().ok())
            .unwrap_or(0);
        match eviction(policy, limit) {
            Eviction::None => Ok(()),
            Eviction::OnceLimited => {
                tracing::warn!(
                    policy,
                    "Redis has no maxmemory but its maxmemory-policy is not noeviction: should a limit be set, it would evict the records that keep writes exactly once"
                );
                Ok(())
            }
            Eviction::Now => Err(StoreError::Backend(format!(
                "Redis evicts keys when full (maxmemory {limit}, maxmemory-policy {policy}), and the records that keep writes exactly once would go with them: set maxmemory-policy noeviction (a full Redis then refuses writes, answered busy-retry)"
            ))),
        }
    }

    fn tx(&self) -> RedisTx {
        RedisTx {
            conn: self.conn.clone(),
            commit: self.commit.clone(),
            ops: Vec::new(),
            #[cfg(feature = "documents")]
            docs: HashMap::new(),
            #[cfg(feature = "documents")]
            appended: HashMap::new(),
            claim: None,
            reserved: Vec::new(),
            renew: None,
            bus: std::sync::Arc::clone(&self.bus),
            announced: Vec::new(),
            channel: std::sync::Arc::clone(&self.channel),
        }
    }
}

/// Whether a Redis evicts keys.
#[derive(Debug, PartialEq, Eq)]
enum Eviction {
    /// It never does (`noeviction`).
    None,
    /// It would, once given a memory limit (it has none now).
    OnceLimited,
    /// It does when it reaches its limit.
    Now,
}

/// How a Redis with `maxmemory-policy` `policy` and `maxmemory` `limit` (0: none) evicts.
fn eviction(policy: &str, limit: u64) -> Eviction {
    match (policy, limit) {
        ("noeviction", _) => Eviction::None,
        (_, 0) => Eviction::OnceLimited,
        _ => Eviction::Now,
    }
}

/// The effective expiry of a handle, including the grace during which its owner is told it
/// expired.
fn sweep_at(r: &HandleRecord) -> i64 {
    let idle = r
        .idle_ms
        .map_or(i64::MAX, |i| r.last_used_at.saturating_add(i));
    r.expires_at
        .min(idle)
        .saturating_add(EXPIRED_HANDLE_GRACE_MS)
}

#[async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(drop)
            .map_err(backend)
    }

    async fn replay_of(&self, claim: &Claim, _now: Millis) -> Result<Option<String>, StoreError> {
        // A record past its retention has expired with its key.
        let mut conn = self.conn.clone();
        let map: HashMap<String, String> = conn.hgetall(claim_key(claim)).await.map_err(backend)?;
        let field = |f: &str| map.get(f).map(String::as_str);
        let mine = field("state") == Some("done")
            && field("digest") == Some(claim.digest.as_str())
            && field("owner") == Some(claim.owner.as_str());
        Ok(mine.then(|| field("result").map(str::to_owned)).flatten())
    }

    async fn load_handle(&self, id: &str) -> Result<Option<HandleRecord>, StoreError> {
        let mut conn = self.conn.clone();
        let map: HashMap<String, String> = conn.hgetall(handle_key(id)).await.map_err(backend)?;
        if map.is_empty() {
            return Ok(None);
        }
        let text = |f: &str| map.get(f).cloned().ok_or_else(|| corrupt(f));
        let num = |f: &str| -> Result<i64, StoreError> {
            map.get(f)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| corrupt(f))
        };
        Ok(Some(HandleRecord {
            id: id.to_owned(),
            kind: text("kind")?,
            owner: text("owner")?,
            created_at: num("created_at")?,
            expires_at: num("expires_at")?,
            idle_ms: map.get("idle_ms").and_then(|v| v.parse().ok()),
            last_used_at: num("last_used_at")?,
            data: map
                .get("data")
                .filter(|d| !d.is_empty())
                .map(|d| {
                    serde_json::from_str(d)
                        .map_err(|e| StoreError::Corrupt(format!("handle data: {e}")))
                })
                .transpose()?,
        }))
    }

    async fn touch_handle(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .touch
            .key(handle_key(id))
            .key(HANDLE_EXPIRY)
            .arg(id)
            .arg(now)
            .arg(EXPIRED_HANDLE_GRACE_MS)
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn begin(&self, _mode: TxMode) -> Result<Box<dyn Transaction>, StoreError> {
        Ok(Box::new(self.tx()))
    }

    async fn begin_idempotent(&self, claim: &Claim, _now: Millis) -> Result<Begin, StoreError> {
        // Redis judges leases by its own clock; a record's retention ends at the claim's
        // `expires_at` (set from the replica's clock), which `PEXPIREAT` applies.
        let token = format!("{:032x}", rand::random::<u128>());
        let lease = i64::try_from(self.lock_wait.as_millis()).unwrap_or(i64::MAX);
        let key = claim_key(claim);
        let deadline = tokio::time::Instant::now() + self.lock_wait;
        let mut conn = self.conn.clone();
        let mut pause = Duration::from_millis(5);
        loop {
            // Dropped before the answer is read (the call was cancelled, or the answer was
            // lost with the connection), the claim the script may have made under this
            // token is given back, as a failed call's is: nobody would renew it, and retries
            // would wait out its lease.
            let mut abandoned = Abandoned(Some((conn.clone(), key.clone(), token.clone())));
            let answer: Vec<String> = self
                .claim
                .key(&key)
                .arg(claim.digest.as_str())
                .arg(&token)
                .arg(lease)
                .arg(claim.expires_at)
                .invoke_async(&mut conn)
                .await
                .map_err(backend)?;
            abandoned.0 = None;
            match answer.first().map(String::as_str) {
                Some("run") => {
                    let mut tx = self.tx();
                    let renew =
                        renew_claim(conn.clone(), key.clone(), token.clone(), self.lock_wait);
                    tx.renew = Some(tokio::spawn(renew));
                    tx.claim = Some((key, token));
                    return Ok(Begin::Run(Box::new(tx)));
                }
                Some("replay") => {
                    return answer
                        .into_iter()
                        .nth(1)
                        .map(Begin::Replay)
                        .ok_or_else(|| corrupt("without a result"));
                }
                Some("mismatch") => return Ok(Begin::Mismatch),
                Some("wait") if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Some("wait") => {
                    return Err(StoreError::Busy(
                        "the same write is still running elsewhere".into(),
                    ));
                }
                _ => return Err(corrupt("claim script answered nonsense")),
            }
        }
    }

    fn shares_locks(&self) -> bool {
        true
    }

    fn bus(&self) -> Option<std::sync::Arc<dyn wharf::NotificationBus>> {
        Some(self.bus.clone())
    }

    async fn lock_key(&self, key: &str) -> Result<Option<Box<dyn KeyLock>>, StoreError> {
        self.lines.lock(&self.conn, key).await.map(Some)
    }

    async fn read_record(
        &self,
        namespace: &str,
        key: &str,
        now: Millis,
    ) -> Result<Option<Record>, StoreError> {
        check_key(namespace, key)?;
        self.records.read(&self.conn, namespace, key, now).await
    }

    async fn write_record(
        &self,
        record: &NewRecord<'_>,
        write: Write,
        now: Millis,
    ) -> Result<Option<u64>, StoreError> {
        record.check()?;
        self.records.write(&self.conn, record, write, now).await
    }

    async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        version: Option<u64>,
    ) -> Result<bool, StoreError> {
        check_key(namespace, key)?;
        self.records
            .delete(&self.conn, namespace, key, version)
            .await
    }

    async fn records_of(
        &self,
        namespace: &str,
        owner: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Record)>, StoreError> {
        check_key(namespace, "")?;
        self.records
            .of_owner(&self.conn, namespace, owner, now, limit)
            .await
    }

    async fn sweep(&self, now: Millis, batch: u32) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let ids: Vec<String> = conn
            .zrangebyscore_limit(
                HANDLE_EXPIRY,
                "-inf",
                now,
                0,
                isize::try_from(batch).unwrap_or(isize::MAX),
            )
            .await
            .map_err(backend)?;
        let mut tx = self.tx();
        for id in &ids {
            tx.retire(id);
        }
        Box::new(tx).commit().await?;
        let mut removed = ids.len() as u64;
        let expired: Vec<String> = self
            .shared_keys()
            .await?
            .into_iter()
            .filter(|k| k.expires_at <= now)
            .map(|k| k.id)
            .take(usize::try_from(batch).unwrap_or(usize::MAX))
            .collect();
        if !expired.is_empty() {
            let gone: u64 = conn.hdel(SHARED_KEYS, &expired).await.map_err(backend)?;
            removed += gone;
        }
        // Idempotency records expire by themselves (PEXPIREAT at their retention).
        Ok(removed)
    }

    async fn shared_keys(&self) -> Result<Vec<SharedKey>, StoreError> {
        let mut conn = self.conn.clone();
        let all: HashMap<String, String> = conn.hgetall(SHARED_KEYS).await.map_err(backend)?;
        all.into_iter()
            .map(|(id, value)| shared_key_from(id, &value))
            .collect()
    }

    async fn add_shared_key(&self, key: &SharedKey) -> Result<(), StoreError> {
        static ADD: std::sync::LazyLock<Script> =
            std::sync::LazyLock::new(|| Script::new(ADD_SHARED_KEY_LUA));
        let mut conn = self.conn.clone();
        ADD.key(SHARED_KEYS)
            .arg(&key.id)
            .arg(shared_key_value(key))
            .arg(key.expires_at)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(backend)
    }
}

/// A transaction on a [`RedisStore`]: writes buffered until [`Transaction::commit`].
pub struct RedisTx {
    pub(crate) conn: ConnectionManager,
    commit: Script,
    pub(crate) ops: Vec<Value>,
    /// Documents written in this transaction (`None`: deleted).
    #[cfg(feature = "documents")]
    pub(crate) docs: HashMap<(String, String), Option<Value>>,
    /// Rows appended (or, negative, removed) per collection in this transaction.
    #[cfg(feature = "documents")]
    pub(crate) appended: HashMap<String, i64>,
    /// The idempotency record this transaction holds, and its token.
    claim: Option<(String, String)>,
    /// Records reserved by [`Transaction::record_once`], and their tokens: done by the
    /// commit, given back when the transaction ends without one.
    reserved: Vec<(String, String)>,
    /// What keeps the claim's lease while the call runs; stopped when the transaction ends.
    renew: Option<tokio::task::JoinHandle<()>>,
    /// The bus, what the commit publishes on its channel once every write applied, and the
    /// channel.
    bus: std::sync::Arc<crate::bus::StoreBus>,
    announced: Vec<String>,
    channel: std::sync::Arc<str>,
}

/// Gives a claim back when its call failed, so a retry runs at once instead of waiting out
/// the lease.
const RELEASE_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] and redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('DEL', KEYS[1])
end
return 1
"#;

impl RedisTx {
    /// Stops keeping this transaction's claim: from now on its lease runs out as it would
    /// if this process were gone, and a retry elsewhere takes the claim over (what tests of
    /// a dead holder use).
    pub fn stop_renewing(&mut self) {
        if let Some(renew) = self.renew.take() {
            renew.abort();
        }
    }
}

impl Drop for RedisTx {
    fn drop(&mut self) {
        if let Some(renew) = self.renew.take() {
            renew.abort();
        }
        // Dropped without a commit (the call failed or was cancelled): release the claim,
        // and what `record_once` reserved.
        for (key, token) in self.claim.take().into_iter().chain(self.reserved.drain(..)) {
            release_later(self.conn.clone(), key, token);
        }
    }
}

/// A claim script sent and not yet answered: dropped so (its call was cancelled), it gives
/// back what the script may have claimed under its token.
struct Abandoned(Option<(ConnectionManager, String, String)>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some((conn, key, token)) = self.0.take() {
            release_later(conn, key, token);
        }
    }
}

/// Gives claim `key` back, on a task of its own, if it is still running under `token` (a
/// release of a claim the token never held, or one already done, does nothing).
fn release_later(mut conn: ConnectionManager, key: String, token: String) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let released: Result<i64, _> = Script::new(RELEASE_LUA)
                .key(key)
                .arg(token)
                .invoke_async(&mut conn)
                .await;
            if let Err(e) = released {
                tracing::warn!(error = %e, "could not release an idempotency claim; it lapses with its lease");
            }
        });
    }
}

/// The command buffer: an app's own keys, written with the call.
impl RedisTx {
    /// Most arguments one queued command may have (Lua's limit on unpacking them, with room).
    pub const MAX_ARGS: usize = 7_000;

    /// The connection for reads. They see what is committed, not this transaction's
    /// buffered writes.
    pub fn reader(&mut self) -> &mut ConnectionManager {
        &mut self.conn
    }

    /// Queues a write (`["RPUSH", key, value]`, …) to run at commit: after every check of the
    /// commit (the claim, held handles, fences, [`expect_field`](Self::expect_field)), with
    /// the transaction's other writes and the call's idempotency record, in one script. A
    /// command Redis rejects (a wrong key type) ends the writes where it is, and Redis keeps
    /// what ran before it: the commit fails with [`StoreError::PartlyApplied`]. In an
    /// idempotent call the idempotency record is kept with that failure, so a retry answers
    /// it rather than applying the writes again; without one, a retry runs again. Queue only
    /// commands that cannot fail on the keys as the app keeps them. Keys must live on one
    /// node (standalone Redis, or one hash slot).
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] for an empty command or one of more than
    /// [`MAX_ARGS`](Self::MAX_ARGS) arguments; nothing is queued.
    pub fn queue<I, S>(&mut self, command: I) -> Result<(), StoreError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut op = vec![Value::from("call")];
        op.extend(command.into_iter().map(|a| Value::String(a.into())));
        match op.len() - 1 {
            0 => Err(StoreError::Backend(
                "an empty Redis command was queued".into(),
            )),
            n if n > Self::MAX_ARGS => Err(StoreError::Backend(format!(
                "a queued Redis command has {n} arguments; split it (at most {})",
                Self::MAX_ARGS
            ))),
            _ => {
                self.ops.push(Value::Array(op));
                Ok(())
            }
        }
    }

    /// Files `key` under handle `handle`: when the handle is retired (by a call, or by the
    /// sweeper once it expired), the key goes with it, freed in the background, as rows of a
    /// SQL table go with a handle through a trigger on its deletion.
    pub fn file_under_handle(&mut self, handle: &str, key: &str) {
        self.ops.push(json!(["sadd", owned_key(handle), key]));
    }

    /// Makes the commit apply nothing, failing with [`StoreError::Conflict`], unless field
    /// `field` of hash `key` then holds `value` (`None`: is absent). An app reads a value,
    /// decides from it, and expects it unchanged: a concurrent writer makes one of the two
    /// calls retry instead of both acting on what they read.
    pub fn expect_field(&mut self, key: &str, field: &str, value: Option<&str>) {
        let mut op = vec![json!("expect"), json!(key), json!(field)];
        op.extend(value.map(Value::from));
        self.ops.push(Value::Array(op));
    }
}

impl RedisTx {
    fn retire(&mut self, id: &str) {
        self.ops
            .push(json!(["retire", handle_key(id), owned_key(id), id]));
    }
}

#[async_trait]
impl Transaction for RedisTx {
    async fn live_handles(
        &mut self,
        owner: &str,
        kind: &str,
        now: Millis,
    ) -> Result<u64, StoreError> {
        // Read at once, on the shared connection: this transaction's own writes wait for
        // its commit, so its new handles are not counted.
        static LIVE: std::sync::LazyLock<Script> =
            std::sync::LazyLock::new(|| Script::new(LIVE_LUA));
        let mut conn = self.conn.clone();
        LIVE.key(owner_kind_key(owner, kind))
            .key(HANDLE_EXPIRY)
            .arg(now)
            .arg(EXPIRED_HANDLE_GRACE_MS)
            .invoke_async(&mut conn)
            .await
            .map_err(backend)
    }

    async fn least_recently_used_handles(
        &mut self,
        owner: &str,
        kind: &str,
        now: Millis,
        n: u64,
    ) -> Result<Vec<String>, StoreError> {
        // Read at once, as `live_handles` counts: the same handles are candidates.
        static OLDEST: std::sync::LazyLock<Script> =
            std::sync::LazyLock::new(|| Script::new(LEAST_RECENTLY_USED_LUA));
        let mut conn = self.conn.clone();
        OLDEST
            .key(owner_kind_key(owner, kind))
            .key(HANDLE_EXPIRY)
            .arg(now)
            .arg(EXPIRED_HANDLE_GRACE_MS)
            .arg(n)
            .invoke_async(&mut conn)
            .await
            .map_err(backend)
    }

    async fn create_handle(&mut self, r: &HandleRecord) -> Result<(), StoreError> {
        self.ops.push(json!([
            "handle",
            handle_key(&r.id),
            r.id,
            r.kind,
            r.owner,
            r.created_at,
            r.expires_at,
            r.idle_ms.map(|i| i.to_string()).unwrap_or_default(),
            r.last_used_at,
            sweep_at(r),
            r.data.as_ref().map(Value::to_string).unwrap_or_default(),
            owner_kind_key(&r.owner, &r.kind),
            // The owner's set outlives each handle it holds (within what PEXPIRE takes).
            r.expires_at
                .saturating_sub(r.created_at)
                .saturating_add(EXPIRED_HANDLE_GRACE_MS)
                .min(MAX_SET_TTL_MS)
        ]));
        Ok(())
    }

    async fn retire_handle(&mut self, id: &str) -> Result<(), StoreError> {
        self.retire(id);
        Ok(())
    }

    async fn hold_handle(
        &mut self,
        id: &str,
        touch_at: Option<Millis>,
    ) -> Result<bool, StoreError> {
        // Checked now, and again by the commit script, which applies nothing if it is gone.
        let key = handle_key(id);
        let exists: bool = self.conn.exists(&key).await.map_err(backend)?;
        if !exists {
            return Ok(false);
        }
        self.ops.push(json!(["require", key]));
        if let Some(now) = touch_at {
            self.ops
                .push(json!(["touch", key, id, now, EXPIRED_HANDLE_GRACE_MS]));
        }
        Ok(true)
    }

    fn fence(&mut self, fence: &Fence) {
        let [line, alive, _] = lock::line_keys(&fence.key);
        self.ops
            .push(json!(["fence", line, alive, fence.token.to_string()]));
    }

    async fn record_once(&mut self, claim: &Claim) -> Result<bool, StoreError> {
        // Reserved at once, not at the commit: what a redemption unlocks may be an effect
        // outside the store, which a conflict found at the commit would come too late to
        // stop, and a second call must find the record before it acts. Until the commit
        // marks it done the record is running under this transaction's token (a claim's
        // waiters wait for it); ended without a commit, it is given back; after a crash it
        // stays until its expiry: the step is asked again, never acted on twice.
        static RESERVE: std::sync::LazyLock<Script> =
            std::sync::LazyLock::new(|| Script::new(RESERVE_LUA));
        let key = claim_key(claim);
        let token = format!("{:032x}", rand::random::<u128>());
        let mut conn = self.conn.clone();
        let reserved: i64 = RESERVE
            .key(&key)
            .arg(claim.digest.as_str())
            .arg(&token)
            .arg(&claim.owner)
            .arg(claim.expires_at)
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        if reserved != 1 {
            return Ok(false);
        }
        self.reserved.push((key.clone(), token.clone()));
        // Checked again by the commit script: a reservation lost (expired) voids the commit.
        self.expect_field(&key, "token", Some(&token));
        self.ops.push(json!([
            "call", "HSET", key, "state", "done", "result", "used"
        ]));
        self.ops
            .push(json!(["call", "HDEL", key, "token", "lease_until"]));
        Ok(true)
    }

    async fn complete_claim(&mut self, claim: &Claim, result: &str) -> Result<(), StoreError> {
        match &self.claim {
            Some((key, _)) if *key == claim_key(claim) => {
                // The record is marked done by the commit script, with the writes, and
                // keeps whose write it was.
                self.ops.push(json!(["hset", key, "owner", claim.owner]));
                self.ops.push(json!(["result", result]));
                Ok(())
            }
            _ => Err(StoreError::ClaimLost),
        }
    }

    fn announce_with_commit(&mut self, events: &[wharf::ChangeEvent]) -> bool {
        self.announced.extend(
            events
                .iter()
                .map(|event| crate::bus::payload("redis", event, crate::bus::REDIS_MAX_PAYLOAD)),
        );
        true
    }

    async fn commit(mut self: Box<Self>) -> Result<(), StoreError> {
        let result = match self.ops.last() {
            Some(Value::Array(op)) if op.first() == Some(&json!("result")) => {
                let r = op
                    .get(1)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                self.ops.pop();
                Some(r)
            }
            _ => None,
        };
        if self.ops.is_empty() && self.claim.is_none() && self.announced.is_empty() {
            return Ok(());
        }
        let (claim, token) = self.claim.clone().unwrap_or_default();
        if !claim.is_empty() && result.is_none() {
            return Err(StoreError::ClaimLost);
        }
        // Published by the script that applies the writes, once every one of them applied (a
        // write refused part-way publishes nothing, and the core announces then).
        let announced = match self.announced.is_empty() {
            true => String::new(),
            false => Value::from(std::mem::take(&mut self.announced)).to_string(),
        };
        let ops = Value::Array(std::mem::take(&mut self.ops)).to_string();
        let keyed = !claim.is_empty();
        let applied: redis::Value = self
            .commit
            .key(HANDLE_EXPIRY)
            .arg(claim)
            .arg(token)
            .arg(result.unwrap_or_default())
            .arg(ops)
            .arg(&*self.channel)
            .arg(announced)
            .invoke_async(&mut self.conn)
            .await
            // A keyed commit's retry finds its claim or record, as after any lost answer.
            .map_err(|e| if keyed { backend(e) } else { write_backend(e) })?;
        match applied {
            redis::Value::Int(n @ (1 | 2)) => {
                self.claim = None;
                self.reserved.clear();
                if n == 2 {
                    // Applied, but Redis refused to publish its announcements: every stream
                    // is told it may have missed a change, as when the bus cannot publish,
                    // without holding the call (and its keys) on the telling.
                    tracing::warn!("Redis refused to publish what a commit announced");
                    let bus = std::sync::Arc::clone(&self.bus);
                    tokio::spawn(async move { bus.missed().await });
                }
                Ok(())
            }
            redis::Value::Int(-2) => Err(StoreError::HandleGone),
            redis::Value::Int(-3) => Err(StoreError::Conflict),
            redis::Value::Int(-4) => Err(StoreError::LeaseLost),
            redis::Value::Int(_) => Err(StoreError::ClaimLost),
            // Part of it applied, and the claim recorded with the failure: nothing to release.
            redis::Value::BulkString(text) => {
                self.claim = None;
                Err(StoreError::PartlyApplied(
                    String::from_utf8_lossy(&text).into_owned(),
                ))
            }
            other => Err(StoreError::Backend(format!(
                "unexpected answer of the commit script: {other:?}"
            ))),
        }
    }

    fn backend_tx(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::{Eviction, backend, eviction, keep_renewing, write_backend};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::time::Instant;
    use wharf::store::StoreError;

    /// A renewal that gets no answer (a half-open connection) or fails is tried again soon
    /// enough for the lease to hold: the renewals that succeed are never a lease apart.
    #[tokio::test(start_paused = true)]
    async fn a_lost_renewal_is_tried_again_before_the_lease_runs_out() {
        let lease = Duration::from_secs(10);
        let start = Instant::now();
        // Renewal 2 hangs; 3 fails at once; the rest succeed; 8 finds the claim gone.
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        keep_renewing(lease, move || {
            let n = {
                let mut calls = seen.lock().unwrap();
                calls.push(start.elapsed());
                calls.len()
            };
            async move {
                match n {
                    2 => std::future::pending().await,
                    3 => Err("connection reset"),
                    8 => Ok(0),
                    _ => Ok(1),
                }
            }
        })
        .await;
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 8, "{calls:?}");
        // The claim was taken at 0; calls 1 and 4 to 7 renewed it.
        let held: Vec<Duration> = [0, 3, 4, 5, 6].iter().map(|&i| calls[i]).collect();
        let mut last_renewed = Duration::ZERO;
        for at in held {
            assert!(
                at - last_renewed < lease,
                "renewed {at:?} after {last_renewed:?}: {calls:?}"
            );
            last_renewed = at;
        }
    }

    #[test]
    fn only_a_redis_that_never_evicts_keeps_writes_exactly_once() {
        assert_eq!(eviction("noeviction", 1 << 30), Eviction::None);
        assert_eq!(eviction("noeviction", 0), Eviction::None);
        // ElastiCache's and Azure's default: keys with a TTL, as every record has, go first.
        assert_eq!(eviction("volatile-lru", 1 << 30), Eviction::Now);
        assert_eq!(eviction("allkeys-lfu", 1), Eviction::Now);
        assert_eq!(eviction("volatile-ttl", 0), Eviction::OnceLimited);
    }

    #[test]
    fn a_full_redis_is_busy_and_a_lost_write_answer_is_not() {
        let full = || {
            redis::make_extension_error(
                "OOM".into(),
                Some("command not allowed when used memory > 'maxmemory'.".into()),
            )
        };
        assert!(matches!(backend(full()), StoreError::Busy(_)));
        assert!(matches!(write_backend(full()), StoreError::Busy(_)));

        let lost = || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(matches!(backend(lost()), StoreError::Busy(_)));
        match write_backend(lost()) {
            StoreError::Backend(why) => assert!(why.contains("may have been applied"), "{why}"),
            other => panic!("{other:?}"),
        }
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(
            matches!(write_backend(refused), StoreError::Busy(_)),
            "nothing was sent"
        );
    }
}
